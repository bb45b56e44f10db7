"""Redis fixtures beyond sbtest.RedisServer: nodes with passwords, persistence, unix sockets and
replication, Redis Sentinel (Debian's redis-sentinel), and a small RESP client that can hold a
subscription. Everything listens on 127.0.0.1 (free ports) and lives in a temporary directory.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import sbtest

REDIS_SERVER = shutil.which("redis-server")
REDIS_SENTINEL = shutil.which("redis-sentinel")


def _need(exe, name):
    if exe is None:
        raise unittest.SkipTest("%s is not installed" % name)


def command(port, *args, password=None, timeout=5.0):
    """One command on a fresh connection (AUTH first when a password is given)."""
    if password is None:
        return sbtest.redis_command(port, *args, timeout=timeout)
    req = b""
    for cmd in (("AUTH", password), args):
        req += b"*%d\r\n" % len(cmd)
        for a in cmd:
            a = a if isinstance(a, bytes) else str(a).encode()
            req += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(req)
        f = s.makefile("rb")
        sbtest._resp_read(f)
        return sbtest._resp_read(f)


class Node:
    """A redis-server: options as in redis.conf, one per (name, value) pair."""

    def __init__(self, port=None, password=None, replicaof=None, persist=False, unixsocket=False, extra=()):
        _need(REDIS_SERVER, "redis-server")
        self.port = port or sbtest.free_port()
        self.password = password
        self.replicaof = replicaof
        self.dir = tempfile.mkdtemp(prefix="sbredis-")
        self.socket = os.path.join(self.dir, "redis.sock") if unixsocket else None
        self.persist = persist
        self.extra = list(extra)
        self.proc = None

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    def args(self):
        a = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--daemonize", "no",
             "--save", "", "--protected-mode", "yes"]
        a += ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        if self.password:
            a += ["--requirepass", self.password, "--masterauth", self.password]
        if self.replicaof:
            a += ["--replicaof", "127.0.0.1", str(self.replicaof)]
        if self.socket:
            a += ["--unixsocket", self.socket, "--unixsocketperm", "700"]
        return a + self.extra

    def start(self, timeout=10.0):
        self.proc = subprocess.Popen(self.args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server on %d exited with %s" % (self.port, self.proc.returncode))
            if self.ping():
                return self
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("redis-server did not answer on port %d" % self.port)

    def ping(self):
        try:
            return self.cmd("PING") == "PONG"
        except (OSError, RuntimeError):
            return False

    def cmd(self, *args):
        return command(self.port, *args, password=self.password)

    def role(self):
        try:
            r = self.cmd("ROLE")
            return r[0].decode()
        except (OSError, RuntimeError):
            return None

    def kill(self):
        """SIGKILL: the node vanishes at once, as a crashed host would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Sentinel:
    """A redis-sentinel watching `master` (a Node) under `name`, on loopback, quorum 2."""

    def __init__(self, master, name="sbmaster", password=None, down_after_ms=400, failover_timeout_ms=4000):
        _need(REDIS_SENTINEL, "redis-sentinel")
        self.port = sbtest.free_port()
        self.master = master
        self.name = name
        self.password = password
        self.dir = tempfile.mkdtemp(prefix="sbsentinel-")
        self.conf = os.path.join(self.dir, "sentinel.conf")
        lines = ["port %d" % self.port, "bind 127.0.0.1", "dir %s" % self.dir, "daemonize no",
                 "sentinel monitor %s 127.0.0.1 %d 2" % (name, master.port),
                 "sentinel down-after-milliseconds %s %d" % (name, down_after_ms),
                 "sentinel failover-timeout %s %d" % (name, failover_timeout_ms),
                 "sentinel parallel-syncs %s 1" % name]
        if master.password:
            lines.append("sentinel auth-pass %s %s" % (name, master.password))
        if password:
            # the sentinels talk to each other with the same password
            lines += ["requirepass %s" % password, "sentinel sentinel-pass %s" % password]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = None

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def start(self, timeout=10.0):
        self.proc = subprocess.Popen([REDIS_SENTINEL, self.conf], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-sentinel on %d exited with %s" % (self.port, self.proc.returncode))
            try:
                if self.cmd("PING") == "PONG":
                    return self
            except (OSError, RuntimeError):
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-sentinel did not answer on port %d" % self.port)

    def cmd(self, *args):
        return command(self.port, *args, password=self.password)

    def primary(self):
        r = self.cmd("SENTINEL", "get-master-addr-by-name", self.name)
        return None if r is None else (r[0].decode(), int(r[1]))

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Subscriber:
    """Holds a SUBSCRIBE on a node or sentinel and stamps every message with time.monotonic()."""

    def __init__(self, port, channel, password=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.file = self.sock.makefile("rb")
        if password:
            self._send("AUTH", password)
            sbtest._resp_read(self.file)
        self._send("SUBSCRIBE", channel)
        sbtest._resp_read(self.file)  # the confirmation
        self.sock.settimeout(None)
        self.messages = []
        self._lock = threading.Lock()
        threading.Thread(target=self._run, daemon=True).start()

    def _send(self, *args):
        req = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            req += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(req)

    def _run(self):
        while True:
            try:
                m = sbtest._resp_read(self.file)
            except (OSError, RuntimeError, ValueError):
                return
            with self._lock:
                self.messages.append((time.monotonic(), m))

    def first(self):
        with self._lock:
            return self.messages[0] if self.messages else None

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def write_secret(directory, name, value):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(value + "\n")
    os.chmod(path, 0o600)
    return path


def metric(broker, name):
    """The value of one sample line of /metrics (the full name with labels), or None."""
    for line in broker.admin("GET", "/metrics").raw.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None

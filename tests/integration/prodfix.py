"""Fixtures for test_production.py: the production shape on loopback.

* Nginx: real nginx running deploy/nginx/sandbox-broker.conf, rewritten only for
  its ports (the same rewrite as test_nginx.py), so the file operators deploy
  is what is exercised. Its error log is kept for diagnosis.
* DurableRedis: a redis-server on a fixed loopback port with an append-only
  file fsynced on every write, so it can be stopped and started again on the
  same port with its data (a restart or a failover to a caught-up replica).
* Load: N client threads, each on its own keep-alive connection to nginx,
  cycling through a list of (label, token, method) calls and recording every
  exchange: when it was sent, when its answer arrived, status, code, message,
  or the exception that replaced the answer (a torn or missing response).

Only the standard library (and sbtest) is used.
"""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import sbtest

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NGINX_CONF = os.path.join(sbtest.SOURCE_DIR, "deploy", "nginx", "sandbox-broker.conf")


class Nginx:
    """nginx in front of the given broker ports, listening on a free loopback port."""

    def __init__(self, upstream_ports):
        self.port = sbtest.free_port()
        self.dir = tempfile.mkdtemp(prefix="sb-prod-nginx-")
        # started as root, nginx's workers run as nobody: they must be able to spool large bodies here
        os.chmod(self.dir, 0o755)
        for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
            os.mkdir(os.path.join(self.dir, sub))
            os.chmod(os.path.join(self.dir, sub), 0o777)
        with open(NGINX_CONF) as f:
            site = f.read()
        servers = "".join("    server 127.0.0.1:%d max_fails=0;\n" % p for p in upstream_ports)
        site, n = re.subn(r"(    server 127\.0\.0\.1:\d+ max_fails=0;\n)+", servers, site, count=1)
        if n != 1 or "listen 127.0.0.1:8443;" not in site:
            raise AssertionError("deploy/nginx/sandbox-broker.conf changed shape: cannot rewrite its ports")
        site = site.replace("listen 127.0.0.1:8443;", "listen 127.0.0.1:%d;" % self.port)
        self.error_log = os.path.join(self.dir, "error.log")
        with open(os.path.join(self.dir, "nginx.conf"), "w") as f:
            f.write("daemon off;\nworker_processes 1;\npid %s/nginx.pid;\nerror_log %s warn;\n"
                    "events { worker_connections 1024; }\n"
                    "http {\n  access_log off;\n  client_body_temp_path %s/body;\n"
                    "  proxy_temp_path %s/proxy;\n  fastcgi_temp_path %s/fcgi;\n  uwsgi_temp_path %s/uwsgi;\n"
                    "  scgi_temp_path %s/scgi;\n%s\n}\n"
                    % (self.dir, self.error_log, self.dir, self.dir, self.dir, self.dir, self.dir, site))
        self.proc = subprocess.Popen([NGINX, "-p", self.dir, "-c", os.path.join(self.dir, "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                sbtest.http_request(self.port, "GET", "/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.05)
        log = self.errors()
        self.stop()
        raise AssertionError("nginx did not start: %s" % log[-2000:])

    def errors(self):
        try:
            with open(self.error_log) as f:
                return f.read()
        except OSError:
            return ""

    def upstream_failures(self):
        """The error log without the connect() refusals nginx retried on the next instance."""
        return "".join(line for line in self.errors().splitlines(True) if "(111: Connection refused)" not in line)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class DurableRedis:
    """redis-server on a fixed loopback port whose data survives stop() + start()."""

    def __init__(self, port=None):
        self.port = port or sbtest.free_port()
        self.dir = tempfile.mkdtemp(prefix="sb-prod-redis-")
        self.proc = None

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    def start(self, timeout=10.0):
        exe = shutil.which("redis-server")
        if exe is None:
            import unittest
            raise unittest.SkipTest("redis-server is not installed")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                                      "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                                      "--daemonize", "no", "--protected-mode", "yes"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited with %s" % self.proc.returncode)
            if sbtest.redis_ping(self.port):
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not answer PING on port %d" % self.port)

    def stop(self):
        """SIGTERM and wait: every client connection is gone when this returns."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Exchange:
    __slots__ = ("label", "sent", "received", "status", "ctype", "code", "message", "value", "error", "raw")

    def __init__(self, label, sent):
        self.label = label
        self.sent = sent
        self.received = None
        self.status = None
        self.ctype = None
        self.code = None
        self.message = None
        self.value = None
        self.error = None  # the exception that replaced the answer
        self.raw = b""

    def __repr__(self):
        if self.error is not None:
            return "<%s: %s at +%.3f>" % (self.label, self.error, self.sent)
        return "<%s: %s %s %r at +%.3f..+%.3f>" % (self.label, self.status, self.code, self.raw[:160], self.sent,
                                                   self.received)


class Load:
    """threads keep-alive clients through `port`, each cycling over `calls` = [(label, token, method, args)]."""

    def __init__(self, port, calls, threads=16, timeout=15.0):
        self.port = port
        self.calls = calls
        self.nthreads = threads
        self.timeout = timeout
        self.t0 = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.exchanges = []
        self.connections = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def now(self):
        return time.monotonic() - self.t0

    def start(self):
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def stop(self, timeout=20.0):
        """Stops sending; returns False when a client is still waiting for an answer after `timeout`."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    def _run(self, idx):
        conn = None
        n = idx
        mine = []
        while not self.stopping.is_set():
            label, token, method, args = self.calls[n % len(self.calls)]
            n += 1
            body = json.dumps({"method": method, "args": args if args is not None else {"i": n}}).encode()
            ex = Exchange(label, self.now())
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                    with self.lock:
                        self.connections += 1
                conn.request("POST", sbtest.RPC_PATH, body=body,
                             headers={"Content-Type": "application/json", sbtest.TOKEN_HEADER: token})
                r = conn.getresponse()
                ex.raw = r.read()
                ex.received = self.now()
                ex.status = r.status
                ex.ctype = r.getheader("content-type")
                will_close = r.will_close
            except Exception as e:  # a torn, missing or refused answer: never acceptable through nginx
                ex.error = "%s: %s" % (type(e).__name__, e)
                ex.received = self.now()
                mine.append(ex)
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.01)
                continue
            try:
                obj = json.loads(ex.raw)
                if obj.get("ok") is False:
                    ex.code = obj["error"]["code"]
                    ex.message = obj["error"]["message"]
                elif obj.get("ok") is True:
                    ex.value = obj.get("value")
            except Exception:
                pass  # not a broker answer (nginx's own error page): code stays None
            mine.append(ex)
            if will_close:
                conn.close()
                conn = None
        if conn is not None:
            conn.close()
        with self.lock:
            self.exchanges.extend(mine)

    def all(self):
        return sorted(self.exchanges, key=lambda e: e.sent)


def summary(exchanges):
    """{(label, status, code): count} and the exceptions, for messages."""
    out = {}
    for e in exchanges:
        k = (e.label, e.status, e.code if e.error is None else e.error.split(":")[0])
        out[k] = out.get(k, 0) + 1
    return out

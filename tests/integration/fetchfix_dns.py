"""Fake DNS for the http.fetch tests: dnsmasq as a child process on a loopback port.

dnsmasq answers authoritatively for *.test (--local=/test/), so an unknown name is NXDOMAIN and a
name with records of one family only is NODATA for the other. Records come from fixed
--host-record flags and from an addn-hosts file that a test can rewrite and reload (SIGHUP) to
rebind a name between two hops. Every query is logged (--log-queries) to a file the tests read, to
count the A and AAAA queries the broker sends.

Only the standard library is used; dnsmasq must be installed (apt-get install -y dnsmasq).
"""

import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

from ports import free_port

QTYPE_A = 1
QTYPE_AAAA = 28
QTYPES = {"A": QTYPE_A, "AAAA": QTYPE_AAAA}

_QUERY_RE = re.compile(r"dnsmasq\[\d+\]: query\[(\w+)\] (\S+) from (\S+)")

# our own probes come from here, so the query log can tell them from the broker's (which come from 127.0.0.1)
PROBE_SOURCE = "127.0.0.9"


def free_dns_port():
    """A port dnsmasq can take on 127.0.0.1 for both UDP and TCP (ports.py says why below the ephemeral range)."""
    return free_port(udp_too=True)


def _encode_name(name):
    out = b""
    for label in name.rstrip(".").split("."):
        raw = label.encode("ascii")
        out += bytes([len(raw)]) + raw
    return out + b"\0"


def _skip_name(msg, off):
    while True:
        n = msg[off]
        if n == 0:
            return off + 1
        if n & 0xC0 == 0xC0:
            return off + 2
        off += 1 + n


def dns_query(port, name, qtype, timeout=2.0, source=PROBE_SOURCE):
    """One UDP query to 127.0.0.1:port from `source`. Returns (rcode, [address text, ...]) for A/AAAA answers."""
    qid = random.randrange(0, 65536)
    pkt = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + _encode_name(name) + struct.pack(">HH", qtype, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.bind((source, 0))
        s.sendto(pkt, ("127.0.0.1", port))
        while True:
            msg, _ = s.recvfrom(4096)
            if len(msg) >= 12 and struct.unpack(">H", msg[:2])[0] == qid:
                break
    flags, qd, an = struct.unpack(">HHH", msg[2:8])
    rcode = flags & 0xF
    off = 12
    for _ in range(qd):
        off = _skip_name(msg, off) + 4
    addrs = []
    for _ in range(an):
        off = _skip_name(msg, off)
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", msg[off:off + 10])
        off += 10
        rdata = msg[off:off + rdlen]
        off += rdlen
        if rtype == QTYPE_A and rdlen == 4:
            addrs.append(socket.inet_ntop(socket.AF_INET, rdata))
        elif rtype == QTYPE_AAAA and rdlen == 16:
            addrs.append(socket.inet_ntop(socket.AF_INET6, rdata))
    return rcode, addrs


class Dnsmasq:
    """dnsmasq on 127.0.0.1:<free port>, TTL 0, with fixed records and a reloadable hosts file.

    host_records: list of "name,ip[,ip6]" strings (--host-record; repeat a name for more records).
    hosts: dict name -> list of addresses, written to the addn-hosts file.
    extra_args: more dnsmasq flags, e.g. "--server=/fake.test/127.0.0.1#PORT" to forward to a FakeDns.
    """

    def __init__(self, host_records=(), hosts=None, extra_args=()):
        self.host_records = list(host_records)
        self.extra_args = list(extra_args)
        self.hosts = dict(hosts or {})
        self.port = None
        self.proc = None
        self.dir = None

    @property
    def server(self):
        return "127.0.0.1:%d" % self.port

    def _write_hosts(self, hosts):
        tmp = self.hosts_path + ".tmp"
        with open(tmp, "w") as f:
            for name, addrs in sorted(hosts.items()):
                for a in addrs:
                    f.write("%s %s\n" % (a, name))
        os.replace(tmp, self.hosts_path)

    def start(self, timeout=10.0):
        exe = shutil.which("dnsmasq") or ("/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq") else None)
        if exe is None:
            raise unittest.SkipTest("dnsmasq is not installed (apt-get install -y dnsmasq)")
        self.dir = tempfile.mkdtemp(prefix="sbdns-")
        self.hosts_path = os.path.join(self.dir, "hosts")
        self.log_path = os.path.join(self.dir, "dnsmasq.log")
        self.pid_path = os.path.join(self.dir, "dnsmasq.pid")
        self._write_hosts(self.hosts)
        for attempt in range(10):
            self.port = free_dns_port()
            args = [exe, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
                    "--listen-address=127.0.0.1", "--bind-interfaces", "--port=%d" % self.port, "--local=/test/",
                    "--local-ttl=0", "--user=root", "--pid-file=" + self.pid_path, "--addn-hosts=" + self.hosts_path,
                    "--log-queries", "--log-facility=" + self.log_path]
            args += ["--host-record=" + r for r in self.host_records] + self.extra_args
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    rcode, _ = dns_query(self.port, "probe-nx.test", QTYPE_A, timeout=0.2)
                    if rcode == 3:
                        return self
                except OSError:
                    pass
                time.sleep(0.05)
            err = b""
            if self.proc.poll() is not None:
                err = self.proc.stderr.read()
            self.stop(keep_dir=True)
            if b"in use" not in err:
                raise RuntimeError("dnsmasq did not start: %s" % err.decode("utf-8", "replace"))
        raise RuntimeError("dnsmasq could not bind a free port: %s" % err.decode("utf-8", "replace"))

    def stop(self, keep_dir=False):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None
        if not keep_dir and self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    # --- the query log ---

    def log(self):
        try:
            with open(self.log_path, "r", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def log_lines(self):
        return self.log().splitlines()

    def mark(self):
        """A position in the log; queries(name, since=mark) counts only what came after."""
        return len(self.log_lines())

    def queries(self, name=None, since=0):
        """[(qtype, name), ...] of the broker's queries (not our probes) logged after line `since`,
        optionally for one name."""
        out = []
        for line in self.log_lines()[since:]:
            m = _QUERY_RE.search(line)
            if m and m.group(3) != PROBE_SOURCE and (name is None or m.group(2).lower() == name.lower()):
                out.append((m.group(1), m.group(2).lower()))
        return out

    def settled_queries(self, name, since, expect_at_least, timeout=3.0, settle=0.3):
        """Waits until at least `expect_at_least` queries for name were logged, then a little longer so
        that extra queries would show up too; returns the list."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.queries(name, since)) < expect_at_least:
            time.sleep(0.02)
        time.sleep(settle)
        return self.queries(name, since)

    # --- rebinding ---

    def rebind(self, hosts, timeout=5.0):
        """Rewrites the addn-hosts file, SIGHUPs dnsmasq and waits until it has re-read the file and
        answers with the new addresses (checked with our own UDP query)."""
        reads_before = self.log().count("read %s" % self.hosts_path)
        self._write_hosts(hosts)
        self.hosts = dict(hosts)
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log().count("read %s" % self.hosts_path) > reads_before:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("dnsmasq did not re-read %s" % self.hosts_path)
        for name, addrs in hosts.items():
            v4 = sorted(a for a in addrs if ":" not in a)
            while True:
                _, got = dns_query(self.port, name, QTYPE_A)
                if sorted(got) == v4:
                    break
                if time.monotonic() >= deadline:
                    raise AssertionError("dnsmasq still answers %r for %s after reload" % (got, name))
                time.sleep(0.01)


class FakeDns:
    """A tiny authoritative UDP DNS server on 127.0.0.1:<free port>, for answers dnsmasq will not make
    by itself (one family failing). dnsmasq forwards a subdomain to it (--server=/sub.test/127.0.0.1#port).

    table: {(name, "A" | "AAAA"): ("rcode", name) | ("addrs", [address text, ...]) | ("drop", None)};
    anything else is NXDOMAIN; "drop" never answers. Every query is counted in .queries as (qtype name, name),
    and where it came from in .sources as (source port, query id).
    """

    RCODES = {"SERVFAIL": 2, "NXDOMAIN": 3, "REFUSED": 5}

    def __init__(self, table):
        self.table = dict(table)
        self.queries = []
        self.sources = []
        self.sock = None
        self.thread = None
        self._stop = False

    def start(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        import threading
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self._stop = True
        if self.thread is not None:
            self.thread.join(5)
        if self.sock is not None:
            self.sock.close()

    def _run(self):
        while not self._stop:
            try:
                msg, peer = self.sock.recvfrom(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            if len(msg) >= 2:
                self.sources.append((peer[1], struct.unpack(">H", msg[:2])[0]))
            try:
                answer = self._answer(msg)
                if answer is not None:
                    self.sock.sendto(answer, peer)
            except Exception:  # a malformed query: no answer
                pass

    def _answer(self, msg):
        qid, flags, qd = struct.unpack(">HHH", msg[:6])
        end = _skip_name(msg, 12)
        labels, off = [], 12
        while msg[off] != 0:
            labels.append(msg[off + 1:off + 1 + msg[off]].decode("ascii").lower())
            off += 1 + msg[off]
        name = ".".join(labels)
        qtype = struct.unpack(">H", msg[end:end + 2])[0]
        question = msg[12:end + 4]
        tname = {QTYPE_A: "A", QTYPE_AAAA: "AAAA"}.get(qtype, str(qtype))
        self.queries.append((tname, name))
        kind, val = self.table.get((name, tname), ("rcode", "NXDOMAIN"))
        if kind == "drop":
            return None
        rd = flags & 0x0100
        answers = b""
        rcode = 0
        count = 0
        if kind == "rcode":
            rcode = self.RCODES[val]
        else:
            for a in val:
                fam, t = (socket.AF_INET6, QTYPE_AAAA) if ":" in a else (socket.AF_INET, QTYPE_A)
                rdata = socket.inet_pton(fam, a)
                answers += struct.pack(">HHHIH", 0xC00C, t, 1, 0, len(rdata)) + rdata
                count += 1
        hdr = struct.pack(">HHHHHH", qid, 0x8400 | rd | 0x0080 | rcode, 1, count, 0, 0)
        return hdr + question + answers

"""sandbox-shim serve: the upstream supervisor's /run API, with real Deno guests.

The brokers here are scripted fakes (they count and hold calls, answer 307, ...);
test_serve_adapter.py drives serve against the real broker and PostgreSQL.
Needs Deno (SB_DENO, or SB_NODE_PREFIX/node_modules/.bin/deno); SKIP (77) without it.
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402 - keep tests/shim free of __pycache__
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack

from common import SHIM, SOURCE_DIR, RealBroker, Tap, check, closed_port, find_deno, free_port, needs_root

DENO = find_deno()
if DENO is None:
    print("1..0 # SKIP deno not found: set SB_DENO, or SB_NODE_PREFIX after "
          "`npm install --prefix \"$SB_NODE_PREFIX\" deno@2.9.6`", flush=True)
    sys.exit(77)

SECRET = "questpie-sandbox-host-service-key-32-bytes-minimum"
ADMISSION = "x-questpie-sandbox-host-admission"
DENIED = {"ok": False, "error": "The workload is not authorized for this sandbox operation.", "logs": []}
INVALID = {"ok": False, "error": "invalid sandbox request", "logs": []}
CAPS = {"net": [], "import": [], "timeoutMs": 5000, "memoryMb": 128}
TOKEN = "opaque-test-token"
PROBE = os.environ.get("SB_JAIL_PROBE") or os.path.join(os.path.dirname(SHIM), "..", "tests", "jail_probe")
UID_BASE = 1879048192  # the jail's default --jail-uid-base (jail.h)
TMP = tempfile.mkdtemp(prefix="sb-serve-test-")
os.chmod(TMP, 0o711)  # jailed guests run as other uids and must reach their homes below it

tap = Tap()


# ---- a scripted broker: counts calls, holds them, answers 307 ----

class Broker:
    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []
        self.mode = "ok"
        self.hold = 0.0
        self.first_call = threading.Event()
        self.current = self.max_current = 0
        b = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = msgpack.unpackb(self.rfile.read(int(self.headers.get("Content-Length", "0"))), raw=False)
                with b.lock:
                    b.calls.append({"path": self.path, "token": self.headers.get("x-questpie-sandbox-token"),
                                    "body": body, "module": self.headers.get("x-sandbox-module-fetch")})
                    b.current += 1
                    b.max_current = max(b.max_current, b.current)
                b.first_call.set()
                try:
                    if b.hold:
                        time.sleep(b.hold)
                    if b.mode == "redirect":
                        self.send_response(307)
                        self.send_header("Location", sink.url + "/stolen")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    value = body.get("args", [])
                    if body.get("method") == "import.fetch":
                        # the module path (PROTOCOL.md section 6c): every module is this one
                        value = {"url": value["url"], "status": 200, "contentType": "application/javascript",
                                 "body": b"export const m = 7;\n"}
                    out = msgpack.packb({"ok": True, "value": value}, use_bin_type=True)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/msgpack")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with b.lock:
                        b.current -= 1

        class S(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512

        self.server = S(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d/sandbox/rpc?channel=canonical" % self.port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self, mode="ok", hold=0.0):
        with self.lock:
            self.calls = []
            self.mode = mode
            self.hold = hold
            self.max_current = 0
        self.first_call.clear()

    def count(self):
        with self.lock:
            return len(self.calls)


class Sink:
    """Where a redirect points: it must never see a request."""

    def __init__(self):
        self.requests = []
        s = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                s.requests.append(dict(self.headers))
                self.send_response(200)
                self.end_headers()

            do_GET = do_POST

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


# ---- serve itself ----

class Serve:
    def __init__(self, env=None, args=(), secret=SECRET, wait=True, wrap=(), argv=None):
        e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_") and k not in ("PORT", "DENO_BIN")}
        if secret is not None:
            e["SANDBOX_HOST_ADMISSION_SECRET"] = secret
        e.update(env or {})
        argv = argv or [SHIM, "serve", "--listen", "127.0.0.1:0", "--deno", DENO] + list(args)
        self.proc = subprocess.Popen(list(wrap) + argv, env=e, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self.lines = []
        self.lock = threading.Lock()
        self.port = None
        self.posted = 0  # POST /run requests sent: each gets exactly one "run" log line
        got = threading.Event()

        def read():
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                with self.lock:
                    self.lines.append(line)
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "listening":
                    self.port = ev["port"]
                    got.set()
            got.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if wait:
            got.wait(30)
            if self.port is None:
                self.stop()
                raise RuntimeError("serve did not start:\n" + self.log())

    def log(self):
        time.sleep(0.05)
        with self.lock:
            return "".join(self.lines)

    def events(self, name="run"):
        """The log's events of that name; for "run", once every POST /run sent so far has its line."""
        deadline = time.monotonic() + 10
        while True:
            out = []
            for line in self.log().splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == name:
                    out.append(ev)
            # refusals before admission past the log budget are summarised, not logged one by one
            if name != "run" or len(out) + self.suppressed() >= self.posted or time.monotonic() > deadline:
                return out

    def suppressed(self):
        n = 0
        for line in self.log().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "refusals.suppressed":
                n += ev["suppressed"]
        return n

    def request(self, method, path, body=None, headers=None, timeout=60):
        if method == "POST" and path == "/run":
            self.posted += 1
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            raw = r.read()
            return r.status, raw, dict((k.lower(), v) for k, v in r.getheaders())
        finally:
            c.close()

    def run_raw(self, body, admission=SECRET, timeout=60):
        h = {"content-type": "application/json"}
        if admission is not None:
            h[ADMISSION] = admission
        if isinstance(body, str):
            body = body.encode()
        st, raw, hdrs = self.request("POST", "/run", body, h, timeout)
        return st, json.loads(raw) if raw else None

    def run(self, fields, timeout=60):
        body = {"mode": "host", "capabilities": dict(CAPS)}
        body.update(fields)
        return self.run_raw(json.dumps(body), timeout=timeout)

    def metrics(self):
        st, raw, _ = self.request("GET", "/metrics", headers={ADMISSION: SECRET})
        check(st == 200, "metrics", st, raw)
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


broker = Broker()
sink = Sink()
S = Serve({"SANDBOX_BROKER_URL": broker.url}, ["--max-runs", "8"])


def deno_version():
    out = subprocess.run([DENO, "--version"], capture_output=True, text=True).stdout
    return out.split()[1]


def ok_run(fields, **kw):
    st, o = S.run(fields, **kw)
    check(st == 200, "HTTP 200", st, o)
    return o


def bindings(url=None, token=TOKEN):
    return {"url": url or broker.url, "token": token}


# ---- the HTTP surface ----

def t_health():
    st, raw, h = S.request("GET", "/health")
    check(st == 200 and json.loads(raw) == {"ok": True, "runtime": "deno", "version": deno_version()}, "health", raw)
    check(h.get("content-type") == "application/json", "json", h)


def t_not_found_and_methods():
    before = len(S.events())
    for method, path in (("GET", "/nope"), ("GET", "/run"), ("PUT", "/run"), ("POST", "/health"), ("HEAD", "/health"),
                         ("POST", "/run/x"), ("POST", "/Run"), ("DELETE", "/metrics")):
        st, raw, _ = S.request(method, path, b"{}" if method in ("POST", "PUT") else None,
                               {ADMISSION: SECRET})
        check(st == 404, "404 for %s %s" % (method, path), st, raw)
        if method != "HEAD":
            check(raw == b'{"ok":false,"error":"not found"}', "404 body: upstream's, byte for byte", raw)
    check(len(S.events()) == before, "no run was logged", S.events()[before:])


def t_bad_json():
    for body in (b"{ this is : not json ]", b"", b'{"mode":"host"', b'{"mode":"host","mode":"host"}',
                 b'{"mode":"h\xffst"}', b"\xef\xbb\xbf{}", b"[1,]"):
        st, o = S.run_raw(body)
        check(st == 400 and o == {"ok": False, "error": "invalid JSON body", "logs": []}, "invalid JSON body", body, st, o)


def t_admission():
    good = json.dumps({"mode": "host", "source": "export default () => 1", "capabilities": CAPS})
    for adm in (None, "", SECRET[:-1], SECRET + "x", SECRET.upper(), "x" * len(SECRET)):
        st, o = S.run_raw(good, admission=adm)
        check(st == 403 and o == DENIED, "403 for admission %r" % adm, st, o)
    # two admission headers are ambiguous
    raw = ("POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s: %s\r\n%s: %s\r\n"
           "Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (ADMISSION, SECRET, ADMISSION, SECRET, len(good), good))
    s = socket.create_connection(("127.0.0.1", S.port))
    S.posted += 1
    s.sendall(raw.encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    check(data.startswith(b"HTTP/1.1 403"), "two admission headers refused", data)
    st, o = S.run_raw(good)
    check(st == 200 and o["ok"] and o["output"] == 1, "the right secret runs", st, o)


def t_mode():
    base = {"source": "export default () => 1", "input": None, "capabilities": CAPS}
    for body in (dict(base), dict(base, mode="workload"), dict(base, mode="unknown"), dict(base, mode="HOST"),
                 dict(base, mode=None), [base], "host", None, 1):
        st, o = S.run_raw(json.dumps(body))
        check(st == 403 and o == DENIED, "403 for mode of %r" % (body,), st, o)


def t_schema():
    deep = None
    for _ in range(40):
        deep = {"nested": deep}
    src = "export default () => 1"
    bad = [
        {"source": src, "capabilities": CAPS, "unexpected": True},
        {"capabilities": CAPS},
        {"source": "", "capabilities": CAPS},
        {"source": 1, "capabilities": CAPS},
        {"source": src},
        {"source": src, "capabilities": None},
        {"source": src, "capabilities": []},
        {"source": src, "capabilities": dict(CAPS, timeoutMs="5000")},
        {"source": src, "capabilities": dict(CAPS, timeoutMs=0)},
        {"source": src, "capabilities": dict(CAPS, timeoutMs=30001)},
        {"source": src, "capabilities": dict(CAPS, timeoutMs=1.5)},
        {"source": src, "capabilities": dict(CAPS, memoryMb=15)},
        {"source": src, "capabilities": dict(CAPS, memoryMb=1025)},
        {"source": src, "capabilities": dict(CAPS, memoryMb=True)},
        {"source": src, "capabilities": dict(CAPS, extra=1)},
        {"source": src, "capabilities": dict(CAPS, net="api.example.com")},
        {"source": src, "capabilities": dict(CAPS, net=["*.example.com"])},
        {"source": src, "capabilities": dict(CAPS, net=["example.com/x"])},
        {"source": src, "capabilities": dict(CAPS, net=["exa mple.com"])},
        {"source": src, "capabilities": dict(CAPS, net=["example.com\u00a0"])},
        {"source": src, "capabilities": dict(CAPS, net=[""])},
        {"source": src, "capabilities": dict(CAPS, net=["a" * 254])},
        {"source": src, "capabilities": dict(CAPS, net=[1])},
        {"source": src, "capabilities": dict(CAPS, net=["h%d.example" % i for i in range(33)])},
        {"source": src, "capabilities": dict(CAPS, net=["n%d.example" % i for i in range(16)],
                                             **{"import": ["i%d.example" % i for i in range(17)]})},
        {"source": src, "capabilities": CAPS, "input": deep},
        {"source": src, "capabilities": CAPS, "input": list(range(10001))},
        {"source": src, "capabilities": CAPS, "input": "x" * (1024 * 1024 + 1)},
        {"source": src, "capabilities": CAPS, "secrets": {"bad name": "v"}},
        {"source": src, "capabilities": CAPS, "secrets": {"": "v"}},
        {"source": src, "capabilities": CAPS, "secrets": {"K": 1}},
        {"source": src, "capabilities": CAPS, "secrets": {"K": "x" * 65537}},
        {"source": src, "capabilities": CAPS, "secrets": {"K%d" % i: "v" for i in range(65)}},
        {"source": src, "capabilities": CAPS, "secrets": {"K%d" % i: "x" * 60000 for i in range(5)}},
        {"source": src, "capabilities": CAPS, "secrets": []},
        {"source": src, "capabilities": CAPS, "bindings": None},
        {"source": src, "capabilities": CAPS, "bindings": {"url": broker.url}},
        {"source": src, "capabilities": CAPS, "bindings": {"url": broker.url, "token": TOKEN, "x": 1}},
        {"source": src, "capabilities": CAPS, "bindings": {"url": broker.url, "token": ""}},
        {"source": src, "capabilities": CAPS, "bindings": {"url": broker.url, "token": "t" * 8193}},
        {"source": src, "capabilities": CAPS, "bindings": {"url": "http://x/" + "a" * 2048, "token": TOKEN}},
    ]
    broker.reset()
    for body in bad:
        st, o = S.run(body) if "capabilities" in body else S.run_raw(json.dumps(dict(body, mode="host")))
        check(st == 400 and o == INVALID, "400 for %.200r" % (body,), st, o)
    check(broker.count() == 0, "nothing reached the broker")


def t_schema_accepts():
    """The edges that are valid: 32 levels of input, 32 hosts in all, an integral float, null secrets."""
    deep = 7
    for _ in range(32):
        deep = [deep]
    o = ok_run({"source": "export default (i) => { let d = 0; while (Array.isArray(i)) { i = i[0]; d++; } return [d, i]; }",
                "input": deep, "capabilities": {"timeoutMs": 5000.0, "memoryMb": 64}, "secrets": None})
    check(o["ok"] and o["output"] == [32, 7], "32 levels reach the guest", o)
    o = ok_run({"source": "export default (i) => i", "input": {"big": 9007199254740993, "f": 1.5, "n": -0.0,
                                                              "u": "\u00e9\u0000x"}})
    check(o["ok"] and o["output"] == {"big": 9007199254740992.0, "f": 1.5, "n": 0, "u": "\u00e9\u0000x"},
          "numbers as JSON.parse has them", o)
    # input is optional (null), as are the capabilities' keys (upstream's defaults)
    st, o = S.run_raw(json.dumps({"mode": "host", "source": "export default (i) => [i, 1]", "capabilities": {}}))
    check(st == 200 and o["ok"] and o["output"] == [None, 1], "defaults", o)


def t_body_cap():
    pad = "x" * (2 * 1024 * 1024 - 2)
    st, o = S.run_raw('"%s"' % pad)  # exactly 2 MiB: not too large, just not host mode
    check(st == 403, "exactly 2 MiB is read", st, o)
    # above it: answered from the head while the body comes; the client sends a part of it (what serve
    # reads and drops while its answer leaves) and then reads, as a client that sent it all could not be
    # sure to (serve closes after that part, and a reset can take the answer with it)
    for length, what in ((2 * 1024 * 1024 + 1, "413 body"), (2 * 1024 * 1024 + 300000, "413 further up")):
        st, o = post_head_and_part(length)
        check(st == 413 and o == {"ok": False, "error": "request body too large", "logs": []}, what, st, o)


def post_head_and_part(length, part=65536):
    """POST /run announcing `length` bytes, of which `part` are sent; the status and JSON answer"""
    s = socket.create_connection(("127.0.0.1", S.port), timeout=30)
    S.posted += 1
    try:
        s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s: %s\r\nContent-Length: %d\r\n\r\n"
                   % (ADMISSION, SECRET, length)).encode() + b'"' + b"x" * (part - 1))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.I)
            if sep and m and len(body) >= int(m.group(1)):
                break
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def t_answer_cap():
    # 1 MiB of control characters is 6 MiB as JSON text: above what the adapter reads, so it is replaced whole
    st, raw, h = S.request("POST", "/run", json.dumps({"mode": "host", "capabilities": CAPS, "source":
                           "export default () => '\\u0001'.repeat(1000000)"}).encode(), {ADMISSION: SECRET})
    o = json.loads(raw)
    check(st == 200 and o["ok"] is False and o["error"] == "sandbox output limit exceeded" and o["logs"] == [],
          "answer replaced", o)
    check(int(h["content-length"]) <= 2 * 1024 * 1024, "answer within 2 MiB", h)


# ---- runs ----

def t_legacy_compute_run():
    o = ok_run({"source": "export default async (input) => { console.log('hi', { a: 1 }); return { doubled: input.n * 2 }; }",
                "input": {"n": 21}, "capabilities": dict(CAPS, timeoutMs=8000)})
    check(o["ok"] is True and o["output"] == {"doubled": 42} and "log: hi {\"a\":1}" in o["logs"], "legacy run", o)
    check(set(o) == {"ok", "output", "logs", "ms"} and isinstance(o["ms"], int), "upstream's answer shape", o)
    o = ok_run({"source": "export default () => ({ q: typeof questpie, s: JSON.stringify(__secrets) })"})
    check(o["output"] == {"q": "undefined", "s": "{}"}, "no questpie without bindings; __secrets always there", o)
    o = ok_run({"source": "export default async () => { try { await fetch('http://127.0.0.1:9/'); return 'fetched'; }"
                          " catch (e) { return e.name; } }"})
    check(o["ok"] and o["output"] in ("NotCapable", "PermissionDenied", "TypeError"), "no network without net", o)
    o = ok_run({"source": "export default () => { throw new Error('guest broke'); }"})
    check(o == {"ok": False, "error": "guest broke", "logs": [], "ms": o["ms"]}, "guest error", o)
    o = ok_run({"source": "export const x = 1;"})
    check(not o["ok"] and "default" in o["error"], "no default export", o)
    # a raw call frame in a run without bindings ends it
    o = ok_run({"source": FRAME_WRITER + "export default async () => { await writeCall(); await new Promise(r => setTimeout(r, 2000)); }"})
    check(not o["ok"] and o["error"] == "binding call refused: this run has no bindings", "no broker at all", o)


FRAME_WRITER = """
function writeCall() {
  // {t:"call", id:1, method:"email.send"} as msgpack, straight onto stdout
  const m = new Uint8Array([0x83, 0xa1, 0x74, 0xa4, 0x63, 0x61, 0x6c, 0x6c, 0xa2, 0x69, 0x64, 0x01, 0xa6, 0x6d, 0x65, 0x74,
    0x68, 0x6f, 0x64, 0xaa, 0x65, 0x6d, 0x61, 0x69, 0x6c, 0x2e, 0x73, 0x65, 0x6e, 0x64]);
  const b = new Uint8Array(4 + m.length); new DataView(b.buffer).setUint32(0, m.length); b.set(m, 4);
  return Deno.stdout.write(b);
}
"""


def t_timeout():
    o = ok_run({"source": "export default async () => { while (true) {} }", "input": None,
                "capabilities": dict(CAPS, timeoutMs=300)})
    check(o["ok"] is False and o.get("timedOut") is True and o["error"] == "wall-time exceeded (300ms)", "timed out", o)
    check(o["ms"] < 3000, "killed promptly", o)


def t_memory_bomb():
    o = ok_run({"source": "export default async () => { const a = []; while (true) { a.push(new Array(1e6).fill(1)); } }",
                "capabilities": dict(CAPS, timeoutMs=20000, memoryMb=32)})
    check(o["ok"] is False and not o.get("timedOut"), "the bomb fails its run", o)
    st, raw, _ = S.request("GET", "/health")
    check(st == 200 and json.loads(raw)["ok"] is True, "the service is healthy", raw)
    check(ok_run({"source": "export default () => 'after'"})["output"] == "after", "and runs again")
    # ArrayBuffer backing stores are outside the V8 heap cap: the jail's RLIMIT_DATA stops them
    o = ok_run({"source": "export default async () => { const a = []; while (true) { a.push(new Uint8Array(64 << 20).fill(1)); } }",
                "capabilities": dict(CAPS, timeoutMs=20000, memoryMb=32)})
    check(o["ok"] is False and not o.get("timedOut"), "the ArrayBuffer bomb fails its run, before its deadline", o)
    st, raw, _ = S.request("GET", "/health")
    check(st == 200 and json.loads(raw)["ok"] is True, "the service is healthy", raw)
    check(ok_run({"source": "export default () => 'after'"})["output"] == "after", "and runs again")


def t_floods():
    o = ok_run({"source": "export default async () => { await Deno.stdout.write(new TextEncoder().encode('garbage\\n'.repeat(100000)));"
                          " return 'unexpected'; }", "capabilities": dict(CAPS, timeoutMs=8000)})
    check(not o["ok"] and "guest protocol violation" in o["error"], "stdout flood", o)
    o = ok_run({"source": "export default async () => { await Deno.stderr.write(new Uint8Array(300 * 1024)); return 'unexpected'; }",
                "capabilities": dict(CAPS, timeoutMs=8000)})
    check(o["ok"] is False and o["error"] == "sandbox output limit exceeded", "stderr flood", o)
    o = ok_run({"source": "export default () => { for (let i = 0; i < 100000; i++) console.log('line', i, 'x'.repeat(3000)); return 1; }",
                "capabilities": dict(CAPS, timeoutMs=20000)})
    logs = o["logs"]
    check(o["ok"] and len(logs) <= 1000 and sum(len(x.encode()) for x in logs) <= 1024 * 1024, "log flood bounded", len(logs))
    check("log entries dropped" in logs[-1], "says so", logs[-1])
    o = ok_run({"source": "export default async () => 'x'.repeat(14245208 + 1024)", "capabilities": dict(CAPS, timeoutMs=8000)})
    check(o["ok"] is False, "output bomb fails", {k: v for k, v in o.items() if k != "output"})
    st, raw, _ = S.request("GET", "/health")
    check(st == 200, "healthy after the floods", raw)


# ---- bindings ----

def t_bindings_call():
    broker.reset()
    o = ok_run({"source": "export default async () => await questpie.collections.posts.find({ where: { a: 1 } })",
                "bindings": bindings()})
    check(o["ok"] and o["output"] == {"where": {"a": 1}}, "relayed", o)
    check(broker.count() == 1, "one call", broker.calls)
    c = broker.calls[0]
    check(c["path"] == "/sandbox/rpc?channel=canonical" and c["token"] == TOKEN, "normalised URL, token header", c)
    check(c["body"] == {"method": "collections.posts.find", "args": {"where": {"a": 1}}}, "body", c)
    # spellings of the same URL: scheme and host case, default port... and one trailing slash
    broker.reset()
    u = broker.url.replace("http://127.0.0.1", "HTTP://127.0.0.1").replace("/sandbox/rpc?", "/sandbox/rpc/?")
    o = ok_run({"source": "export default () => questpie.collections.posts.find({})", "bindings": bindings(u)})
    check(o["ok"] and broker.calls[0]["path"] == "/sandbox/rpc?channel=canonical", "equal after normalisation", o,
          broker.calls)


def t_bindings_rejected():
    broker.reset()
    src = "export default async () => globalThis.questpie.collections.posts.find({})"
    wrong = [
        (broker.url.replace("channel=canonical", "channel=other"), "bindings.url does not match the configured broker URL"),
        (broker.url.replace("?channel=canonical", ""), "bindings.url does not match the configured broker URL"),
        (broker.url.replace("/sandbox/rpc", "/sandbox/rpc2"), "bindings.url does not match the configured broker URL"),
        (broker.url.replace("/sandbox/rpc", "/sandbox//rpc"), "bindings.url does not match the configured broker URL"),
        (broker.url.replace("127.0.0.1:%d" % broker.port, "127.0.0.1:%d" % closed_port()),
         "bindings.url does not match the configured broker URL"),
        (broker.url.replace("http:", "https:"), "bindings.url does not match the configured broker URL"),
        (broker.url + "#fragment", "bindings.url is not a valid URL: " + broker.url + "#fragment"),
        (broker.url.replace("http://", "http://user:pw@"), "bindings.url is not a valid URL: " +
         broker.url.replace("http://", "http://user:pw@")),
        ("ftp://127.0.0.1/x", "bindings.url is not a valid URL: ftp://127.0.0.1/x"),
    ]
    for url, reason in wrong:
        o = ok_run({"source": src, "bindings": bindings(url)})
        check(o == {"ok": False, "error": "bindings rejected: " + reason, "logs": [], "ms": o.get("ms")}, "rejected " + url, o)
    o = ok_run({"source": src, "bindings": bindings(token="has space")})
    check(o["error"] == "bindings rejected: bindings.token cannot be sent in an HTTP header", "header-unsafe token", o)
    check(broker.count() == 0, "nothing reached the broker", broker.calls)
    check(all(ev["outcome"] == "rejected" for ev in S.events()[-len(wrong) - 1:]), "logged as rejected")
    # no configured broker URL: every bindings run is refused
    s2 = Serve()
    try:
        st, o = s2.run({"source": src, "bindings": bindings()})
        check(st == 200 and o["error"] == "bindings rejected: sandbox broker URL is not configured", "unconfigured", o)
    finally:
        s2.stop()


def t_egress_blocked():
    o = ok_run({"source": "export default () => 1", "capabilities": dict(CAPS, **{"import": ["esm.sh"]})})
    check(o["error"] == "egress blocked: remote module imports for runs without bindings need the broker's net-mint "
                        "credential, which this supervisor does not have", "import without the credential", o)
    o = ok_run({"source": "export default () => 1", "capabilities": dict(CAPS, **{"import": ["esm.sh:99999"]})})
    check(o["error"] == "egress blocked: capabilities.import entry \"esm.sh:99999\": an import entry must be a host name, "
                        "an IPv4 address or a bracketed IPv6 address, with an optional :port", "an entry that is no host", o)
    o = ok_run({"source": "export default () => 1", "capabilities": dict(CAPS, net=["api.example.com"])})
    check(o["error"] == "egress blocked: network access for runs without bindings needs the broker's net-mint credential, "
                        "which this supervisor does not have", "net without the credential", o)
    check(o["logs"] == [] and not o["ok"], "shape", o)


def t_broker_redirect():
    broker.reset("redirect")
    sink.requests.clear()
    o = ok_run({"source": "export default async () => { try { await globalThis.questpie.collections.posts.find({}); return 'unexpected success'; }"
                          " catch { return 'caught'; } }", "bindings": bindings(token="must-not-leak")})
    check(o["ok"] is False and "output" not in o, "denial is terminal", o)
    check(o["error"] == "sandbox broker request failed", "redirect is an error", o)
    check("307" in S.events()[-1].get("detail", ""), "the run's log line names the 307", S.events()[-1])
    time.sleep(0.3)
    check(broker.count() == 1 and sink.requests == [], "never followed: the sink saw nothing", sink.requests)
    broker.reset()


def t_burst():
    broker.reset()
    o = ok_run({"source": "export default async () => { await Promise.all(Array.from({ length: 300 },"
                          " () => globalThis.questpie.collections.posts.find({}))); return 'unexpected'; }",
                "capabilities": dict(CAPS, timeoutMs=8000), "bindings": bindings()})
    check(o["ok"] is False and o["error"] == "sandbox output limit exceeded", "a burst above the per-run count is killed", o)
    check(S.events()[-1].get("detail") == "binding call limit exceeded (256 calls)", "the log line says why",
          S.events()[-1])
    check(broker.count() <= 256, "broker effects bounded", broker.count())
    broker.reset()
    o = ok_run({"source": "export default async () => (await Promise.all(Array.from({ length: 250 },"
                          " (_, i) => globalThis.questpie.collections.posts.find({ i })))).length",
                "capabilities": dict(CAPS, timeoutMs=20000), "bindings": bindings()})
    check(o["ok"] and o["output"] == 250 and broker.count() == 250, "250 concurrent calls relayed", o, broker.count())
    check(broker.max_current <= 16, "at most 16 in flight", broker.max_current)
    check(S.events()[-1]["calls"] == 250, "the log line counts them", S.events()[-1])


def t_client_abort():
    """A caller aborting after the first broker call: the broker sees exactly that one call."""
    broker.reset()
    src = """export default async () => {
  await questpie.collections.posts.find({});
  await new Promise((resolve) => setTimeout(resolve, 500));
  await questpie.collections.posts.find({});
  return "finished";
}"""
    body = json.dumps({"mode": "host", "source": src, "capabilities": CAPS, "bindings": bindings()}).encode()
    s = socket.create_connection(("127.0.0.1", S.port))
    S.posted += 1
    s.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + ADMISSION.encode() + b": " +
              SECRET.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    check(broker.first_call.wait(15), "the first call arrived")
    check(broker.count() == 1, "one call so far")
    s.close()
    time.sleep(1.2)
    check(broker.count() == 1, "the broker saw exactly one call", broker.calls)
    ev = S.events()[-1]
    check(ev["outcome"] == "cancelled" and ev["calls"] == 1, "logged as cancelled", ev)
    m = S.metrics()
    check(m["sb_serve_guests_alive"] == 0 and m["sb_serve_runs_in_flight"] == 0, "nothing left running", m)
    # aborting while a call is in flight: the guest dies at once, the call is abandoned
    broker.reset(hold=3.0)
    s = socket.create_connection(("127.0.0.1", S.port))
    S.posted += 1
    s.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + ADMISSION.encode() + b": " +
              SECRET.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    check(broker.first_call.wait(15), "the call arrived")
    t0 = time.monotonic()
    s.close()
    while time.monotonic() - t0 < 2.0 and S.metrics()["sb_serve_runs_in_flight"] != 0:
        time.sleep(0.05)
    check(time.monotonic() - t0 < 1.5, "cancelled well before the broker answers", time.monotonic() - t0)
    check(S.metrics()["sb_serve_guests_alive"] == 0, "guest gone")
    ev = S.events()[-1]
    check(ev["outcome"] == "cancelled" and ev["ms"] < 2500, "cancelled", ev)
    time.sleep(3.2)
    check(broker.count() == 1, "still one call", broker.calls)
    broker.reset()


def t_secrets():
    val = "s3cr3t-value-" + "q" * 20
    marker_src = "export default () => ({ k: __secrets.API_KEY, names: Object.keys(__secrets), input: 'marker-input-src' })"
    o = ok_run({"source": marker_src, "input": {"in": "marker-input-value"},
                "secrets": {"API_KEY": val, "other.name-1_x": "v", "__proto__": "p"},
                "bindings": bindings(token="marker-token-value")})
    check(o["ok"] and o["output"]["k"] == val and sorted(o["output"]["names"]) == ["API_KEY", "__proto__", "other.name-1_x"],
          "__secrets visible to the guest", o)
    o = ok_run({"source": "export default () => [Object.isFrozen(__secrets), __secrets.hasOwnProperty('K'), __secrets.K]",
                "secrets": {"K": "v"}})
    check(o["output"] == [True, True, "v"], "a frozen plain object", o)
    log = S.log()
    for needle in (val, "marker-input-value", "marker-input-src", "marker-token-value", SECRET):
        check(needle not in log, "%s in no log line" % needle)


def t_capacity():
    s2 = Serve(args=["--max-runs", "1"])
    try:
        slow = {"source": "export default async () => { await new Promise(r => setTimeout(r, 1500)); return 'slow'; }"}
        res = {}
        th = threading.Thread(target=lambda: res.update(first=s2.run(slow)))
        th.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and s2.metrics()["sb_serve_runs_in_flight"] < 1:
            time.sleep(0.02)
        st, o = s2.run({"source": "export default () => 1"})
        check(st == 503 and o == {"ok": False, "error": "sandbox supervisor is at capacity", "logs": []}, "503", st, o)
        th.join(30)
        check(res["first"][1]["output"] == "slow", "the first run finished", res)
        st, o = s2.run({"source": "export default () => 2"})
        check(st == 200 and o["output"] == 2, "room again", o)
        check(s2.metrics()['sb_serve_runs_total{outcome="busy"}'] == 1, "counted as busy")
    finally:
        s2.stop()


def t_metrics():
    st, raw, _ = S.request("GET", "/metrics")
    check(st == 403 and json.loads(raw) == DENIED, "metrics need the secret", raw)
    st, raw, _ = S.request("GET", "/metrics", headers={"authorization": "Bearer wrong"})
    check(st == 403, "a wrong bearer is refused", raw)
    st, raw, h = S.request("GET", "/metrics", headers={"authorization": "Bearer " + SECRET})
    check(st == 200 and h["content-type"].startswith("text/plain"), "bearer form", h)
    m = S.metrics()
    for k in ('sb_serve_runs_total{outcome="ok"}', 'sb_serve_runs_total{outcome="timeout"}',
              'sb_serve_runs_total{outcome="rejected"}', 'sb_serve_runs_total{outcome="invalid"}',
              'sb_serve_runs_total{outcome="denied"}', "sb_serve_run_duration_seconds_count",
              'sb_serve_run_duration_seconds_bucket{le="+Inf"}', "sb_serve_guests_alive",
              "sb_serve_jail_setup_failures_total"):
        check(k in m, "metric " + k, sorted(m))
    check(m['sb_serve_runs_total{outcome="ok"}'] >= 1 and m['sb_serve_runs_total{outcome="timeout"}'] >= 1, "counted", m)
    check(m['sb_serve_run_duration_seconds_bucket{le="+Inf"}'] == m["sb_serve_run_duration_seconds_count"], "histogram", m)
    check(m["sb_serve_guests_alive"] == 0 and m["sb_serve_jail_setup_failures_total"] == 0, "gauges", m)
    before = m['sb_serve_runs_total{outcome="ok"}']
    ok_run({"source": "export default () => 1"})
    check(S.metrics()['sb_serve_runs_total{outcome="ok"}'] == before + 1, "one more ok")


def t_log_lines():
    evs = S.events()
    check(evs, "runs are logged")
    for ev in evs:
        check(set(ev) >= {"ts", "level", "event", "outcome", "status", "ms", "calls", "timedOut"}, "fields", ev)
        check(not (set(ev) & {"source", "input", "secrets", "token", "output", "error", "logs"}), "nothing private", ev)


def t_startup_refusals():
    for env, needle in (({}, "SANDBOX_HOST_ADMISSION_SECRET"),
                        ({"SANDBOX_HOST_ADMISSION_SECRET": "x" * 31}, "at least 32 bytes"),
                        ({"SANDBOX_HOST_ADMISSION_SECRET": "   " + "x" * 30 + "  "}, "at least 32 bytes"),
                        ({"SANDBOX_HOST_ADMISSION_SECRET": SECRET, "SANDBOX_BROKER_URL": "http://127.0.0.1/x#f"}, "fragment"),
                        ({"SANDBOX_HOST_ADMISSION_SECRET": SECRET, "SANDBOX_NET_MINT_SECRET": "y" * 40}, "SANDBOX_BROKER_ADMIN_URL"),
                        ({"SANDBOX_HOST_ADMISSION_SECRET": SECRET, "SANDBOX_BROKER_ADMIN_URL": "http://127.0.0.1:9"},
                         "SANDBOX_NET_MINT_SECRET"),
                        ({"SANDBOX_HOST_ADMISSION_SECRET": SECRET, "PORT": "99999"}, "PORT")):
        e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_") and k != "PORT"}
        e.update(env)
        p = subprocess.run([SHIM, "serve", "--deno", DENO], env=e, capture_output=True, timeout=30)
        err = p.stderr.decode()
        check(p.returncode == 2 and needle in err, "refused: " + needle, p.returncode, err)
        check(SECRET not in err, "the secret is not echoed", err)
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    e["SANDBOX_HOST_ADMISSION_SECRET"] = SECRET
    p = subprocess.run([SHIM, "serve", "--deno", "/bin/true"], env=e, capture_output=True, timeout=30)
    check(p.returncode == 2 and "did not answer like Deno" in p.stderr.decode(), "not a Deno", p.stderr)


def t_port_env_and_file_secret():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "adm")
        with open(path, "w") as f:
            f.write(SECRET + "\n")
        port = free_port()
        e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
        e["PORT"] = str(port)
        p = subprocess.Popen([SHIM, "serve", "--deno", DENO, "--admission-secret-file", path], env=e,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            line = json.loads(p.stderr.readline())
            check(line["event"] == "listening" and line["port"] == port and line["host"] == "127.0.0.1", "PORT", line)
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/run", json.dumps({"mode": "host", "source": "export default () => 3", "capabilities": {}}),
                      {ADMISSION: SECRET})
            r = c.getresponse()
            check(r.status == 200 and json.loads(r.read())["output"] == 3, "the file's secret admits")
        finally:
            p.send_signal(signal.SIGTERM)
            check(p.wait(30) == 0, "clean exit")


def t_drain_on_sigterm():
    s2 = Serve()
    res = {}
    th = threading.Thread(target=lambda: res.update(r=s2.run(
        {"source": "export default async () => { await new Promise(r => setTimeout(r, 800)); return 'drained'; }"})))
    th.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and s2.metrics()["sb_serve_runs_in_flight"] < 1:
        time.sleep(0.02)
    rc = s2.stop()
    th.join(30)
    check(rc == 0, "exit 0", rc, s2.log())
    check(res.get("r", (0, {}))[1].get("output") == "drained", "the run in flight was answered", res)


# ---- the jail ----

def descendants(pid):
    """Every process below `pid`, as {pid: (ppid, argv)}."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        procs[int(d)] = (ppid, argv)
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for c, (pp, argv) in procs.items():
            if pp == p and c not in out:
                out[c] = (pp, argv)
                todo.append(c)
    return out


def status_fields(pid):
    with open("/proc/%d/status" % pid) as f:
        return dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)


def observe_guest(serve, src="export default async () => { await new Promise(r => setTimeout(r, 1500)); "
                             "return [Deno.pid, Deno.ppid]; }"):
    """Runs a guest through `serve` and looks at it from outside while it runs: its /proc status
    and namespaces, and its own view of its pid."""
    res, seen = {}, {}
    th = threading.Thread(target=lambda: res.update(r=serve.run({"source": src})))
    th.start()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not seen:
        for pid, (_, argv) in descendants(serve.proc.pid).items():
            if argv and argv[0] == b"/runtime/deno":
                try:
                    st = status_fields(pid)
                    seen = {"pid": pid, "status": st, "ns": {n: os.readlink("/proc/%d/ns/%s" % (pid, n))
                                                             for n in ("user", "mnt", "pid", "net", "ipc", "uts")}}
                except OSError:
                    seen = {}
                break
        time.sleep(0.02)
    th.join(30)
    check(seen, "the guest was seen running", res)
    return res["r"], seen


def t_jailed():
    (st, o), g = observe_guest(S)
    check(st == 200 and o["ok"] and o["output"] == [1, 0], "the guest is pid 1 of its own PID namespace", o)
    status, mine = g["status"], {n: os.readlink("/proc/self/ns/" + n) for n in g["ns"]}
    check(status["NoNewPrivs"] == "1" and status["Seccomp"] == "2", "no_new_privs and a seccomp filter", status)
    check(status["CapEff"] == "0000000000000000" and status["CapBnd"] == "0000000000000000", "no capabilities", status)
    check(all(g["ns"][n] != mine[n] for n in g["ns"]), "user, mount, pid, net, ipc and uts namespaces of its own", g["ns"], mine)
    uid = int(status["Uid"].split()[0])
    if os.geteuid() == 0:
        check(UID_BASE <= uid < UID_BASE + 1024, "a uid of its own from the jail's range", status["Uid"])
    else:
        check(uid == os.geteuid(), "unprivileged: the service's own uid", status["Uid"])
    ev = S.events("jail")
    check(len(ev) == 1 and ev[0]["on"] is True and ev[0]["level"] == "info" and ev[0]["describe"].startswith("jail: on:"),
          "the start-up line says what the jail applies", ev)
    check(S.events("started")[0]["jail"] is True, "and so does the started line", S.events("started"))
    # the contrast: --jail=off is an explicit opt-out, logged as a warning, and these checks then fail
    s2 = Serve(args=["--jail=off"])
    try:
        (st, o), g = observe_guest(s2)
        check(st == 200 and o["ok"] and o["output"][0] != 1, "unjailed, the guest has a host pid", o)
        check(g["status"]["Seccomp"] == "0" and g["ns"]["net"] == os.readlink("/proc/self/ns/net"),
              "unjailed: no filter, the host's network", g)
        ev = s2.events("jail")
        check(len(ev) == 1 and ev[0]["on"] is False and ev[0]["level"] == "warn" and
              ev[0]["describe"].startswith("jail: OFF (--jail=off)"), "--jail=off is said, as a warning", ev)
    finally:
        s2.stop()


MSG_USERNS = ("jail: the kernel refused new user, mount, pid, network, ipc and uts namespaces (clone: Operation not permitted); "
              "refusing to start the guest (--jail=off runs it without the jail); serve does not start")


def t_jail_fail_closed():
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    e["SANDBOX_HOST_ADMISSION_SECRET"] = SECRET
    cases = (("deny-userns", MSG_USERNS),
             ("deny-seccomp", "jail: the kernel refuses seccomp filters (seccomp: Invalid argument); serve does not start "
              "(--jail=off runs the guests without the jail)"),
             ("deny-seccomp-load", "jail: the kernel refused loading the seccomp filter (Invalid argument); refusing to start "
              "the guest (--jail=off runs it without the jail); serve does not start"))
    for mode, needle in cases:
        p = subprocess.run([PROBE, mode, SHIM, "serve", "--listen", "127.0.0.1:0", "--deno", DENO], env=e,
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and needle in p.stderr and '"listening"' not in p.stderr, "refused to start: " + mode,
              p.returncode, p.stderr)
    # the explicit opt-out runs on such a kernel, and says so
    s2 = Serve(args=["--jail=off"], wrap=[PROBE, "deny-userns"])
    try:
        st, o = s2.run({"source": "export default () => 'unjailed'"})
        check(st == 200 and o["output"] == "unjailed", "--jail=off serves", o)
        check(s2.events("jail")[0]["on"] is False, "and logged it", s2.events("jail"))
    finally:
        s2.stop()
    for flags, needle in ((["--jail", "maybe"], "--jail wants on or off"), (["--jail-slots", "0"], "--jail-slots wants"),
                          (["--jail-cgroup", "rel"], "--jail-cgroup wants an absolute directory"),
                          (["--jail-cgroup", TMP], "is not a cgroup v2 directory")):
        p = subprocess.run([SHIM, "serve", "--deno", DENO] + flags, env=e, capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and needle in p.stderr, "usage: " + needle, p.returncode, p.stderr)


def t_jail_failure_counted():
    """A guest the jail cannot be set up for: the run says why, nothing runs, and /metrics counts it."""
    if os.geteuid() != 0:
        # unprivileged, every guest shares the service's uid: no slots to run out of
        s2 = Serve(args=["--jail-slots", "1"])
        try:
            check("shared by every guest" in s2.events("jail")[0]["describe"], "the start-up line says so")
        finally:
            s2.stop()
        return
    lock = os.path.join(TMP, "uids.lock")
    # no pool: its guests would hold the one slot (t_pool covers pooled guests and slots)
    s2 = Serve(args=["--jail-slots", "1", "--jail-uid-base", str(UID_BASE + 61000), "--jail-lock-file", lock,
                     "--max-runs", "4", "--pool-size", "0"], env={"TMPDIR": TMP})
    try:
        res = {}
        slow = {"source": "export default async () => { await new Promise(r => setTimeout(r, 2000)); return 'held'; }"}
        th = threading.Thread(target=lambda: res.update(first=s2.run(slow)))
        th.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and s2.metrics()["sb_serve_guests_alive"] < 1:
            time.sleep(0.02)
        st, o = s2.run({"source": "export default () => 'never'"})
        check(st == 200 and o == {"ok": False, "error": "failed to spawn sandbox subprocess: jail: all 1 guest uids are in "
                                  "use (--jail-slots)", "logs": [], "ms": o.get("ms")}, "the run says why", o)
        m = s2.metrics()
        check(m["sb_serve_jail_setup_failures_total"] == 1, "counted once", m)
        check(m['sb_serve_runs_total{outcome="spawn_failed"}'] == 1, "a spawn failure", m)
        th.join(30)
        ev = [e for e in s2.events() if e["outcome"] == "spawn_failed"]
        check(len(ev) == 1 and ev[0]["jailFailures"] == 1, "the log line says so", s2.events())
        check(res["first"][1]["output"] == "held", "the first run was not disturbed", res)
        st, o = s2.run({"source": "export default () => 'again'"})
        check(st == 200 and o["output"] == "again", "the uid came back with the first run's end", o)
        check(s2.metrics()["sb_serve_jail_setup_failures_total"] == 1, "no more failures", s2.metrics())
    finally:
        s2.stop()
    check(os.listdir(TMP) == ["uids.lock"], "every work directory removed", os.listdir(TMP))


def t_cancel_cleans_up():
    """A client that goes away: the run's process is told to cancel, and cleans up after its guest."""
    tmp = tempfile.mkdtemp(prefix="tmpdir-", dir=TMP)
    os.chmod(tmp, 0o711)
    s2 = Serve(env={"TMPDIR": tmp}, args=["--pool-size", "0"])  # one directory per run, none pooled
    try:
        body = json.dumps({"mode": "host", "capabilities": CAPS, "source":
                           "export default async () => { await new Promise(r => setTimeout(r, 5000)); return 1; }"}).encode()
        c = socket.create_connection(("127.0.0.1", s2.port))
        s2.posted += 1
        c.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + ADMISSION.encode() + b": " +
                  SECRET.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and s2.metrics()["sb_serve_guests_alive"] < 1:
            time.sleep(0.02)
        check(os.listdir(tmp) == [], "no work directory on the host (the guest's scratch is its own tmpfs)",
              os.listdir(tmp))
        c.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (s2.metrics()["sb_serve_runs_in_flight"] != 0 or os.listdir(tmp)):
            time.sleep(0.05)
        ev = s2.events()[-1]
        check(ev["outcome"] == "cancelled", "cancelled by its own process, which reported", ev)
        check(os.listdir(tmp) == [], "its work directory removed", os.listdir(tmp))
        check(not [p for p, (_, a) in descendants(s2.proc.pid).items() if a and a[0] == b"/runtime/deno"], "no guest left")
        # what the service sends a run's process when h2o lets go of its request: SIGTERM cancels the
        # run the same way (a process killed outright would leave its guest's directory behind)
        res = {}
        th = threading.Thread(target=lambda: res.update(r=s2.run({"source": "export default async () => "
                                                                  "{ await new Promise(r => setTimeout(r, 5000)); return 1; }"})))
        th.start()
        guest = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not guest:
            guest = [(p, pp) for p, (pp, a) in descendants(s2.proc.pid).items() if a and a[0] == b"/runtime/deno"]
            time.sleep(0.02)
        check(len(guest) == 1 and os.listdir(tmp) == [], "one guest, no work directory", guest, os.listdir(tmp))
        os.kill(guest[0][1], signal.SIGTERM)
        th.join(10)
        st, o = res["r"]
        check(st == 200 and o == {"ok": False, "error": "sandbox request cancelled", "logs": [], "ms": o.get("ms")},
              "the run's process cancelled the run and answered", o)
        check(os.listdir(tmp) == [], "and nothing is left on the host", os.listdir(tmp))
        # a run's process killed outright: its guest dies with it (PR_SET_PDEATHSIG, set again after
        # the guest's uid change), not at the end of its timeoutMs
        th = threading.Thread(target=lambda: res.update(r=s2.run({"source": "export default async () => "
                                                                  "{ await new Promise(r => setTimeout(r, 25000)); return 1; }",
                                                                  "capabilities": dict(CAPS, timeoutMs=30000)})))
        th.start()
        guest = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not guest:
            guest = [(p, pp) for p, (pp, a) in descendants(s2.proc.pid).items() if a and a[0] == b"/runtime/deno"]
            time.sleep(0.02)
        check(len(guest) == 1, "one guest", guest)
        os.kill(guest[0][1], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.path.exists("/proc/%d" % guest[0][0]):
            time.sleep(0.02)
        check(not os.path.exists("/proc/%d" % guest[0][0]), "the guest died with its run's process", guest)
        th.join(30)
        check(os.listdir(tmp) == [], "nothing left on the host", os.listdir(tmp))
    finally:
        s2.stop()
        os.rmdir(tmp)


UNIT = os.path.join(SOURCE_DIR, "deploy", "systemd", "sandbox-shim-serve.service")
UNITJAIL = os.path.join(SOURCE_DIR, "tests", "integration", "unitjail.py")


def unit_exec_start(subst):
    """The unit's ExecStart= as argv, continuation lines joined and ${NAME}s replaced from `subst`."""
    with open(UNIT) as f:
        text = f.read().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(line.split("=", 1)[1])
    out = []
    for a in argv:
        for k, v in subst.items():
            a = a.replace("${%s}" % k, v)
        check("${" not in a, "every variable of ExecStart= is provided", a)
        out.append(a)
    check(out[0] == "/usr/local/bin/sandbox-shim", "the installed binary", out)
    return [SHIM] + out[1:]


def t_systemd_unit():
    """serve as deploy/systemd/sandbox-shim-serve.service starts it, under the unit's own sandbox
    (tests/integration/unitjail.py: its capability bounding set, no_new_privs, system call filter,
    namespace and address-family restrictions, read-only file system): the start-up probe passes,
    guests are jailed, a bindings run reaches the broker, a bomb leaves it healthy, and nothing of
    the guests is left under TMPDIR (they write only their own scratch)."""
    creds = tempfile.mkdtemp(prefix="creds-", dir=TMP)
    for name, value in (("admission-secret", SECRET), ("net-mint-secret", "n" * 40)):
        with open(os.path.join(creds, name), "w") as f:
            f.write(value + "\n")
    tmp = tempfile.mkdtemp(prefix="tmpdir-", dir=TMP)
    os.chmod(tmp, 0o711)
    argv = unit_exec_start({"SANDBOX_SHIM_LISTEN": "127.0.0.1:0", "CREDENTIALS_DIRECTORY": creds})
    # LeakSanitizer stops the world with ptrace, which the unit's filter refuses (ASan builds only)
    env = {"SANDBOX_BROKER_URL": broker.url, "SANDBOX_BROKER_ADMIN_URL": "http://127.0.0.1:%d" % closed_port(),
           "DENO_BIN": DENO, "TMPDIR": tmp, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}
    s2 = Serve(env=env, secret=None, wrap=["/usr/bin/python3", UNITJAIL, UNIT, "--"], argv=argv)
    try:
        st = status_fields(s2.proc.pid)
        want = sum(1 << n for n in (5, 6, 7))  # CAP_KILL, CAP_SETGID, CAP_SETUID
        if os.geteuid() == 0:
            check(int(st["CapEff"], 16) == want and int(st["CapBnd"], 16) == want, "the unit's capabilities only", st)
        check(st["NoNewPrivs"] == "1" and st["Seccomp"] == "2", "the unit's filters", st)
        check(s2.events("jail")[0]["on"] is True, "the jail is on", s2.events("jail"))
        (code, o), g = observe_guest(s2)
        check(code == 200 and o["ok"] and o["output"] == [1, 0], "a jailed guest", o)
        check(g["status"]["CapEff"] == "0000000000000000" and g["status"]["Seccomp"] == "2", "no capabilities", g)
        broker.reset()
        code, o = s2.run({"source": "export default async () => await questpie.collections.posts.find({ a: 1 })",
                          "bindings": bindings()})
        check(code == 200 and o["ok"] and o["output"] == {"a": 1} and broker.count() == 1, "relayed to the broker", o)
        # the module path under the unit's sandbox: the jail brings up the guest's loopback and listens there
        broker.reset()
        code, o = s2.run({"source": 'import { m } from "https://esm.sh/x.js";\nexport default () => m;',
                          "capabilities": dict(CAPS, **{"import": ["esm.sh"]}), "bindings": bindings()})
        check(code == 200 and o["ok"] and o["output"] == 7, "a module through the broker", o, s2.log()[-2000:])
        check([(c["body"]["method"], c["body"]["args"], c["module"]) for c in broker.calls] ==
              [("import.fetch", {"url": "https://esm.sh/x.js"}, "1")], "one import.fetch on the module path", broker.calls)
        code, o = s2.run({"source": "export default async () => { const a = []; while (true) a.push(new Array(1e6).fill(1)); }",
                          "capabilities": dict(CAPS, timeoutMs=20000, memoryMb=32)})
        check(code == 200 and o["ok"] is False and not o.get("timedOut"), "the bomb fails its run", o)
        code, raw, _ = s2.request("GET", "/health")
        check(code == 200 and json.loads(raw)["ok"], "healthy", raw)
    finally:
        rc = s2.stop()
    check(rc == 0, "a clean stop", rc, s2.log())
    # the pool's waiting guests keep theirs until the service stops, which discards them
    check(os.listdir(tmp) == [], "every work directory removed", os.listdir(tmp))
    check("does not start" not in s2.log(), "no refusal", s2.log())


# ---- the launcher and the pool (serve/launcher.h) ----

def wait_pool_ready(s2, n, timeout=30):
    deadline = time.monotonic() + timeout
    m = s2.metrics()
    while time.monotonic() < deadline and m.get('sb_serve_pool_guests{state="ready"}') != n:
        time.sleep(0.05)
        m = s2.metrics()
    check(m.get('sb_serve_pool_guests{state="ready"}') == n, "%d pooled guests ready" % n, m)
    return m


def guests_of(s2):
    return {pid for pid, (_, argv) in descendants(s2.proc.pid).items() if argv and argv[0] == b"/runtime/deno"}


def t_pool_hits_and_classes():
    """A run of a pooled memory class takes a started guest; another class starts cold; the pool refills."""
    s2 = Serve(args=["--pool-size", "2", "--pool-memory-mb", "128,64"])
    try:
        check(s2.events("pool")[0]["size"] == 2 and s2.events("pool")[0]["memoryMb"] == [128, 64], "the start-up line",
              s2.events("pool"))
        wait_pool_ready(s2, 4)
        check(len(guests_of(s2)) == 4, "four guests waiting", guests_of(s2))
        st, o = s2.run({"source": "export default (i) => i.n * 2", "input": {"n": 21}})
        check(st == 200 and o["ok"] and o["output"] == 42, "a pooled run", o)
        st, o = s2.run({"source": "export default () => 'small'", "capabilities": dict(CAPS, memoryMb=64)})
        check(st == 200 and o["output"] == "small", "the other class", o)
        st, o = s2.run({"source": "export default () => 'big'", "capabilities": dict(CAPS, memoryMb=256)})
        check(st == 200 and o["output"] == "big", "a class the pool does not keep starts cold", o)
        m = wait_pool_ready(s2, 4)
        check(m['sb_serve_pool_runs_total{start="pooled"}'] == 2 and m['sb_serve_pool_runs_total{start="cold"}'] == 1 and
              m["sb_serve_pool_misses_total"] == 0, "two pooled, one cold, no miss", m)
        check(m["sb_serve_pool_started_total"] >= 6 and m["sb_serve_handover_seconds_count"] == 3, "refilled; handovers", m)
        ev = s2.events()
        check([e["pooled"] for e in ev] == [True, True, False] and all(isinstance(e["handoverMs"], int) for e in ev),
              "each run's line says how it started", ev)
    finally:
        check(s2.stop() == 0, "a clean stop")


def t_pool_miss():
    """More runs at once than the pool holds: the rest start cold, counted as misses."""
    s2 = Serve(args=["--pool-size", "1", "--max-runs", "4"])
    try:
        wait_pool_ready(s2, 1)
        slow = {"source": "export default async () => { await new Promise(r => setTimeout(r, 800)); return 'x'; }"}
        res = []
        ths = [threading.Thread(target=lambda: res.append(s2.run(slow))) for _ in range(3)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(60)
        check(len(res) == 3 and all(st == 200 and o["output"] == "x" for st, o in res), "every run answered", res)
        m = s2.metrics()
        pooled, cold = m['sb_serve_pool_runs_total{start="pooled"}'], m['sb_serve_pool_runs_total{start="cold"}']
        check(pooled + cold == 3 and cold >= 1 and m["sb_serve_pool_misses_total"] == cold, "misses started cold", m)
    finally:
        s2.stop()


def t_pool_no_state_crosses_runs():
    """One process per run: a global, a timer and a patched builtin of one run are never seen by the next."""
    s2 = Serve(args=["--pool-size", "1"])
    try:
        wait_pool_ready(s2, 1)
        st, o = s2.run({"source": "export default () => { globalThis.leak = 'run-1'; JSON.stringify = () => 'patched';"
                                  " setInterval(() => console.log('tick from run 1'), 10); return 1; }"})
        check(st == 200 and o["output"] == 1, "run 1", o)
        wait_pool_ready(s2, 1)
        st, o = s2.run({"source": "export default async () => { await new Promise(r => setTimeout(r, 100));"
                                  " return [typeof globalThis.leak, JSON.stringify({a: 1})]; }"})
        check(st == 200 and o["output"] == ["undefined", '{"a":1}'] and o["logs"] == [], "run 2 sees none of it", o)
    finally:
        s2.stop()


def t_pool_timeout_from_handover():
    """The run's timeout starts when the run is handed to its guest, not when the guest was started."""
    s2 = Serve(args=["--pool-size", "1"])
    try:
        wait_pool_ready(s2, 1)
        time.sleep(1.5)  # the pooled guest has now waited longer than the run's whole timeout
        st, o = s2.run({"source": "export default async () => { await new Promise(r => setTimeout(r, 300)); return 'in time'; }",
                        "capabilities": dict(CAPS, timeoutMs=1000)})
        check(st == 200 and o["ok"] and o["output"] == "in time" and "timedOut" not in o, "not timed out", o)
        check(s2.events()[-1]["pooled"] is True, "it was a pooled guest", s2.events())
        st, o = s2.run({"source": "export default () => { for (;;) {} }", "capabilities": dict(CAPS, timeoutMs=300)})
        check(st == 200 and o["ok"] is False and o.get("timedOut") is True, "a spinning run still times out", o)
        # RLIMIT_CPU: a pooled guest waits with the longest run's; the hand-over lowers it to its run's
        # (CPUs x timeout rounded up to seconds + 5 s, jail.h), plus 2 s for its start (launcher.h)
        wait_pool_ready(s2, 1)
        cpus = os.cpu_count()

        def cpu_limits():
            out = {}
            for pid in guests_of(s2):
                try:
                    with open("/proc/%d/limits" % pid) as f:
                        out[pid] = int(next(ln for ln in f if ln.startswith("Max cpu time")).split()[3])
                except (OSError, StopIteration, ValueError):
                    pass
            return out

        idle = cpu_limits()
        check(list(idle.values()) == [cpus * 30 + 5], "the waiting guest has the longest run's limit", idle)
        res = {}
        th = threading.Thread(target=lambda: res.update(r=s2.run(
            {"source": "export default async () => { await new Promise(r => setTimeout(r, 1500)); return 1; }",
             "capabilities": dict(CAPS, timeoutMs=3000)})))
        th.start()
        deadline, running = time.monotonic() + 10, []
        while time.monotonic() < deadline and not running:
            running = [v for p, v in cpu_limits().items() if p in idle]
            running = [v for v in running if v != cpus * 30 + 5]
            time.sleep(0.05)
        th.join(30)
        check(running == [cpus * 3 + 5 + 2], "its run lowered it", running, res)
    finally:
        s2.stop()


def t_pool_guest_dies():
    """A pooled guest that dies while waiting is replaced, counted and logged; runs go on."""
    s2 = Serve(args=["--pool-size", "2"])
    try:
        wait_pool_ready(s2, 2)
        victim = sorted(guests_of(s2))[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and s2.metrics()["sb_serve_pool_died_total"] < 1:
            time.sleep(0.05)
        m = wait_pool_ready(s2, 2)
        check(m["sb_serve_pool_died_total"] == 1, "counted once", m)
        check(victim not in guests_of(s2), "replaced by another process", victim, guests_of(s2))
        check(s2.events("pool.guest_died") and s2.events("pool.guest_died")[0]["died"] == 1, "logged", s2.log())
        st, o = s2.run({"source": "export default () => 'after'"})
        check(st == 200 and o["output"] == "after", "runs go on", o)
    finally:
        s2.stop()


def t_pool_guest_dies_at_handover():
    """A pooled guest that dies as its run is handed over: the run starts cold and is answered, and its
    line says so. (The waiting process is stopped, its guest killed, a run posted to it, then it goes on:
    it finds the run and the death at once.)"""
    s2 = Serve(args=["--pool-size", "1"])
    waiting = None
    try:
        wait_pool_ready(s2, 1)
        tree = descendants(s2.proc.pid)
        launcher = next(pid for pid, (pp, _) in tree.items() if pp == s2.proc.pid)
        waiting = next(pid for pid, (pp, _) in tree.items() if pp == launcher)
        guest = next(iter(guests_of(s2)))
        check(guest in descendants(waiting), "the guest is the waiting process's", guest, waiting)
        os.kill(waiting, signal.SIGSTOP)
        os.kill(guest, signal.SIGKILL)

        def gone(pid):
            try:
                with open("/proc/%d/stat" % pid) as f:
                    return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # exited, its stopped parent not told yet
            except OSError:
                return True

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not gone(guest):
            time.sleep(0.02)
        check(gone(guest), "the guest has died before its run is posted", guest)
        res = {}
        th = threading.Thread(target=lambda: res.update(r=s2.run({"source": "export default (i) => i.n + 1", "input": {"n": 1}})))
        th.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and s2.metrics()['sb_serve_pool_runs_total{start="pooled"}'] < 1:
            time.sleep(0.05)
        check(s2.metrics()['sb_serve_pool_runs_total{start="pooled"}'] == 1, "the launcher gave the run to the waiting process")
        os.kill(waiting, signal.SIGCONT)
        waiting = None
        th.join(60)
        st, o = res.get("r", (None, None))
        check(st == 200 and o["ok"] is True and o["output"] == 2, "the run is answered", st, o)
        ev = s2.events()[-1]
        check(ev["pooled"] is False and ev.get("pooledGuestDied") is True, "its line says it started cold, and why", ev)
        m = s2.metrics()
        check(m['sb_serve_pool_runs_total{start="pooled"}'] == 0 and m['sb_serve_pool_runs_total{start="cold"}'] == 1 and
              m["sb_serve_pool_died_total"] == 1, "the metrics say the same: a cold run, a guest that died waiting", m)
    finally:
        if waiting is not None:
            os.kill(waiting, signal.SIGCONT)
        s2.stop()


def t_launcher_gone():
    """The launcher gone (killed): /health answers 503 and says why, runs fail to spawn, the log says it once."""
    s2 = Serve(args=["--pool-size", "1"])
    try:
        wait_pool_ready(s2, 1)
        kids = {pid: argv for pid, (pp, argv) in descendants(s2.proc.pid).items() if pp == s2.proc.pid}
        check(len(kids) == 1, "one child of the service: the launcher", kids)
        launcher = next(iter(kids))
        os.kill(launcher, signal.SIGKILL)
        deadline = time.monotonic() + 10
        code, raw = 200, b""
        while time.monotonic() < deadline and code == 200:
            code, raw, _ = s2.request("GET", "/health")
            time.sleep(0.1)
        check(code == 503 and "the launcher is gone" in json.loads(raw)["error"], "health tells", code, raw)
        st, o = s2.run({"source": "export default () => 1"})
        check(st == 200 and o["ok"] is False and o["error"].startswith("failed to spawn sandbox subprocess: "), "no run", o)
        check(len(s2.events("launcher.down")) == 1, "logged once", s2.log())
    finally:
        s2.stop()


MULTIHOMED = r"""
import json, os, socket, subprocess, sys, time
shim, deno, secret = sys.argv[1], sys.argv[2], sys.argv[3]
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
env["SANDBOX_HOST_ADMISSION_SECRET"] = secret
p = subprocess.Popen([shim, "serve", "--listen", "0.0.0.0:0", "--deno", deno, "--pool-size", "0"], env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
port = None
for raw in p.stderr:
    ev = json.loads(raw)
    if ev.get("event") == "listening":
        port = ev["port"]
        break
def conn(dst):
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    c.bind(("127.0.0.5", 40555))
    c.connect((dst, port))
    return c
a = conn("127.0.0.1")
b = conn("127.0.0.2")
body = json.dumps({"mode": "host", "capabilities": {"net": [], "import": [], "timeoutMs": 5000, "memoryMb": 128},
                   "source": "export default async () => { await new Promise(r => setTimeout(r, 1500)); return 'A'; }"}).encode()
a.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-questpie-sandbox-host-admission: " +
          secret.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
time.sleep(0.8)
b.close()  # the other connection from the same client address hangs up
a.settimeout(20)
data = b""
while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
    chunk = a.recv(65536)
    if not chunk:
        break
    data += chunk
print(data.split(b"\r\n\r\n", 1)[-1].decode())
p.terminate()
p.wait(30)
"""


def t_client_connection_by_both_ends():
    """A run holds its own client's connection, found by both of its ends: another connection from
    the same client address and port to another of serve's addresses hanging up does not cancel it.
    (serve on 0.0.0.0, in a network namespace of the test's own with only lo)"""
    if not needs_root("a network namespace of the test's own"):
        return
    p = subprocess.run(["unshare", "--net", "--", "/usr/bin/python3", "-c", MULTIHOMED, SHIM, DENO, SECRET],
                       capture_output=True, text=True, timeout=90)
    check(p.returncode == 0, "the namespaced client ran", p.returncode, p.stdout, p.stderr)
    o = json.loads(p.stdout.strip().splitlines()[-1])
    check(o["ok"] is True and o["output"] == "A", "the run was not cancelled by the other connection", o)


def t_pool_drain_kills_pooled():
    """SIGTERM: the pooled guests are killed, the run in flight is answered, serve exits 0."""
    s2 = Serve(args=["--pool-size", "2"])
    wait_pool_ready(s2, 2)
    res = {}
    th = threading.Thread(target=lambda: res.update(r=s2.run(
        {"source": "export default async () => { await new Promise(r => setTimeout(r, 700)); return 'drained'; }"})))
    th.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and s2.metrics()["sb_serve_runs_in_flight"] < 1:
        time.sleep(0.02)
    seen = guests_of(s2)
    check(len(seen) >= 2, "pooled guests and the run's", seen)
    rc = s2.stop()
    th.join(30)
    check(rc == 0 and res["r"][0] == 200 and res["r"][1]["output"] == "drained", "drained", rc, res)
    alive = [p for p in seen if os.path.exists("/proc/%d" % p)]
    check(alive == [], "no guest outlives the service", alive)


def process_holds(pid, needle):
    """1 when `needle` is in the process's readable memory (root reads /proc/<pid>/mem of a non-dumpable
    process with CAP_SYS_PTRACE)."""
    try:
        with open("/proc/%d/maps" % pid) as f:
            maps = f.read().splitlines()
        fd = os.open("/proc/%d/mem" % pid, os.O_RDONLY)
    except OSError:
        return False
    try:
        for line in maps:
            parts = line.split()
            if len(parts) < 2 or parts[1][0] != "r" or (len(parts) > 5 and parts[5] in ("[vvar]", "[vsyscall]", "[vvar_vclock]")):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if hi - lo > 256 * 1024 * 1024:  # reservations (ASan's shadow), not memory a process wrote
                continue
            try:
                if needle in os.pread(fd, hi - lo, lo):
                    return True
            except OSError:
                continue
    finally:
        os.close(fd)
    return False


def t_clean_launcher():
    """A run's processes hold that run's data and nothing else: while run 1 (with a secret) is in flight,
    the launcher, the pooled processes and run 2's process hold none of its bytes."""
    if not needs_root("reading other processes' memory"):
        return
    s2 = Serve(args=["--pool-size", "2"])
    conns = []
    try:
        wait_pool_ready(s2, 2)
        secrets = ["run-%d-secret-%032x" % (i, int.from_bytes(os.urandom(16), "big")) for i in (1, 2)]
        # both runs wait far longer than the look below can take, however slow the machine (a scan of every
        # process's memory takes seconds under ASan); the test ends them by hanging up
        for sec in secrets:
            body = json.dumps({"mode": "host", "capabilities": dict(CAPS, timeoutMs=30000), "secrets": {"K": sec},
                               "source": "export default async () => { await new Promise(r => setTimeout(r, 29000)); "
                                         "return __secrets.K.length; }"}).encode()
            c = socket.create_connection(("127.0.0.1", s2.port))
            s2.posted += 1
            c.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + ADMISSION.encode() +
                      b": " + SECRET.encode() + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            conns.append(c)
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline and s2.metrics()["sb_serve_runs_in_flight"] < 2:
            time.sleep(0.02)
        # each run's process reads its job a moment after it is counted in flight: look until both secrets are
        # found somewhere (or the runs are near their end), then judge where
        holders, procs = [[], []], {}
        while time.monotonic() < deadline and not all(holders):
            time.sleep(0.2)
            procs = {pid: argv for pid, (_, argv) in descendants(s2.proc.pid).items() if argv and argv[0] != b"/runtime/deno"}
            holders = [[pid for pid in procs if process_holds(pid, sec.encode())] for sec in secrets]
        check(s2.metrics()["sb_serve_runs_in_flight"] == 2, "both runs were in flight while they were looked at")
        # the pool's refill may or may not have started yet (slower under ASan): at least these three
        check(len(procs) >= 3, "the launcher and the two runs' processes", procs)
        check(len(holders[0]) == 1 and len(holders[1]) == 1 and holders[0] != holders[1],
              "each secret is in exactly one process below the service: its own run's", holders)
        for c in conns:
            c.close()
        conns = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and s2.metrics()["sb_serve_runs_in_flight"] != 0:
            time.sleep(0.05)
        ev = s2.events()[-2:]
        check(len(ev) == 2 and all(e["outcome"] == "cancelled" for e in ev), "both runs ended by the hang-up", ev)
    finally:
        for c in conns:
            c.close()
        s2.stop()


def t_pool_usage():
    e = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    e["SANDBOX_HOST_ADMISSION_SECRET"] = SECRET
    for flags, needle in ((["--pool-size", "65"], "--pool-size wants 0..64"),
                          (["--pool-memory-mb", "8"], "--pool-memory-mb wants memoryMb values from 16 to 1024"),
                          (["--pool-memory-mb", "128,128"], "--pool-memory-mb names a class twice"),
                          (["--pool-memory-mb", "128,"], "--pool-memory-mb wants memoryMb values from 16 to 1024"),
                          (["--pool-memory-mb", "16,32,48,64,80,96,112,128,144"], "--pool-memory-mb takes at most 8 classes")):
        p = subprocess.run([SHIM, "serve", "--deno", DENO] + flags, env=e, capture_output=True, text=True, timeout=60)
        check(p.returncode == 2 and needle in p.stderr, "usage: " + needle, p.returncode, p.stderr)


tap.case("GET /health: the real Deno version", t_health)
tap.case("404 for other paths and methods; never a run", t_not_found_and_methods)
tap.case("invalid JSON body", t_bad_json)
tap.case("host admission: missing, wrong, duplicated, right", t_admission)
tap.case("mode missing or not host: 403", t_mode)
tap.case("strict schema: exact 400 for every violation, nothing spawned", t_schema)
tap.case("schema edges that are valid", t_schema_accepts)
tap.case("2 MiB request cap: exact 413", t_body_cap)
tap.case("answers above 2 MiB are replaced", t_answer_cap)
tap.case("legacy compute run: output and logs", t_legacy_compute_run)
tap.case("wall-time: while(true) with timeoutMs 300", t_timeout)
tap.case("memory bomb with memoryMb 32; service stays healthy", t_memory_bomb)
tap.case("stdout, stderr, log and output floods", t_floods)
tap.case("bindings: call relayed with the token in the header only, URL normalised", t_bindings_call)
tap.case("bindings URL mismatch, fragment, userinfo: rejected before spawn", t_bindings_rejected)
tap.case("egress blocked: imports that are no hosts; imports and net without the net-mint credential", t_egress_blocked)
tap.case("a broker answering 307: never followed, no token sent on", t_broker_redirect)
tap.case("300 concurrent calls bounded; 250 relayed", t_burst)
tap.case("client abort cancels the run: the broker sees exactly one call", t_client_abort)
tap.case("__secrets visible to the guest and in no log", t_secrets)
tap.case("--max-runs: 503 beyond it, no queue", t_capacity)
tap.case("metrics behind the admission secret", t_metrics)
tap.case("one JSON log line per run, nothing private", t_log_lines)
tap.case("start-up refusals", t_startup_refusals)
tap.case("pool: hits per memory class, cold starts, refill", t_pool_hits_and_classes)
tap.case("pool: more runs than guests start cold (misses)", t_pool_miss)
tap.case("pool: no state crosses runs", t_pool_no_state_crosses_runs)
tap.case("pool: the timeout starts at the hand-over", t_pool_timeout_from_handover)
tap.case("pool: a pooled guest that dies is replaced and counted", t_pool_guest_dies)
tap.case("pool: a pooled guest that dies at the hand-over: its run starts cold", t_pool_guest_dies_at_handover)
tap.case("pool: a drain kills the pooled guests", t_pool_drain_kills_pooled)
tap.case("launcher gone: /health 503, runs refused, logged once", t_launcher_gone)
tap.case("a run's client connection is found by both its ends", t_client_connection_by_both_ends)
tap.case("launcher: a run's processes hold no other run's data", t_clean_launcher)
tap.case("pool: usage errors", t_pool_usage)
tap.case("PORT and --admission-secret-file", t_port_env_and_file_secret)
tap.case("SIGTERM drains the runs in flight", t_drain_on_sigterm)
tap.case("jail: serve's guests are jailed, seen from outside; --jail=off is logged and runs them unjailed", t_jailed)
tap.case("jail: serve refuses to start on a kernel refusing it; --jail=off serves there", t_jail_fail_closed)
tap.case("jail: a guest the jail refuses fails its run and is counted in /metrics", t_jail_failure_counted)
tap.case("a cancelled or killed run's process: no guest, nothing on the host", t_cancel_cleans_up)
tap.case("the systemd unit: serve under the unit's sandbox jails its guests", t_systemd_unit)
rc = S.stop()
check(rc == 0, "serve exits 0")
shutil.rmtree(TMP, ignore_errors=True)
tap.done()

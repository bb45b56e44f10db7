"""sandbox-shim serve as a drop-in for upstream's supervisor, and as an HTTP service under attack.

What a guest and a host written for upstream see (with a scripted msgpack broker that records
every call and answers what the case wants): upstream's fixed run errors per broker code, with the
detail only in serve's log line; the JSON route's value shapes (files.read's contentBase64, bytes
as base64 text); the store sugar as collections.document_store.*; the 404 body byte for byte; a
bindings.url that is no URL; the output cap's message.

What anyone who can connect gets (raw sockets): a body without the admission header refused
before it is sent; 413 as JSON with Content-Length and chunked; ambiguous framing refused and the
connection closed; silent connections closed; a share of the connection slots kept for admitted
connections; refusals counted in /metrics and their log lines capped per interval with a summary.
Needs Deno (SB_DENO, or SB_NODE_PREFIX/node_modules/.bin/deno); SKIP (77) without it.
"""
import sys
sys.dont_write_bytecode = True  # noqa: E402
import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack

from common import SHIM, Tap, check, find_deno

DENO = find_deno()
if DENO is None:
    print("1..0 # SKIP deno not found: set SB_DENO or SB_NODE_PREFIX", flush=True)
    sys.exit(77)

SECRET = "questpie-sandbox-host-service-key-32-bytes-minimum"
ADMISSION = "x-questpie-sandbox-host-admission"
CAPS = {"net": [], "import": [], "timeoutMs": 10000, "memoryMb": 128}
DENIED = {"ok": False, "error": "The workload is not authorized for this sandbox operation.", "logs": []}
TOO_LARGE = {"ok": False, "error": "request body too large", "logs": []}
MAX_CONNECTIONS = 8
tap = Tap()


# ---- a scripted broker: records calls; the method name says what to answer ----

class Broker:
    ERRORS = {"bad_method": 400, "bad_args": 400, "unauthorized": 401, "forbidden": 403, "not_implemented": 501,
              "execution_error": 500, "rate_limited": 429, "unavailable": 503}

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()
        b = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = msgpack.unpackb(self.rfile.read(int(self.headers.get("Content-Length", "0"))), raw=False)
                with b.lock:
                    b.calls.append(body)
                method, args = body.get("method"), body.get("args")
                parts = method.split(".")
                if parts[0] == "collections" and parts[1].startswith("fail-"):
                    code = parts[1][5:]
                    status, value = self.ERRORS[code], {"ok": False, "error": {
                        "code": code, "message": "reason for %s, naming collections.secret_table" % code,
                        "correlationId": "cid-" + code}}
                elif method == "files.read":
                    status, value = 200, {"ok": True, "value": {"path": args["path"], "size": 5, "mimeType": "text/plain",
                                                                  "content": b"hello"}}
                elif method.startswith("collections.") and method.endswith(".findOne"):
                    status, value = 200, {"ok": True, "value": {"id": 1, "blob": b"\x00\xff", "nested": [b"ab"],
                                                                  "big": 2 ** 60}}
                else:
                    status, value = 200, {"ok": True, "value": {"echo": args}}
                out = msgpack.packb(value, use_bin_type=True)
                self.send_response(status)
                self.send_header("Content-Type", "application/msgpack")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            ERRORS = b.ERRORS

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d/api/sandbox/rpc" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self):
        with self.lock:
            self.calls = []


class Serve:
    def __init__(self, broker_url):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_") and k not in ("PORT", "DENO_BIN")}
        env["SANDBOX_HOST_ADMISSION_SECRET"] = SECRET
        env["SANDBOX_BROKER_URL"] = broker_url
        self.proc = subprocess.Popen([SHIM, "serve", "--listen", "127.0.0.1:0", "--deno", DENO, "--max-connections",
                                      str(MAX_CONNECTIONS)], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines, self.lock, self.port = [], threading.Lock(), None
        got = threading.Event()

        def read():
            for raw in self.proc.stderr:
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                with self.lock:
                    self.lines.append(ev)
                if ev.get("event") == "listening":
                    self.port = ev["port"]
                    got.set()
            got.set()

        threading.Thread(target=read, daemon=True).start()
        got.wait(30)
        if self.port is None:
            raise RuntimeError("serve did not start")

    def events(self, name):
        with self.lock:
            return [e for e in self.lines if e.get("event") == name]

    def request(self, method, path, body=None, headers=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read(), dict((k.lower(), v) for k, v in r.getheaders())
        finally:
            c.close()

    def run(self, fields):
        body = {"mode": "host", "capabilities": dict(CAPS)}
        body.update(fields)
        st, raw, _ = self.request("POST", "/run", json.dumps(body).encode(), {ADMISSION: SECRET,
                                                                               "content-type": "application/json"})
        return st, json.loads(raw)

    def metrics(self):
        st, raw, _ = self.request("GET", "/metrics", headers={ADMISSION: SECRET})
        check(st == 200, "metrics", st)
        out = {}
        for line in raw.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def connect(self):
        s = socket.create_connection(("127.0.0.1", self.port))
        s.settimeout(30)
        return s

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


def read_all(s):
    """Everything the server sends until it closes the connection (a reset after the answer counts as closed)."""
    out = b""
    while True:
        try:
            b = s.recv(65536)
        except ConnectionResetError:
            break
        if not b:
            break
        out += b
    s.close()
    return out


def parse(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head.decode("latin-1").lower(), body


def wait_for(cond, what, timeout=20):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            check(False, "waited for " + what)
        time.sleep(0.05)


broker = Broker()
S = Serve(broker.url)


def bindings():
    return {"url": broker.url, "token": "opaque-token"}


# ---- what a guest and a host written for upstream see ----

UPSTREAM_TEXT = {
    "bad_method": "invalid sandbox binding method",
    "bad_args": "invalid sandbox binding arguments",
    "unauthorized": "sandbox binding authorization failed",
    "forbidden": "sandbox binding operation forbidden",
    "not_implemented": "sandbox binding operation unavailable",
    "execution_error": "sandbox binding operation failed",
    "rate_limited": "sandbox binding operation failed",  # ours: upstream maps unknown codes to execution_error
    "unavailable": "sandbox binding operation failed",
}


def t_run_errors():
    for code, text in UPSTREAM_TEXT.items():
        n = len(S.events("run"))
        # the guest catches the error and returns: the run still ends with it (upstream's latch)
        st, o = S.run({"source": "export default async () => { try { await questpie.collections['fail-%s'].find({}); } "
                                 "catch (e) {} return 1; }" % code, "bindings": bindings()})
        check(st == 200 and o["ok"] is False and o["error"] == text and o["logs"] == [], "upstream's text for " + code, o)
        check("detail" not in o and "reason for" not in json.dumps(o) and "cid-" not in json.dumps(o),
              "no detail in the answer", o)
        wait_for(lambda: len(S.events("run")) > n, "the run line")
        ev = S.events("run")[-1]
        check(ev.get("detail") == "binding call collections.fail-%s.find failed: %s: reason for %s, naming "
              "collections.secret_table (correlationId cid-%s)" % (code, code, code, code),
              "the run's log line has method, code, reason and correlation id", ev)


def t_value_shapes():
    broker.reset()
    st, o = S.run({"source": "export default async () => ({ read: await questpie.files.read({ path: 'a.txt' }), "
                             "one: await questpie.collections.posts.findOne({}) })", "bindings": bindings()})
    check(st == 200 and o["ok"], "run ok", o)
    check(o["output"]["read"] == {"path": "a.txt", "size": 5, "mimeType": "text/plain",
                                  "contentBase64": base64.b64encode(b"hello").decode()},
          "files.read is the JSON route's shape", o["output"])
    check(o["output"]["one"] == {"id": 1, "blob": base64.b64encode(b"\x00\xff").decode(), "nested": ["YWI="],
                                 "big": 2 ** 60},
          "bytes anywhere are base64 text, as the JSON route writes them; big integers numbers", o["output"])
    st, o = S.run({"source": "export default async () => typeof (await questpie.collections.posts.findOne({})).big",
                   "bindings": bindings()})
    check(o.get("output") == "number", "an integer beyond 2^53 is a number, as after JSON.parse", o)
    st, o = S.run({"source": "export default async () => { const r = await questpie.files.read({ path: 'a.txt' }); "
                             "return [typeof r.content, atob(r.contentBase64)]; }", "bindings": bindings()})
    check(o.get("output") == ["undefined", "hello"], "a guest written for upstream decodes contentBase64", o)


def t_store_sugar():
    broker.reset()
    src = """export default async () => {
      const s = questpie.store.notes;
      await s.create({ key: "k1", data: { v: 1 } });
      await s.find({ where: { key: "k1" }, limit: 5 });
      await s.findOne();
      await s.update({ where: { key: "k1", store: "other" }, data: { v: 2 } });
      await s.delete({ where: { key: "k1" } });
      return 1;
    }"""
    st, o = S.run({"source": src, "bindings": bindings()})
    check(st == 200 and o["ok"], "store sugar run ok", o)
    got = [(c["method"], c.get("args")) for c in broker.calls]
    want = [
        ("collections.document_store.create", {"key": "k1", "data": {"v": 1}, "store": "notes"}),
        ("collections.document_store.find", {"where": {"key": "k1", "store": "notes"}, "limit": 5}),
        ("collections.document_store.findOne", {"where": {"store": "notes"}}),
        ("collections.document_store.update", {"where": {"key": "k1", "store": "notes"}, "data": {"v": 2}}),
        ("collections.document_store.delete", {"where": {"key": "k1", "store": "notes"}}),
    ]
    check(got == want, "each store operation is upstream's collections.document_store call", got)


def t_not_found_body():
    for method, path in (("GET", "/nope"), ("POST", "/run/x"), ("GET", "/run")):
        st, raw, h = S.request(method, path, b"{}" if method == "POST" else None, {ADMISSION: SECRET})
        check(st == 404 and raw == b'{"ok":false,"error":"not found"}' and h["content-type"] == "application/json",
              "404 body byte for byte for %s %s" % (method, path), st, raw)


def t_bindings_url_not_a_url():
    broker.reset()
    for url in ("not a url", "", "127.0.0.1:9/x", "//host/x"):
        st, o = S.run({"source": "export default () => 1", "bindings": {"url": url, "token": "t"}})
        check(st == 200 and o == {"ok": False, "error": "bindings rejected: bindings.url is not a valid URL: " + url,
                                  "logs": [], "ms": o.get("ms")}, "200 bindings rejected for %r" % url, st, o)
    check(broker.calls == [], "nothing reached the broker")


def t_output_limit():
    st, o = S.run({"source": "export default () => 'x'.repeat(1100000)"})
    check(st == 200 and o["ok"] is False and o["error"] == "sandbox output limit exceeded", "upstream's message", o)


# ---- an HTTP service under attack ----

def t_admission_before_body():
    m0 = S.metrics()
    s = S.connect()
    # the head announces 1 MB; not a byte of it is sent, and the refusal comes anyway
    s.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n")
    st, head, body = parse(read_all(s))
    check(st == 403 and json.loads(body) == DENIED and "connection: close" in head, "403 before the body", st, head, body)
    for bad in ("x" * len(SECRET), SECRET[:-1]):
        s = S.connect()
        s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\n%s: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % (ADMISSION, bad)).encode())
        st, head, body = parse(read_all(s))
        check(st == 403 and json.loads(body) == DENIED, "403 for a wrong secret, chunked, before the body", st, body)
    m1 = S.metrics()
    check(m1['sb_serve_refused_total{refusal="admission"}'] - m0['sb_serve_refused_total{refusal="admission"}'] == 3,
          "counted as admission refusals", m1)
    check(m1['sb_serve_runs_total{outcome="denied"}'] - m0['sb_serve_runs_total{outcome="denied"}'] == 3,
          "and as denied runs", m1)
    # without a body, upstream's order stands: the JSON (400) before the admission (403)
    st, raw, _ = S.request("POST", "/run", b"", {})
    check(st == 400 and json.loads(raw) == {"ok": False, "error": "invalid JSON body", "logs": []}, "empty body", st, raw)


def t_body_cap_json():
    # Content-Length over the cap: 413 from the head alone, admitted or not
    for adm in (True, False):
        s = S.connect()
        s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n" % (
            "%s: %s\r\n" % (ADMISSION, SECRET) if adm else "", 2 * 1024 * 1024 + 1)).encode())
        st, head, body = parse(read_all(s))
        check(st == 413 and json.loads(body) == TOO_LARGE and "application/json" in head, "413 JSON, Content-Length", st, body)
    # chunked, exactly the cap: read, and answered as upstream answers a body that is no host request
    s = S.connect()
    body = b'"' + b"x" * (2 * 1024 * 1024 - 2) + b'"'
    s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\n%s: %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               % (ADMISSION, SECRET)).encode())
    for i in range(0, len(body), 65536):
        c = body[i:i + 65536]
        s.sendall(b"%x\r\n" % len(c) + c + b"\r\n")
    s.sendall(b"0\r\n\r\n")
    st, head, raw = parse(read_all(s))
    check(st == 403 and json.loads(raw) == DENIED, "a chunked body of exactly 2 MiB is read", st, raw)
    # chunked: just over the cap (the handler) and far over it (h2o's own limit): the same JSON answer
    for size in (2 * 1024 * 1024 + 65536, 4 * 1024 * 1024):
        s = S.connect()
        s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\n%s: %s\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                   % (ADMISSION, SECRET)).encode())
        chunk = b"10000\r\n" + b"x" * 65536 + b"\r\n"
        try:
            for _ in range(size // 65536):
                s.sendall(chunk)
            s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while still sending: the answer is already waiting
        st, head, body = parse(read_all(s))
        check(st == 413 and json.loads(body) == TOO_LARGE and "application/json" in head, "413 JSON, chunked %d" % size,
              st, head, body)


def t_ambiguous_framing():
    m0 = S.metrics()
    heads = [
        "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\nContent-Length: 2\r\n",
        "Content-Length: 2\r\nContent-Length: 3\r\n",
        "Content-Length: 2\r\nContent-Length: 2\r\n",
        "Content-Length: 2, 2\r\n",
        "Content-Length: +2\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
    ]
    for h in heads:
        s = S.connect()
        # a second request pipelined behind: it must never be answered
        s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\n%s: %s\r\n%s\r\n{}" % (ADMISSION, SECRET, h)).encode() +
                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = read_all(s)
        st, head, body = parse(raw)
        check(st == 400 and json.loads(body) == {"ok": False, "error": "invalid request", "logs": []}
              and "connection: close" in head, "400 for %r" % h, raw)
        check(raw.count(b"HTTP/1.1") == 1, "the connection closed after the refusal: nothing else answered", raw)
    # a later request on an admitted, kept-alive connection is held to the same rules
    for h in heads[:3]:
        s = S.connect()
        s.sendall(("GET /health HTTP/1.1\r\nHost: x\r\n%s: %s\r\n\r\n" % (ADMISSION, SECRET)).encode())
        first = b""
        while not first.rstrip().endswith(b"}"):
            first += s.recv(65536)
        check(first.startswith(b"HTTP/1.1 200") and b"connection: close" not in first.lower(), "admitted: kept alive", first)
        # a body h2o can read as it frames it, so that the handler sees the request
        body = "2\r\n{}\r\n0\r\n\r\n" if "chunked" in h else "{}"
        s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\n%s: %s\r\n%s\r\n%s" % (ADMISSION, SECRET, h, body)).encode() +
                  b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = read_all(s)
        st, head, body = parse(raw)
        check(st == 400 and json.loads(body) == {"ok": False, "error": "invalid request", "logs": []}
              and "connection: close" in head and raw.count(b"HTTP/1.1") == 1, "later request: 400 for %r, closed" % h, raw)
    # h2o's own refusal of a later request (broken chunked encoding) has the same JSON shape
    s = S.connect()
    s.sendall(("GET /health HTTP/1.1\r\nHost: x\r\n%s: %s\r\n\r\n" % (ADMISSION, SECRET)).encode())
    first = b""
    while not first.rstrip().endswith(b"}"):
        first += s.recv(65536)
    s.sendall(("POST /run HTTP/1.1\r\nHost: x\r\n%s: %s\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" % (ADMISSION, SECRET))
              .encode())
    st, head, body = parse(read_all(s))
    check(st == 400 and json.loads(body) == {"ok": False, "error": "invalid request", "logs": []}
          and "application/json" in head, "h2o's plain-text 400 in our JSON shape", st, head, body)
    m1 = S.metrics()
    check(m1['sb_serve_refused_total{refusal="framing"}'] - m0['sb_serve_refused_total{refusal="framing"}'] == len(heads) + 3,
          "counted", m1)


def t_silent_connections():
    m0 = S.metrics()
    s = S.connect()
    s.settimeout(8)  # below h2o's own 10 s: the gate closed it
    check(read_all(s) == b"", "a silent connection is closed without an answer")
    s = S.connect()
    s.settimeout(8)
    s.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    check(read_all(s) == b"", "a head that never ends is closed")
    m1 = S.metrics()
    check(m1['sb_serve_refused_total{refusal="head_timeout"}'] - m0['sb_serve_refused_total{refusal="head_timeout"}'] == 2,
          "counted", m1)


def t_slots_for_admitted():
    m0 = S.metrics()
    # an admitted keep-alive connection
    keep = http.client.HTTPConnection("127.0.0.1", S.port, timeout=30)
    keep.request("GET", "/health", headers={ADMISSION: SECRET})
    r = keep.getresponse()
    r.read()
    check(r.status == 200 and r.getheader("connection", "").lower() != "close", "admitted: kept alive", r.getheaders())
    # strangers take every slot they may, and more: the oldest give way; they never take the admitted one
    silent = [S.connect() for _ in range(MAX_CONNECTIONS * 2)]
    time.sleep(0.3)
    keep.request("GET", "/health", headers={ADMISSION: SECRET})
    r = keep.getresponse()
    r.read()
    check(r.status == 200, "the admitted connection still serves", r.status)
    st, o = S.run({"source": "export default () => 7"})
    check(st == 200 and o.get("output") == 7, "a new admitted client still gets a run", st, o)
    m1 = S.metrics()
    check(m1['sb_serve_refused_total{refusal="evicted"}'] > m0['sb_serve_refused_total{refusal="evicted"}'],
          "strangers were evicted for newer connections", m1)
    check(m1['sb_serve_connections{state="gated"}'] <= MAX_CONNECTIONS * 3 // 4, "at most their share", m1)
    for c in silent:
        c.close()
    # refused connections that never close count in the strangers' share too: a crowd of them (each answered
    # 400, each kept open by its client) does not keep a new admitted client out
    refused = []
    for _ in range(MAX_CONNECTIONS):
        c = S.connect()
        c.sendall(b"X\r\n\r\n")
        c.settimeout(5)
        check(c.recv(12) == b"HTTP/1.1 400", "refused, and left open by its client")
        refused.append(c)
    st, o = S.run({"source": "export default () => 8"})
    check(st == 200 and o.get("output") == 8, "a new admitted client gets a run past refused connections", st, o)
    for c in refused:
        c.close()
    # an unadmitted request without a body is answered once, and its connection closes
    s = S.connect()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = read_all(s)
    check(raw.count(b"HTTP/1.1 200") == 1 and b"connection: close" in raw.lower(), "one answer, then closed", raw)
    keep.close()


def t_refusal_log_budget():
    time.sleep(1.1)  # a fresh interval for the budget
    m0 = S.metrics()
    n0 = len([e for e in S.events("run") if e.get("refusal") == "admission"])
    sup0 = len(S.events("refusals.suppressed"))
    for _ in range(100):
        s = S.connect()
        s.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789")
        read_all(s)
    m1 = S.metrics()
    check(m1['sb_serve_runs_total{outcome="denied"}'] - m0['sb_serve_runs_total{outcome="denied"}'] == 100,
          "every refusal is counted", m1)
    wait_for(lambda: len(S.events("refusals.suppressed")) > sup0, "the summary line", 10)
    logged = len([e for e in S.events("run") if e.get("refusal") == "admission"]) - n0
    summaries = S.events("refusals.suppressed")[sup0:]
    suppressed = sum(e["suppressed"] for e in summaries)
    check(logged < 100 and logged + suppressed >= 100 - 20, "lines capped, the rest summarised", logged, summaries)
    check(m1["sb_serve_refusal_log_suppressed_total"] - m0["sb_serve_refusal_log_suppressed_total"] == 100 - logged,
          "suppressed lines counted", m1)
    check(all(e["level"] == "warn" and e["intervalMs"] == 1000 for e in summaries), "summary fields", summaries)


tap.case("run errors: upstream's fixed text per broker code; the detail in the log line only", t_run_errors)
tap.case("values: files.read contentBase64, bytes as base64 text", t_value_shapes)
tap.case("store sugar: collections.document_store.* exactly as upstream's guest sends it", t_store_sugar)
tap.case("404 body byte for byte", t_not_found_body)
tap.case("a bindings.url that is no URL: 200 bindings rejected", t_bindings_url_not_a_url)
tap.case("guest output over the cap: sandbox output limit exceeded", t_output_limit)
tap.case("a body without the admission header is refused before it is read", t_admission_before_body)
tap.case("413 is JSON with Content-Length and chunked", t_body_cap_json)
tap.case("ambiguous framing: 400 and the connection closed", t_ambiguous_framing)
tap.case("silent connections are closed", t_silent_connections)
tap.case("a share of the connection slots is kept for admitted connections", t_slots_for_admitted)
tap.case("refusals: counted always, logged within a budget, the rest summarised", t_refusal_log_budget)
rc = S.stop()
check(rc == 0, "serve exits 0")
tap.done()

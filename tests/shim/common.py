"""Shared helpers for the sandbox-shim tests (tests/shim/).

Frames, a tiny TAP-style reporter, a scripted fake broker, the real broker,
and a locator for Deno. Run with Debian's /usr/bin/python3 and python3-msgpack.
"""
import atexit
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SB_SOURCE_DIR", os.path.abspath(os.path.join(HERE, "..", "..")))
BIN_DIR = os.environ.get("SB_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "integration"))
import ports  # noqa: E402  (tests/integration, shared with the broker's fixtures)
SHIM = os.path.join(BIN_DIR, "sandbox-shim")
BROKER = os.path.join(BIN_DIR, "sandbox-broker")
PYTHON = sys.executable or "/usr/bin/python3"
FAKE_GUEST = os.path.join(HERE, "fake_guest.py")
TOKEN = "ab" * 32


def frame(obj):
    payload = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(payload)) + payload


def raw_frame(payload):
    return struct.pack(">I", len(payload)) + payload


class Tap:
    def __init__(self):
        self.n = 0
        self.passed = 0
        self.failed = 0

    def case(self, name, fn):
        self.n += 1
        t0 = time.monotonic()
        try:
            fn()
            self.passed += 1
            print("ok %d - %s (%.2fs)" % (self.n, name, time.monotonic() - t0), flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            self.failed += 1
            print("not ok %d - %s" % (self.n, name), flush=True)
            for line in traceback.format_exception(type(e), e, e.__traceback__):
                for part in line.rstrip().splitlines():
                    print("#   " + part, flush=True)

    def done(self):
        print("1..%d" % self.n)
        print("%d passed, %d failed" % (self.passed, self.failed), flush=True)
        sys.exit(1 if self.failed else 0)


def needs_root(why):
    """True as root. Otherwise the case cannot run here: with SB_TEST_NO_SKIP=1 (tests/run.sh, CI) that
    fails it; without, it says SKIP and the caller returns."""
    if os.geteuid() == 0:
        return True
    if os.environ.get("SB_TEST_NO_SKIP") == "1":
        raise AssertionError("needs root (%s), and SB_TEST_NO_SKIP=1: every case runs here" % why)
    print("# SKIP needs root: %s" % why, flush=True)
    return False


def check(cond, msg, *ctx):
    if not cond:
        raise AssertionError(msg + "".join("\n  " + repr(c) for c in ctx))


def run_shim(args, env_extra=None, token_env=True, timeout=60, pass_fds=(), expect_json=True):
    """Runs the shim; returns (rc, outcome-or-None, stdout, stderr)."""
    env = dict(os.environ)
    if token_env:
        env["SB_TEST_TOKEN"] = TOKEN if token_env is True else token_env
    env.update(env_extra or {})
    p = subprocess.run([SHIM] + args, env=env, capture_output=True, timeout=timeout, pass_fds=pass_fds)
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    outcome = None
    if expect_json and p.returncode == 0:
        lines = out.splitlines()
        check(len(lines) == 1, "shim must print exactly one line", out, err)
        outcome = json.loads(lines[0])
        for k in ("ok", "logs", "ms", "calls"):
            check(k in outcome, "outcome lacks " + k, outcome)
    return p.returncode, outcome, out, err


# ---- scripted fake broker ----

class FakeBroker:
    """An HTTP/1.1 keep-alive server whose behaviour is chosen by the method name:

    services.echo.*       200 {ok:true, value: args}
    services.slow.<ms>    sleeps <ms>, then 200 {ok:true, value: <ms>}
    services.hang.*       sleeps 30 s (per-call timeout tests)
    services.err500.*     500 text/plain "boom" (not msgpack)
    services.redirect.*   302 Location: http://127.0.0.1:9/elsewhere
    services.deny.*       403 {ok:false, error:{code:forbidden, message:nope, correlationId:abc-1}}
    services.weird.*      200 {ok:true} (invalid: no value)
    services.closedelim.notify|bare
                          200 {ok:true, value:"cd"} without Content-Length, ended by closing the
                          connection; under TLS "notify" sends close_notify first, "bare" does not
    anything else         400 bad_method

    With `tls` (a server-side ssl.SSLContext) it speaks HTTPS: each accepted
    connection is wrapped and handshaken in its own thread, and `handshakes`
    records every attempt ({ok, version, sni, error}). `host` picks the
    listening address (default 127.0.0.1; IPv6 addresses work too).
    """

    def __init__(self, tls=None, host="127.0.0.1"):
        self.lock = threading.Lock()
        self.requests = []
        self.peers = set()
        self.handshakes = []
        self.current = 0
        self.max_concurrent = 0
        broker = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                req = msgpack.unpackb(body, raw=False)
                with broker.lock:
                    broker.requests.append({"path": self.path, "headers": dict(self.headers), "body": req})
                    broker.peers.add(self.client_address)
                    broker.current += 1
                    broker.max_concurrent = max(broker.max_concurrent, broker.current)
                try:
                    self.answer(req)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the shim went away (run ended): expected in several tests
                finally:
                    with broker.lock:
                        broker.current -= 1

            def send(self, status, body, ctype="application/msgpack", extra=()):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def answer(self, req):
                m = req.get("method", "")
                parts = m.split(".")
                kind = parts[1] if len(parts) >= 3 and parts[0] == "services" else ""
                ok = lambda v: self.send(200, msgpack.packb({"ok": True, "value": v}, use_bin_type=True))
                if kind == "echo":
                    ok(req.get("args"))
                elif kind == "slow":
                    time.sleep(int(parts[2]) / 1000.0)
                    ok(int(parts[2]))
                elif kind == "hang":
                    time.sleep(30)
                    ok(None)
                elif kind == "err500":
                    self.send(500, b"boom", "text/plain")
                elif kind == "redirect":
                    self.send(302, b"", "text/plain", [("Location", "http://127.0.0.1:9/elsewhere")])
                elif kind == "deny":
                    self.send(403, msgpack.packb({"ok": False, "error": {
                        "code": "forbidden", "message": "nope", "correlationId": "abc-1"}}))
                elif kind == "weird":
                    self.send(200, msgpack.packb({"ok": True}))
                elif kind == "closedelim":
                    self.close_connection = True
                    self.send_response(200)
                    self.send_header("Content-Type", "application/msgpack")
                    self.end_headers()
                    self.wfile.write(msgpack.packb({"ok": True, "value": "cd"}))
                    self.wfile.flush()
                    if isinstance(self.connection, ssl.SSLSocket) and parts[2] == "notify":
                        try:
                            self.connection.unwrap()
                        except (ssl.SSLError, OSError):
                            pass
                else:
                    self.send(400, msgpack.packb({"ok": False, "error": {"code": "bad_method", "message": "unknown"}}))

        seen = threading.local()
        if tls is not None:
            def on_sni(sslobj, name, ctx):
                seen.sni = name
            tls.sni_callback = on_sni

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

            def finish_request(self, request, client_address):
                if tls is None:
                    return super().finish_request(request, client_address)
                # the handshake (and so the SNI callback) runs in this connection's own thread
                seen.sni = None
                request.settimeout(10)
                try:
                    conn = tls.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError) as e:
                    with broker.lock:
                        broker.handshakes.append({"ok": False, "error": str(e), "sni": seen.sni})
                    return
                with broker.lock:
                    broker.handshakes.append({"ok": True, "version": conn.version(), "sni": seen.sni})
                try:
                    super().finish_request(conn, client_address)
                finally:
                    try:
                        conn.close()
                    except OSError:
                        pass

        self.server = Server((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        hostport = ("[%s]" % host if ":" in host else host) + ":%d" % self.port
        self.url = ("https" if tls is not None else "http") + "://" + hostport + "/api/sandbox/rpc"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset(self):
        with self.lock:
            self.requests = []
            self.peers = set()
            self.handshakes = []
            self.max_concurrent = 0

    def close(self):
        self.server.shutdown()
        self.server.server_close()


_HELD = []


def closed_port():
    """A loopback port that refuses connections for the rest of the process (bound, never listening)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return s.getsockname()[1]


def free_port():
    """A loopback TCP port that was free a moment ago, below the ephemeral range (tests/integration/ports.py)."""
    return ports.free_port()


_scenarios = []


def relay_args(url, scenario, *flags):
    """Arguments for a relay run of the fake guest; the scenario goes through a temporary file."""
    fd, path = tempfile.mkstemp(prefix="sb-shim-scenario-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(scenario, f)
    # the jailed guest runs as a uid of its own: it must be able to read its scenario
    os.chmod(path, 0o644)
    _scenarios.append(path)
    return ["relay", "--broker-url", url, "--token-env", "SB_TEST_TOKEN"] + list(flags) + [
        "--", PYTHON, FAKE_GUEST, path]


@atexit.register
def _cleanup_scenarios():
    for p in _scenarios:
        try:
            os.unlink(p)
        except OSError:
            pass


# ---- the real broker ----

class RealBroker:
    SECRET = "test-admin-secret-0123456789"

    def __init__(self, env_extra=None):
        env = dict(os.environ)
        env.update(env_extra or {})
        env.update({
            "SANDBOX_BROKER_ADMIN_SECRET": self.SECRET,
            "SANDBOX_BROKER_LISTEN": "127.0.0.1:0",
            "SANDBOX_BROKER_ADMIN_LISTEN": "127.0.0.1:0",
            "SANDBOX_BROKER_LOG_CALLS": "false",
        })
        self.proc = subprocess.Popen([BROKER], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        self.public = self.admin = None
        deadline = time.monotonic() + 10
        while (self.public is None or self.admin is None) and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "listening":
                if ev.get("listener") == "public":
                    self.public = ev["port"]
                elif ev.get("listener") == "admin":
                    self.admin = ev["port"]
        if self.public is None or self.admin is None:
            self.close()
            raise RuntimeError("broker did not start")
        threading.Thread(target=self._drain, daemon=True).start()
        self.url = "http://127.0.0.1:%d/api/sandbox/rpc" % self.public

    def _drain(self):
        for _ in self.proc.stderr:
            pass

    def mint(self, capabilities, run_id="r", secrets=None):
        req = {"runId": run_id, "capabilities": capabilities}
        if secrets is not None:
            req["secrets"] = secrets
        body = json.dumps(req).encode()
        s = socket.create_connection(("127.0.0.1", self.admin))
        s.sendall(b"POST /admin/v1/tokens HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + self.SECRET.encode() +
                  b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        head, _, payload = data.partition(b"\r\n\r\n")
        check(b" 200 " in head.split(b"\r\n")[0] or b" 201 " in head.split(b"\r\n")[0], "mint failed", data)
        return json.loads(payload)["token"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def find_deno():
    d = os.environ.get("SB_DENO")
    if d and os.access(d, os.X_OK):
        return d
    prefix = os.environ.get("SB_NODE_PREFIX")
    if prefix:
        d = os.path.join(prefix, "node_modules", ".bin", "deno")
        if os.access(d, os.X_OK):
            return d
    return None

"""Shared fixtures for the sandbox-broker integration tests.

Every test file imports this module. It starts the real broker binary on
loopback with port 0, finds the ports from the broker's JSON "listening" log
lines, and offers small helpers for the admin API and the RPC route in both
encodings (JSON and msgpack). Redis servers are started on free loopback
ports when a test needs one.

Environment:
  SB_BIN_DIR     directory holding sandbox-broker (default: <repo>/build/bin)
  SB_SOURCE_DIR  the source root (default: this file's ../..)
  SB_TEST_REDIS_URL  optional redis://127.0.0.1:PORT for the shared-Redis test

Only the standard library and python3-msgpack are used.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import ports

try:
    import msgpack
except ImportError:  # pragma: no cover - reported clearly instead of a traceback in every file
    sys.stderr.write("python3-msgpack is required: apt-get install -y python3-msgpack\n")
    raise

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("SB_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
BIN_DIR = os.environ.get("SB_BIN_DIR") or os.path.join(SOURCE_DIR, "build", "bin")
if not os.path.isabs(BIN_DIR):
    BIN_DIR = os.path.join(SOURCE_DIR, BIN_DIR)
BROKER_BIN = os.path.join(BIN_DIR, "sandbox-broker")

ADMIN_SECRET = "integration-test-admin-secret-0123456789"
RPC_PATH = "/api/sandbox/rpc"
TOKEN_HEADER = "x-questpie-sandbox-token"

# upstream wire budgets (PROTOCOL.md section 8)
NATIVE_REQUEST_CAP = 65536
HTTP_WIRE_CAP = 7121580

MSG_UNAUTHORIZED = "invalid or expired sandbox token"
MSG_TOO_LARGE = "sandbox broker request body is too large"

MISSING = object()


_HELD = []


def closed_port(family=socket.AF_INET, host="127.0.0.1"):
    """A loopback port that refuses connections for the rest of the process: bound, never listening,
    so no other test (or process) can start a server on it in the meantime."""
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    _HELD.append(s)
    return s.getsockname()[1]


def free_port():
    """A loopback TCP port that was free a moment ago, below the ephemeral range (ports.py)."""
    return ports.free_port()


def base_env(extra=None, secret=ADMIN_SECRET):
    """The process environment without any SANDBOX_BROKER_* leaking in from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_BROKER_")}
    if secret is not None:
        env["SANDBOX_BROKER_ADMIN_SECRET"] = secret
    env["SANDBOX_BROKER_LISTEN"] = "127.0.0.1:0"
    env["SANDBOX_BROKER_ADMIN_LISTEN"] = "127.0.0.1:0"
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_broker_once(args, env, timeout=20):
    """Runs the broker to completion (e.g. --check-config or a failing start); returns (rc, stdout, stderr)."""
    p = subprocess.run([BROKER_BIN] + list(args), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def decode_body(ctype, raw):
    ctype = (ctype or "").split(";")[0].strip().lower()
    if raw == b"":
        return None
    if ctype == "application/msgpack":
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    if ctype == "application/json":
        return json.loads(raw.decode("utf-8"))
    return raw


class Response:
    """status, parsed body, headers (lower-cased names), raw bytes."""

    def __init__(self, status, headers, raw):
        self.status = status
        self.headers = headers
        self.raw = raw
        self.body = decode_body(headers.get("content-type"), raw)

    def __iter__(self):  # allows: status, body, headers = rpc(...)
        return iter((self.status, self.body, self.headers))

    def __repr__(self):
        return "Response(%d, %r)" % (self.status, self.raw[:300])


def http_request(port, method, path, body=None, headers=None, timeout=10.0):
    """One request on a fresh loopback connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if body is not None and not any(k.lower() == "content-length" for k in hdrs):
            hdrs["Content-Length"] = str(len(body))
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        raw = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, raw)
    finally:
        conn.close()


class Broker:
    """One sandbox-broker process on loopback, port 0."""

    def __init__(self, env=None, config=None, args=(), secret=ADMIN_SECRET, start_timeout=20.0, wrapper=()):
        self.extra_env = dict(env or {})
        self.wrapper = list(wrapper)  # a command that runs the broker, e.g. unitjail.py UNIT --
        self.config = config
        self.args = list(args)
        self.secret = secret
        self.start_timeout = start_timeout
        self.proc = None
        self.lines = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._reader = None
        self.port = None
        self.admin_port = None
        self._tmpdir = None

    # --- life cycle ---

    def start(self):
        args = list(self.args)
        if self.config is not None:
            self._tmpdir = tempfile.mkdtemp(prefix="sbtest-")
            path = os.path.join(self._tmpdir, "config.json")
            with open(path, "w") as f:
                json.dump(self.config, f)
            args = ["--config", path] + args
        env = base_env(self.extra_env, secret=self.secret)
        self.proc = subprocess.Popen(self.wrapper + [BROKER_BIN] + args, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.start_timeout
        with self._cond:
            while True:
                ports = self._listening_ports()
                if "public" in ports and "admin" in ports:
                    self.port, self.admin_port = ports["public"], ports["admin"]
                    break
                # the lock is held here (it is not reentrant): read the lines directly, not through log()
                if self.proc.poll() is not None and self._reader_done:
                    raise RuntimeError("broker exited with %s before listening:\n%s" % (self.proc.returncode, "".join(self.lines)))
                left = deadline - time.monotonic()
                if left <= 0:
                    self.proc.kill()
                    raise RuntimeError("broker did not report both listeners in time:\n%s" % "".join(self.lines))
                self._cond.wait(min(left, 0.1))
        return self

    _reader_done = False

    _last_line_at = 0.0

    def _read_stderr(self):
        for line in iter(self.proc.stderr.readline, b""):
            with self._cond:
                self.lines.append(line.decode("utf-8", "replace"))
                self._last_line_at = time.monotonic()
                self._cond.notify_all()
        with self._cond:
            self._reader_done = True
            self._cond.notify_all()

    def _listening_ports(self):
        ports = {}
        for ev in self._events_locked():
            if ev.get("event") == "listening":
                ports[ev.get("listener")] = ev.get("port")
        return ports

    def _events_locked(self):
        out = []
        for line in self.lines:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def _settle(self, quiet=0.03, cap=0.5):
        """Waits `quiet` seconds, then until no log line arrived for that long (at most `cap`): a
        worker writes its lines once per loop pass, just after the answers of that pass, so a line
        can trail the reply the test has already read."""
        deadline = time.monotonic() + cap
        time.sleep(quiet)
        while not self._reader_done and time.monotonic() < deadline:
            with self._lock:
                since = time.monotonic() - self._last_line_at
            if since >= quiet:
                return
            time.sleep(quiet - since)

    def events(self):
        self._settle()
        with self._lock:
            return self._events_locked()

    def log(self):
        self._settle()
        with self._lock:
            return "".join(self.lines)

    def wait_for_event(self, name, timeout=10.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self._events_locked():
                    if ev.get("event") == name:
                        return ev
                left = deadline - time.monotonic()
                if left <= 0 or self._reader_done:
                    return None
                self._cond.wait(min(left, 0.1))

    def wait_store_up(self, workers, timeout=10.0):
        """Waits until `workers` "redis.up" lines were logged (one per worker connection)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                n = sum(1 for ev in self._events_locked() if ev.get("event") == "redis.up")
                if n >= workers:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._reader_done:
                    return False
                self._cond.wait(min(left, 0.1))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=30.0):
        """Sends sig and waits; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("broker did not exit within %.0fs after signal %d:\n%s" % (timeout, sig, self.log()))
        if self._reader is not None:
            self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        return rc

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()

    # --- plain HTTP ---

    def public(self, method, path, body=None, headers=None, timeout=10.0):
        return http_request(self.port, method, path, body, headers, timeout)

    def admin(self, method, path, body=None, secret=MISSING, headers=None, timeout=10.0):
        """An admin request; secret=MISSING uses the broker's secret, None sends no Authorization."""
        hdrs = dict(headers or {})
        if secret is MISSING:
            secret = self.secret
        if secret is not None:
            hdrs["Authorization"] = "Bearer " + secret
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif isinstance(body, str):
            body = body.encode()
        return http_request(self.admin_port, method, path, body, hdrs, timeout)

    # --- tokens ---

    def mint(self, run_id="run-1", capabilities=MISSING, **fields):
        """POST /admin/v1/tokens; returns the Response (fields: target, scope, ttlMs, token, ...)."""
        body = {}
        if run_id is not MISSING:
            body["runId"] = run_id
        if capabilities is not MISSING:
            body["capabilities"] = capabilities
        body.update(fields)
        return self.admin("POST", "/admin/v1/tokens", body)

    def mint_ok(self, run_id="run-1", capabilities=MISSING, **fields):
        r = self.mint(run_id, capabilities, **fields)
        if r.status != 201:
            raise AssertionError("mint failed: %r" % (r,))
        return r.body["token"]

    def revoke_token(self, token):
        return self.admin("DELETE", "/admin/v1/tokens/" + token)

    def revoke_run(self, run_id):
        from urllib.parse import quote
        return self.admin("DELETE", "/admin/v1/runs/" + quote(run_id, safe=""))

    # --- RPC ---

    def rpc(self, token, method=MISSING, args=MISSING, enc="json", body=MISSING, content_type=MISSING, headers=None,
            http_method="POST", path=RPC_PATH, timeout=10.0):
        """POST the RPC route. body=MISSING builds {method, args} in enc ("json" or "msgpack");
        body=bytes sends those bytes verbatim. Returns a Response (iterable as status, body, headers)."""
        hdrs = dict(headers or {})
        if token is not None:
            hdrs[TOKEN_HEADER] = token
        if content_type is MISSING:
            content_type = "application/msgpack" if enc == "msgpack" else "application/json"
        if content_type is not None:
            hdrs["Content-Type"] = content_type
        if body is MISSING:
            obj = {}
            if method is not MISSING:
                obj["method"] = method
            if args is not MISSING:
                obj["args"] = args
            body = encode(obj, enc)
        return http_request(self.port, http_method, path, body, hdrs, timeout)


def encode(obj, enc):
    if enc == "msgpack":
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj, separators=(",", ":")).encode()


def content_type_of(enc):
    return "application/msgpack" if enc == "msgpack" else "application/json"


class RedisServer:
    """A throwaway redis-server on a free loopback port (no persistence)."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.proc = None

    @property
    def url(self):
        return "redis://127.0.0.1:%d" % self.port

    def start(self, timeout=10.0):
        exe = shutil.which("redis-server")
        if exe is None:
            raise unittest.SkipTest("redis-server is not installed")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                      "no", "--daemonize", "no", "--protected-mode", "yes"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited with %s" % self.proc.returncode)
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer PING on port %d" % self.port)

    def ping(self):
        return redis_ping(self.port)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class DelayProxy:
    """A loopback TCP proxy that delays every chunk flowing back from the target by `delay` seconds
    (a slow Redis, for instance). `delay` may be changed while the proxy runs: each chunk reads it."""

    def __init__(self, target_port, delay):
        self.target_port = target_port
        self.delay = delay
        self.ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.socks = []
        self.evalsha = 0  # EVALSHA commands seen on their way to the target
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            self.socks += [c, u]
            threading.Thread(target=self._pump, args=(c, u, 0), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, None), daemon=True).start()

    def _pump(self, src, dst, delay):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                wait = self.delay if delay is None else delay
                if wait:
                    time.sleep(wait)
                if delay is not None:
                    self.evalsha += data.count(b"EVALSHA")
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.ls.close()
        for s in self.socks:
            s.close()


def redis_command(port, *args, host="127.0.0.1", timeout=5.0):
    """One RESP2 command on a fresh connection; returns the decoded reply (errors raise RuntimeError)."""
    req = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        req += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(req)
        f = s.makefile("rb")
        return _resp_read(f)


def _resp_read(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise RuntimeError("short RESP reply")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        if n < 0:
            return None
        return [_resp_read(f) for _ in range(n)]
    raise RuntimeError("unknown RESP type %r" % kind)


def redis_ping(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def poll(fn, timeout, interval=0.05):
    """Calls fn until it returns a truthy value or timeout passes; returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


class BrokerTestCase(unittest.TestCase):
    """Assertion helpers shared by the test files."""

    maxDiff = None

    def assertError(self, resp, status, code, message=MISSING, enc=None):
        self.assertEqual(resp.status, status, resp)
        body = resp.body
        self.assertIsInstance(body, dict, resp)
        self.assertIs(body.get("ok"), False, resp)
        err = body.get("error")
        self.assertIsInstance(err, dict, resp)
        self.assertEqual(err.get("code"), code, resp)
        if message is not MISSING:
            self.assertEqual(err.get("message"), message, resp)
        if code != "execution_error":
            self.assertEqual(set(err.keys()), {"code", "message"}, resp)
        self.assertEqual(set(body.keys()), {"ok", "error"}, resp)
        if enc is not None:
            self.assertEqual(resp.headers.get("content-type"), content_type_of(enc), resp)


def main():
    """unittest.main, except that with SB_TEST_NO_SKIP set (tests/run.sh, CI) a skipped test fails the module:
    a test that skips itself in CI proves nothing."""
    prog = unittest.main(verbosity=2, exit=False)
    result = prog.result
    if os.environ.get("SB_TEST_NO_SKIP") and result.skipped:
        for test, why in result.skipped:
            print("SKIPPED IN CI: %s: %s" % (test, why), file=sys.stderr)
        print("SB_TEST_NO_SKIP is set: %d skipped test(s) fail the run" % len(result.skipped), file=sys.stderr)
        sys.exit(1)
    sys.exit(0 if result.wasSuccessful() else 1)

#!/usr/bin/python3
"""http.fetch through the real broker (issue 4): DNS-pinned, per-hop revalidated egress.

Everything the broker connects to here is on loopback: dnsmasq (fetchfix_dns) maps the test names
to 127.0.0.1 (which the test config puts in egress.allow_cidrs, with 127.0.0.3 where nothing ever
listens, for the connect-fallback test) or to addresses that must be refused before any connect;
the upstreams (fetchfix_upstream) are Python HTTP and TLS
servers on 127.0.0.1. Public and private addresses are only ever judged through the decision path:
`sandbox-broker egress-check` (which never connects), and the fetch RPCs whose answers include a
non-loopback address are preceded by an egress-check guard that must say "deny" first, so a policy
regression fails the test instead of making the broker connect off the host.

The operator-facing reasons of execution_error are read from the broker's JSON log lines
("egress.failed", "egress.decision", "egress.response" and the "rpc" line of the correlation id).
"""

import base64
import hashlib
import json
import os
import re
import socket
import ssl
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import msgpack  # noqa: E402
import sbtest  # noqa: E402
from fetchfix_dns import Dnsmasq, FakeDns  # noqa: E402
from fetchfix_upstream import TestPki, Tripwire, Upstream  # noqa: E402

ENCODINGS = ("json", "msgpack")
EXEC_MSG = "sandbox binding operation failed"
BODY_CAP = 5242880
DEADLINE_MS = 3000
LOOPBACK_ALLOWED = "127.0.0.1=allow(operator allow_cidrs)"

HOST_RECORDS = [
    "ok.test,127.0.0.1",
    "ok2.test,127.0.0.1",
    "sub.ok.test,127.0.0.1",
    "tls.test,127.0.0.1",
    "other.test,127.0.0.1",
    "mixed.test,127.0.0.1",
    "mixed.test,10.0.0.5",
    "loop2.test,127.0.0.2",
    "v6only.test,::1",
    "public.test,93.184.216.34",
    "mixed2.test,93.184.216.34",
    "mixed2.test,10.0.0.5",
    "mixed2.test,fd00::1",
    "xn--bcher-kva.test,127.0.0.1",
] + ["many.test,127.0.1.%d" % i for i in range(1, 34)]  # 33 answers: more than the broker reads (32)

# answers dnsmasq will not make by itself, from a FakeDns that dnsmasq forwards *.fake.test to
FAKE_TABLE = {
    ("half.fake.test", "A"): ("addrs", ["127.0.0.1"]),
    ("half.fake.test", "AAAA"): ("rcode", "SERVFAIL"),
    ("refused6.fake.test", "A"): ("addrs", ["127.0.0.1"]),
    ("refused6.fake.test", "AAAA"): ("rcode", "REFUSED"),
    # two allowed addresses in this order: nothing listens on 127.0.0.3, so the broker must go on to 127.0.0.1
    ("fallback.fake.test", "A"): ("addrs", ["127.0.0.3", "127.0.0.1"]),
    ("fallback.fake.test", "AAAA"): ("addrs", []),  # NODATA
    ("slow.fake.test", "A"): ("addrs", ["127.0.0.1"]),
    ("slow.fake.test", "AAAA"): ("drop", None),  # never answered
}
INITIAL_HOSTS = {"rebind.test": ["127.0.0.1"], "stable.test": ["127.0.0.1"]}

# module fixtures, set up once (setUpModule) and shared by every class
DNS = None
FAKE = None
PROXY_TRIP = None
PKI = None
B = None
UP = {}  # name -> Upstream
CONFIG = None
CONFIG_PATH = None
_TMP = None


def _egress_config():
    # 127.0.0.3 is only there for the connect-fallback test (nothing ever listens on it)
    return {"egress": {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32", "127.0.0.3/32"],
                       "deny_local_interfaces": False,
                       "ca_file": PKI.ca_file, "deadline_ms": DEADLINE_MS, "connect_timeout_ms": 1000}}


def setUpModule():
    global DNS, FAKE, PROXY_TRIP, PKI, B, CONFIG, CONFIG_PATH, _TMP
    try:
        PKI = TestPki().make()
        FAKE = FakeDns(FAKE_TABLE).start()
        DNS = Dnsmasq(HOST_RECORDS, INITIAL_HOSTS, ["--server=/fake.test/127.0.0.1#%d" % FAKE.port]).start()
        PROXY_TRIP = Tripwire("127.0.0.1", 0).start()
        tls_default = PKI.server_context(PKI.tls_leaf)
        UP["a"] = Upstream().start()  # ok.test and friends
        UP["b"] = Upstream().start()  # the second allowlisted origin (ok2.test)
        UP["other"] = Upstream().start()  # other.test: outside every allowlist, must never be contacted
        UP["mixed"] = Upstream().start()  # mixed.test: one private answer, must never be contacted
        UP["tls"] = Upstream(tls=tls_default).start()
        UP["tls12"] = Upstream(tls=PKI.server_context(PKI.tls_leaf, ssl.TLSVersion.TLSv1_2)).start()
        UP["rogue"] = Upstream(tls=PKI.server_context(PKI.rogue_leaf)).start()
        UP["wrong13"] = Upstream(tls=PKI.server_context(PKI.other_leaf, ssl.TLSVersion.TLSv1_3)).start()
        UP["wrong12"] = Upstream(tls=PKI.server_context(PKI.other_leaf, ssl.TLSVersion.TLSv1_2)).start()
        CONFIG = _egress_config()
        _TMP = tempfile.mkdtemp(prefix="sbfetch-")
        CONFIG_PATH = os.path.join(_TMP, "egress.json")
        with open(CONFIG_PATH, "w") as f:
            json.dump(CONFIG, f)
        # proxies in the environment must be ignored: they all point at a listener that only counts
        proxy = "http://127.0.0.1:%d" % PROXY_TRIP.port
        env = {"SANDBOX_BROKER_THREADS": "2", "SANDBOX_BROKER_TOKEN_STORE": "memory"}
        for k in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env[k] = proxy
        env["no_proxy"] = env["NO_PROXY"] = None
        B = sbtest.Broker(config=CONFIG, env=env).start()
    except BaseException:
        _cleanup()
        raise


def _cleanup():
    global B
    errors = []
    if B is not None:
        try:
            rc = B.stop()
            log = B.log()
            if rc != 0:
                errors.append("broker exited with %s:\n%s" % (rc, log[-6000:]))
            for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
                if marker in log:
                    errors.append("sanitizer report in the broker log:\n%s" % log[-12000:])
                    break
        except BaseException as e:  # never leave children behind
            B.kill()
            errors.append(repr(e))
        B = None
    for up in UP.values():
        up.stop()
    UP.clear()
    if DNS is not None:
        DNS.stop()
    if FAKE is not None:
        FAKE.stop()
    if PROXY_TRIP is not None:
        PROXY_TRIP.stop()
    if PKI is not None:
        PKI.cleanup()
    if _TMP is not None:
        import shutil
        shutil.rmtree(_TMP, ignore_errors=True)
    if errors:
        raise AssertionError("\n".join(errors))


def tearDownModule():
    _cleanup()


def b64(data):
    return base64.b64encode(data).decode("ascii")


def egress_check(*args, timeout=20):
    """Runs `sandbox-broker egress-check --config <test config> ARGS...`; returns (rc, stdout, stderr)."""
    rc, out, err = sbtest.run_broker_once(["egress-check", "--config", CONFIG_PATH] + list(args), sbtest.base_env(),
                                          timeout=timeout)
    for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
        if marker in err:
            raise AssertionError("sanitizer report from egress-check %r:\n%s" % (args, err))
    return rc, out, err


class FetchCase(sbtest.BrokerTestCase):
    _n = 0

    def setUp(self):
        for up in UP.values():
            up.reset()

    # --- calls ---

    def token(self, net):
        FetchCase._n += 1
        run = "%s-%d" % (self._testMethodName, FetchCase._n)
        return B.mint_ok(run, {"net": list(net)}), run

    def fetch(self, net, args, enc="json", timeout=20.0):
        tok, run = self.token(net)
        t0 = time.monotonic()
        r = B.rpc(tok, "http.fetch", args, enc=enc, timeout=timeout)
        r.elapsed = time.monotonic() - t0
        r.run = run
        return r

    def guard_denied(self, url, *allow):
        """The decision path must deny url before the fetch path is even tried (see the module docstring)."""
        args = []
        for a in allow:
            args += ["--allow", a]
        rc, out, err = egress_check(*(args + [url]))
        if rc != 1 or "decision: deny" not in out:
            self.fail("egress-check does not deny %s (rc %s); refusing to let the broker try it:\n%s%s" % (url, rc, out, err))

    # --- log lines ---

    def events(self, run, name):
        return [e for e in B.events() if e.get("event") == name and e.get("runId") == run]

    def wait_events(self, run, name, count=1, timeout=5.0):
        evs = sbtest.poll(lambda: len(self.events(run, name)) >= count, timeout)
        return self.events(run, name) if evs else self.events(run, name)

    def one_event(self, run, name):
        evs = self.wait_events(run, name)
        self.assertEqual(len(evs), 1, "expected one %s line for %s, got %r\n%s" % (name, run, evs, B.log()[-3000:]))
        return evs[0]

    def decisions(self, run, count):
        evs = self.wait_events(run, "egress.decision", count)
        time.sleep(0.05)
        evs = self.events(run, "egress.decision")
        self.assertEqual(len(evs), count, evs)
        return [(e.get("hop"), e.get("host"), e.get("answers"), e.get("decision")) for e in evs]

    # --- assertions ---

    def assertFetched(self, r, enc):
        """A successful reply; returns (value, body bytes)."""
        if r.status != 200:
            self.fail("fetch failed: %r; broker reasons: %r" % (r, [e.get("reason") for e in B.events()
                                                                    if e.get("runId") == getattr(r, "run", None)
                                                                    and "reason" in e]))
        self.assertEqual(r.headers.get("content-type"), sbtest.content_type_of(enc), r)
        self.assertIsInstance(r.body, dict, r)
        self.assertEqual(set(r.body), {"ok", "value"}, r)
        self.assertIs(r.body["ok"], True, r)
        v = r.body["value"]
        body_key = "body" if enc == "msgpack" else "bodyBase64"
        self.assertEqual(set(v), {"status", "statusText", "headers", body_key, "truncated"}, v)
        self.assertIs(v["truncated"], False)
        self.assertIsInstance(v["status"], int)
        self.assertIsInstance(v["statusText"], str)
        self.assertIsInstance(v["headers"], dict)
        if enc == "msgpack":
            self.assertIsInstance(v["body"], bytes)
            body = v["body"]
        else:
            self.assertIsInstance(v["bodyBase64"], str)
            body = base64.b64decode(v["bodyBase64"], validate=True)
        return v, body

    def assertExecError(self, r, enc="json"):
        """execution_error on the wire (redacted), with the reason in the log; returns the egress.failed reason."""
        self.assertError(r, 500, "execution_error", EXEC_MSG, enc=enc)
        err = r.body["error"]
        self.assertEqual(set(err), {"code", "message", "correlationId"}, r)
        cid = err["correlationId"]
        self.assertIsInstance(cid, str)
        self.assertRegex(cid, r"^[\w-]{1,128}$")
        ev = self.one_event(r.run, "egress.failed")
        reason = ev.get("reason")
        self.assertIsInstance(reason, str)
        self.assertEqual(ev.get("cid"), cid, "egress.failed carries the call's correlation id")
        # the log lines reach us through a reader thread: wait for the call's own line too
        rpc_lines = sbtest.poll(lambda: [e for e in B.events() if e.get("event") == "rpc" and e.get("cid") == cid], 5.0)
        self.assertEqual(len(rpc_lines), 1, rpc_lines)
        self.assertEqual(rpc_lines[0].get("code"), "execution_error")
        self.assertEqual(rpc_lines[0].get("reason"), reason, "the rpc line and egress.failed disagree")
        return reason

    def assertForbidden(self, r, message, enc="json"):
        """The capability check before any I/O: the host is not in net (PROTOCOL.md section 6a)."""
        self.assertError(r, 403, "forbidden", message, enc=enc)

    def assertPolicyDenied(self, r, reason, enc="json"):
        """Decided during the fetch (address or name policy, a redirect leaving net): execution_error, the reason logged only."""
        self.assertEqual(self.assertExecError(r, enc), reason)
        # the guest learns nothing of the address a name resolved to, nor of the rule
        self.assertNotIn(reason.encode(), r.raw)
        self.assertNotIn(b"blocked", r.raw)

    def assertBadArgs(self, r, message, enc="json"):
        self.assertError(r, 400, "bad_args", message, enc=enc)

    def assertNoContact(self, *names, wait=0.2):
        time.sleep(wait)
        for n in names:
            self.assertEqual(UP[n].connections, 0, "upstream %s was contacted: %r" % (n, UP[n].snapshot()))

    def assertQueryPairs(self, name, since, pairs):
        """Exactly `pairs` A and `pairs` AAAA queries for name after the log mark `since`."""
        q = DNS.settled_queries(name, since, 2 * pairs)
        self.assertEqual(sorted(t for t, _ in q), ["A"] * pairs + ["AAAA"] * pairs, "queries for %s: %r" % (name, q))


def url(up, path="/", host="ok.test", scheme="http"):
    return "%s://%s:%d%s" % (scheme, host, UP[up].port, path)


# ================================================================================================================
# 1. a plain GET


class T1Get(FetchCase):
    def test_get_hello_both_encodings(self):
        def hello(h, rec):
            h.reply(200, b"hello, fetch\x00\xff", [("Content-Type", "application/octet-stream"),
                                                    ("Set-Cookie", "a=1; Path=/"), ("X-Mixed-Case", "v"),
                                                    ("Set-Cookie", "b=2"), ("X-Latin", "caf\xe9")],
                    reason="Fine Thanks")

        UP["a"].route("/hello", hello)
        port = UP["a"].port
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                UP["a"].reset()
                mark = DNS.mark()
                r = self.fetch(["ok.test"], {"url": url("a", "/hello?q=1#frag")}, enc)
                v, body = self.assertFetched(r, enc)
                self.assertEqual(v["status"], 200)
                self.assertEqual(v["statusText"], "Fine Thanks")
                self.assertEqual(body, b"hello, fetch\x00\xff")
                self.assertEqual(v["headers"], {"content-type": "application/octet-stream",
                                                "set-cookie": "a=1; Path=/, b=2", "x-mixed-case": "v",
                                                "x-latin": "caf\u00e9", "content-length": "14"})
                reqs = UP["a"].snapshot()
                self.assertEqual(len(reqs), 1, reqs)
                rec = reqs[0]
                self.assertEqual(rec.requestline, "GET /hello?q=1 HTTP/1.1")
                # a GET without a body carries exactly the broker's one header: no "connection: close", the
                # connection may be kept for a later fetch of this run (egress.keepalive_pool_size, on by default)
                self.assertEqual(rec.headers, [("host", "ok.test:%d" % port)])
                self.assertEqual(rec.body, b"")
                self.assertEqual(UP["a"].connections, 1)
                self.assertQueryPairs("ok.test", mark, 1)
                self.assertEqual(self.decisions(r.run, 1), [(0, "ok.test", LOOPBACK_ALLOWED, "allow")])
                resp = self.one_event(r.run, "egress.response")
                self.assertEqual((resp.get("hop"), resp.get("address"), resp.get("status"), resp.get("bytes")),
                                 (0, "127.0.0.1", 200, 14))
                self.assertEqual(self.events(r.run, "egress.failed"), [])

    def test_default_ports_are_left_out_of_host(self):
        ups = []
        try:
            for port, tls in ((80, None), (443, PKI.server_context(PKI.tls_leaf))):
                try:
                    ups.append(Upstream(tls=tls, port=port).start())
                except OSError as e:
                    self.skipTest("cannot listen on 127.0.0.1:%d: %s" % (port, e))
            plain, secure = ups
            self.assertFetched(self.fetch(["ok.test"], {"url": "http://ok.test/x"}), "json")
            self.assertEqual(plain.snapshot()[0].header("host"), "ok.test")
            self.assertFetched(self.fetch(["tls.test"], {"url": "https://tls.test:443/x"}), "json")
            rec = secure.snapshot()[0]
            self.assertEqual((rec.header("host"), rec.sni), ("tls.test", "tls.test"))
        finally:
            for u in ups:
                u.stop()

    def test_request_target_is_canonical(self):
        port = UP["a"].port
        for given, sent in (("/a/b/../c/./d?x=1#frag", "/a/c/d?x=1"),
                            ("/caf\u00e9?q=\u00fc", "/caf%C3%A9?q=%C3%BC"),
                            ("/p%20q?r=%2F", "/p%20q?r=%2F"),
                            ("", "/"),
                            ("?only=query", "/?only=query")):
            with self.subTest(target=given):
                UP["a"].reset()
                self.assertFetched(self.fetch(["ok.test"], {"url": "http://ok.test:%d%s" % (port, given)}), "json")
                self.assertEqual(UP["a"].snapshot()[0].requestline, "GET %s HTTP/1.1" % sent)

    def test_head_request(self):
        UP["a"].route("/hello", lambda h, rec: h.reply(200, b"not sent for HEAD", [("X-H", "1")]))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/hello"), "method": "HEAD"}), "json")
        self.assertEqual((v["status"], body, v["headers"]), (200, b"", {"x-h": "1", "content-length": "17"}))
        self.assertEqual(UP["a"].snapshot()[0].requestline, "HEAD /hello HTTP/1.1")

    def test_status_line_without_reason_and_empty_body(self):
        # RFC 9112 section 4: status-line = HTTP-version SP status-code SP [ reason-phrase ]
        UP["a"].route("/bare", lambda h, rec: h.raw(b"HTTP/1.1 204 \r\nX-A: 1\r\nX-A: 2\r\n\r\n"))
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/bare")}, enc), enc)
                self.assertEqual((v["status"], v["statusText"], body, v["headers"]), (204, "", b"", {"x-a": "1, 2"}))


# ================================================================================================================
# 2. the request the upstream sees, and malformed requests


def echo(h, rec):
    info = {"method": rec.method, "len": len(rec.body), "sha256": hashlib.sha256(rec.body).hexdigest()}
    h.reply(200, json.dumps(info).encode(), [("Content-Type", "application/json")])


class T2Request(FetchCase):
    GUEST_HEADERS = {"Host": "evil.test", "Connection": "keep-alive", "Transfer-Encoding": "chunked",
                     "Content-Length": "999", "Proxy-Authorization": "Basic eDp5", "Proxy-Connection": "keep-alive",
                     "Keep-Alive": "300", "Upgrade": "h2c", "X-Custom": "v1", "Authorization": "Bearer abc",
                     "Content-Type": "application/octet-stream"}
    KEPT = [("x-custom", "v1"), ("authorization", "Bearer abc"), ("content-type", "application/octet-stream")]

    def test_post_body_and_headers(self):
        UP["a"].route("/echo", echo)
        port = UP["a"].port
        payload = b"line1\r\n\x00\x01binary\xff\x00\r\n\r\nGET / HTTP/1.1\r\n"
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                UP["a"].reset()
                args = {"url": url("a", "/echo?x=1"), "method": "post", "headers": self.GUEST_HEADERS}
                if enc == "msgpack":
                    args["body"] = payload  # bin
                else:
                    args["bodyBase64"] = b64(payload)
                v, body = self.assertFetched(self.fetch(["ok.test"], args, enc), enc)
                self.assertEqual(json.loads(body), {"method": "POST", "len": len(payload),
                                                    "sha256": hashlib.sha256(payload).hexdigest()})
                reqs = UP["a"].snapshot()
                self.assertEqual(len(reqs), 1, reqs)
                rec = reqs[0]
                self.assertEqual(rec.requestline, "POST /echo?x=1 HTTP/1.1")
                self.assertEqual(rec.body, payload)
                # a request with a body asks for the close: its connection is never kept (PROTOCOL.md section 6a)
                self.assertEqual(rec.headers[:2], [("host", "ok.test:%d" % port), ("connection", "close")])
                self.assertEqual(sorted(rec.headers[2:]), sorted(self.KEPT + [("content-length", str(len(payload)))]))
                for dropped in ("transfer-encoding", "proxy-authorization", "proxy-connection", "keep-alive", "upgrade"):
                    self.assertNotIn(dropped, rec.names())
                self.assertEqual(rec.header_values("host"), ["ok.test:%d" % port])
                self.assertEqual(rec.header_values("connection"), ["close"])

    def test_empty_and_nil_bodies(self):
        UP["a"].route("/echo", echo)
        for args, method, length in (({"method": "POST", "bodyBase64": ""}, "POST", "0"),
                                     ({"method": "PUT", "bodyBase64": None}, "PUT", "0"),
                                     ({"method": "DELETE"}, "DELETE", None)):
            with self.subTest(args=args):
                UP["a"].reset()
                args = dict(args, url=url("a", "/echo"))
                self.assertFetched(self.fetch(["ok.test"], args), "json")
                rec = UP["a"].snapshot()[0]
                self.assertEqual((rec.method, rec.body), (method, b""))
                self.assertEqual(rec.header_values("content-length"), [length] if length else [])

    def test_header_injection_refused(self):
        for value in ("a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b", "a\x7fb"):
            for enc in ENCODINGS:
                with self.subTest(value=value, enc=enc):
                    r = self.fetch(["ok.test"], {"url": url("a", "/"), "headers": {"X-Evil": value}}, enc)
                    self.assertBadArgs(r, "http.fetch header values must not contain control characters", enc)
        for name in ("X Evil", "X-Evil\r\nX-Injected", "", "X:Evil"):
            with self.subTest(name=name):
                r = self.fetch(["ok.test"], {"url": url("a", "/"), "headers": {name: "v"}})
                self.assertBadArgs(r, "http.fetch header names must be HTTP tokens")
        self.assertNoContact("a")

    def test_header_map_rules(self):
        UP["a"].route("/echo", echo)
        # non-string values are dropped (as upstream does); names are lower-cased
        self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/echo"), "headers": {
            "X-Num": 5, "X-Nil": None, "X-List": ["a"], "X-Ok": "1", "X-UPPER": "Value Kept"}}), "json")
        rec = UP["a"].snapshot()[0]
        self.assertEqual(rec.headers[0], ("host", "ok.test:%d" % UP["a"].port))
        self.assertEqual(rec.headers[1:], [("x-ok", "1"), ("x-upper", "Value Kept")])
        many = {"X-H%02d" % i: "v" for i in range(65)}
        r = self.fetch(["ok.test"], {"url": url("a", "/echo"), "headers": many})
        self.assertBadArgs(r, "http.fetch headers exceed 64 entries or 65536 bytes")
        r = self.fetch(["ok.test"], {"url": url("a", "/echo"), "headers": "X-A: 1"})
        self.assertBadArgs(r, "http.fetch headers must be an object")
        r = self.fetch(["ok.test"], {"url": url("a", "/echo"), "method": "POST", "body": b"a", "bodyBase64": "YQ=="},
                       "msgpack")
        self.assertBadArgs(r, "http.fetch takes body or bodyBase64, not both", "msgpack")
        self.assertEqual(len(UP["a"].snapshot()), 1)

    def test_refused_methods(self):
        for method, shown in (("CONNECT", "CONNECT"), ("connect", "CONNECT"), ("TRACE", "TRACE"), ("Track", "TRACK")):
            with self.subTest(method=method):
                r = self.fetch(["ok.test"], {"url": url("a", "/"), "method": method})
                self.assertBadArgs(r, "http.fetch method %s is not allowed" % shown)
        r = self.fetch(["ok.test"], {"url": url("a", "/"), "method": "GET /x HTTP/1.1\r\n"})
        self.assertBadArgs(r, "http.fetch method must be an HTTP token of at most 32 characters")
        self.assertNoContact("a")

    def test_request_body_cap(self):
        UP["a"].route("/echo", echo)
        over = b"\xab" * (BODY_CAP + 1)
        msg = "http.fetch request body exceeds 5242880-byte cap"
        self.assertBadArgs(self.fetch(["ok.test"], {"url": url("a", "/echo"), "method": "POST",
                                                    "bodyBase64": b64(over)}), msg)
        self.assertBadArgs(self.fetch(["ok.test"], {"url": url("a", "/echo"), "method": "POST", "body": over},
                                      "msgpack"), msg, "msgpack")
        self.assertNoContact("a")
        at = b"\xab" * BODY_CAP
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/echo"), "method": "POST", "body": at},
                                                "msgpack"), "msgpack")
        self.assertEqual(json.loads(body), {"method": "POST", "len": BODY_CAP, "sha256": hashlib.sha256(at).hexdigest()})

    def test_body_base64_must_be_a_string(self):
        for bad in (123, 0, True, [1, 2], {"a": "b"}, "!!!not base64!!!"):
            with self.subTest(bad=bad):
                r = self.fetch(["ok.test"], {"url": url("a", "/echo"), "method": "POST", "bodyBase64": bad})
                self.assertBadArgs(r, "http.fetch bodyBase64 must be a base64 string")
        self.assertNoContact("a")

    def test_invalid_urls(self):
        cases = [
            ("ftp://ok.test/", "unsupported scheme"),
            ("file:///etc/passwd", "unsupported scheme"),
            ("http://user:pw@ok.test/", "userinfo is not allowed"),
            ("http://user@ok.test/", "userinfo is not allowed"),
            ("http://2130706433/", "non-canonical IPv4 address"),
            ("http://0x7f.0.0.1/", "non-canonical IPv4 address"),
            ("http://0177.0.0.1/", "non-canonical IPv4 address"),
            ("http://127.1/", "non-canonical IPv4 address"),
            ("http://0x7f000001/", "non-canonical IPv4 address"),
            ("http://256.0.0.1/", "non-canonical IPv4 address"),
            ("http://127.0.0.01/", "non-canonical IPv4 address"),
            ("http://1.2.3.4.5/", "non-canonical IPv4 address"),
            ("http://ok.test.123/", "non-canonical IPv4 address"),
            ("http://ok.0x1/", "non-canonical IPv4 address"),
            ("http://ok.test\\@evil.test/", "backslash is not allowed"),
            ("http://%6fk.test/", "percent-encoded host is not allowed"),
            ("http://[fe80::1%25eth0]/", "zone id is not allowed"),
            ("http://ok.test:99999/", "invalid port"),
            ("http://ok .test/", "control character or whitespace"),
            ("/relative/path", "not an absolute URL"),
        ]
        for enc in ENCODINGS:
            for u, why in cases:
                with self.subTest(url=u, enc=enc):
                    r = self.fetch(["ok.test", "*.test", "127.0.0.1"], {"url": u}, enc)
                    self.assertBadArgs(r, "http.fetch url is invalid: " + why, enc)
        for bad in (None, 42, ["http://ok.test/"]):
            with self.subTest(url=bad):
                r = self.fetch(["ok.test"], {"url": bad} if bad is not None else {})
                self.assertBadArgs(r, "http.fetch url is invalid: missing or not a string")


# ================================================================================================================
# 3. the net allowlist


class T3Allowlist(FetchCase):
    def test_host_not_in_net(self):
        mark = DNS.mark()
        r = self.fetch(["ok.test"], {"url": url("other", "/", "other.test")})
        self.assertForbidden(r, 'http.fetch host "other.test:%d" is not in the net allowlist' % UP["other"].port)
        self.assertNoContact("other")
        self.assertEqual(DNS.settled_queries(None, mark, 0), [])

    def test_port_must_match(self):
        port = UP["a"].port
        for net in (["ok.test:1"], ["ok.test:80"], ["ok.test:%d" % (port + 1)]):
            with self.subTest(net=net):
                r = self.fetch(net, {"url": url("a", "/")})
                self.assertForbidden(r, 'http.fetch host "ok.test:%d" is not in the net allowlist' % port)
        self.assertNoContact("a")
        self.assertFetched(self.fetch(["ok.test:%d" % port], {"url": url("a", "/")}), "json")

    def test_wildcard_entries(self):
        self.assertFetched(self.fetch(["*.test"], {"url": url("a", "/")}), "json")
        self.assertFetched(self.fetch(["*.ok.test"], {"url": url("a", "/", "sub.ok.test")}), "json")
        self.assertEqual(UP["a"].snapshot()[-1].header("host"), "sub.ok.test:%d" % UP["a"].port)
        # *.suffix is subdomains only: never the apex, never a lookalike
        r = self.fetch(["*.ok.test"], {"url": url("a", "/")})
        self.assertForbidden(r, 'http.fetch host "ok.test:%d" is not in the net allowlist' % UP["a"].port)
        r = self.fetch(["*.k.test"], {"url": url("a", "/")})
        self.assertForbidden(r, 'http.fetch host "ok.test:%d" is not in the net allowlist' % UP["a"].port)
        # wildcard with a port
        self.assertFetched(self.fetch(["*.test:%d" % UP["a"].port], {"url": url("a", "/")}), "json")
        r = self.fetch(["*.test:1"], {"url": url("a", "/")})
        self.assertForbidden(r, 'http.fetch host "ok.test:%d" is not in the net allowlist' % UP["a"].port)
        # case and a trailing dot do not matter
        self.assertFetched(self.fetch(["OK.Test"], {"url": url("a", "/", "Ok.TEST.")}), "json")
        self.assertEqual(UP["a"].snapshot()[-1].header("host"), "ok.test:%d" % UP["a"].port)

    def test_ipv6_entries_match_numerically(self):
        port = UP["a"].port
        for entry in ("[::1]", "[0:0::1]", "[0:0:0:0:0:0:0:1]:%d" % port):
            with self.subTest(entry=entry):
                # the allowlist admits it; the address policy then refuses loopback ::1
                r = self.fetch([entry], {"url": "http://[0::1]:%d/" % port})
                self.assertPolicyDenied(r, "http.fetch address ::1 is blocked (loopback ::1/128)")

    def test_a_second_url_key_cannot_slip_past_the_check(self):
        pk = lambda o: msgpack.packb(o, use_bin_type=True)  # noqa: E731
        tok, run = self.token(["ok.test"])
        for first, second in ((url("a", "/"), url("other", "/", "other.test")),
                              (url("other", "/", "other.test"), url("a", "/"))):
            args = b"\x82" + pk("url") + pk(first) + pk("url") + pk(second)
            body = b"\x82" + pk("method") + pk("http.fetch") + pk("args") + args
            r = B.rpc(tok, body=body, enc="msgpack")
            # the RPC decoder refuses duplicate map keys before authz or http.fetch ever see them
            self.assertBadArgs(r, "invalid msgpack body", "msgpack")
        self.assertNoContact("a", "other")

    def test_no_net_grant(self):
        tok = B.mint_ok("no-net", {})
        r = B.rpc(tok, "http.fetch", {"url": url("a", "/")})
        self.assertForbidden(r, "http.fetch requires a net allowlist")
        self.assertNoContact("a")


# ================================================================================================================
# 4. the address policy, through DNS and through literals


class T4AddressPolicy(FetchCase):
    def test_one_private_answer_rejects_the_name(self):
        u = url("mixed", "/", "mixed.test")
        self.guard_denied(u)
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                r = self.fetch(["mixed.test"], {"url": u}, enc)
                self.assertPolicyDenied(r, 'http.fetch host "mixed.test" resolves to a blocked address 10.0.0.5 '
                                        '(private 10.0.0.0/8)', enc)
                (hop, host, answers, decision), = self.decisions(r.run, 1)
                self.assertEqual((hop, host, decision), (0, "mixed.test", "deny"))
                self.assertEqual(sorted(answers.split(",")), sorted([LOOPBACK_ALLOWED, "10.0.0.5=deny(private 10.0.0.0/8)"]))
                self.assertEqual(self.events(r.run, "egress.response"), [])
        self.assertNoContact("mixed")

    def test_loopback_other_than_the_allowed_address(self):
        wire = Tripwire("127.0.0.2", UP["a"].port).start()
        try:
            r = self.fetch(["loop2.test"], {"url": url("a", "/", "loop2.test")})
            self.assertPolicyDenied(r, 'http.fetch host "loop2.test" resolves to a blocked address 127.0.0.2 '
                                    '(loopback 127.0.0.0/8)')
            self.assertEqual(self.decisions(r.run, 1), [(0, "loop2.test", "127.0.0.2=deny(loopback 127.0.0.0/8)", "deny")])
            time.sleep(0.2)
            self.assertEqual(wire.connections, 0)
        finally:
            wire.stop()
        self.assertNoContact("a")

    def test_aaaa_loopback_only(self):
        mark = DNS.mark()
        wire = Tripwire("::1", UP["a"].port).start()
        try:
            r = self.fetch(["v6only.test"], {"url": url("a", "/", "v6only.test")})
            self.assertPolicyDenied(r, 'http.fetch host "v6only.test" resolves to a blocked address ::1 (loopback ::1/128)')
            time.sleep(0.2)
            self.assertEqual(wire.connections, 0)
        finally:
            wire.stop()
        self.assertQueryPairs("v6only.test", mark, 1)  # NODATA for A is not a failure: the AAAA answer decides

    def test_reserved_names_never_reach_dns(self):
        mark = DNS.mark()
        port = UP["a"].port
        for net, host, rule in ((["localhost"], "localhost", "reserved name localhost"),
                                (["LocalHost"], "LOCALHOST.", "reserved name localhost"),
                                (["*.localhost"], "api.localhost", "reserved name *.localhost"),
                                (["metadata.google.internal"], "metadata.google.internal",
                                 "metadata name metadata.google.internal")):
            with self.subTest(host=host):
                r = self.fetch(net, {"url": "http://%s:%d/" % (host, port)})
                canon = host.lower().rstrip(".")
                self.assertPolicyDenied(r, 'http.fetch host "%s" is blocked (%s)' % (canon, rule))
        time.sleep(0.3)
        logged = DNS.log_lines()[mark:]
        self.assertEqual([l for l in logged if "localhost" in l or "metadata" in l], [])
        self.assertNoContact("a")

    def test_unicode_digits_are_an_address_not_a_name(self):
        # UTS#46 maps fullwidth digits and the ideographic full stop to ASCII: the result is an IPv4 literal
        mark = DNS.mark()
        port = UP["a"].port
        for host in ("\uff11\uff12\uff17.\uff10.\uff10.\uff12", "127\u30020\u30020\u30022"):
            with self.subTest(host=host):
                r = self.fetch(["127.0.0.2"], {"url": "http://%s:%d/" % (host, port)})
                self.assertPolicyDenied(r, "http.fetch address 127.0.0.2 is blocked (loopback 127.0.0.0/8)")
        r = self.fetch(["127.0.0.2"], {"url": "http://\uff10x7f.1:%d/" % port})
        self.assertBadArgs(r, "http.fetch url is invalid: non-canonical IPv4 address")
        self.assertEqual(DNS.settled_queries(None, mark, 0), [])

    def test_private_ip_literal(self):
        self.guard_denied("http://10.0.0.1/")
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                r = self.fetch(["10.0.0.1"], {"url": "http://10.0.0.1/"}, enc)
                self.assertPolicyDenied(r, "http.fetch address 10.0.0.1 is blocked (private 10.0.0.0/8)", enc)
                self.assertEqual(self.decisions(r.run, 1), [(0, "10.0.0.1", "10.0.0.1=deny(private 10.0.0.0/8)", "deny")])

    def test_loopback_literals(self):
        port = UP["a"].port
        v, body = self.assertFetched(self.fetch(["127.0.0.1"], {"url": "http://127.0.0.1:%d/" % port}), "json")
        self.assertEqual(body, b"hello")
        self.assertEqual(UP["a"].snapshot()[-1].header("host"), "127.0.0.1:%d" % port)
        mark = DNS.mark()
        for net, u, msg in (
                (["127.0.0.2"], "http://127.0.0.2:%d/" % port, "http.fetch address 127.0.0.2 is blocked (loopback 127.0.0.0/8)"),
                (["0.0.0.0"], "http://0.0.0.0:%d/" % port, "http.fetch address 0.0.0.0 is blocked (this network 0.0.0.0/8)"),
                (["[::1]"], "http://[::1]:%d/" % port, "http.fetch address ::1 is blocked (loopback ::1/128)"),
                (["[::ffff:127.0.0.1]"], "http://[::ffff:127.0.0.1]:%d/" % port,
                 "http.fetch address ::ffff:127.0.0.1 is blocked (ipv4-mapped ::ffff:0:0/96)"),
                (["[::ffff:7f00:1]"], "http://[::ffff:7f00:1]:%d/" % port,
                 "http.fetch address ::ffff:127.0.0.1 is blocked (ipv4-mapped ::ffff:0:0/96)"),
                (["[::127.0.0.1]"], "http://[::127.0.0.1]:%d/" % port,
                 "http.fetch address ::127.0.0.1 is blocked (ipv4-compatible ::/96)")):
            with self.subTest(url=u):
                r = self.fetch(net, {"url": u})
                self.assertPolicyDenied(r, msg)
        UP["a"].reset()
        self.assertNoContact("a")
        self.assertEqual(DNS.settled_queries(None, mark, 0), [])  # literals never go to DNS


# ================================================================================================================
# 5. DNS


class T5Dns(FetchCase):
    def test_nxdomain(self):
        mark = DNS.mark()
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                r = self.fetch(["nx.test"], {"url": "http://nx.test:%d/" % UP["a"].port}, enc)
                reason = self.assertExecError(r, enc)
                self.assertEqual(reason, 'DNS resolution failed for "nx.test": NXDOMAIN')
        self.assertQueryPairs("nx.test", mark, 2)
        self.assertNoContact("a")

    def test_one_query_pair_per_hop(self):
        mark = DNS.mark()
        for i in range(3):
            self.assertFetched(self.fetch(["ok2.test"], {"url": url("b", "/", "ok2.test")}), "json")
        # A answered, AAAA NODATA: fine; and nothing resolves at connect time
        self.assertQueryPairs("ok2.test", mark, 3)
        self.assertEqual(UP["b"].connections, 3)

    def test_one_family_failing_rejects_the_name(self):
        for host, why in (("half.fake.test", "SERVFAIL"), ("refused6.fake.test", "REFUSED")):
            with self.subTest(host=host):
                r = self.fetch([host], {"url": "http://%s:%d/" % (host, UP["a"].port)})
                self.assertEqual(self.assertExecError(r), 'DNS resolution failed for "%s": %s' % (host, why))
        self.assertNoContact("a")

    def test_refused_outside_the_zone(self):
        # dnsmasq has no upstream: a name outside *.test is REFUSED (and nothing leaves the host)
        r = self.fetch(["ok.example"], {"url": "http://ok.example:%d/" % UP["a"].port})
        self.assertEqual(self.assertExecError(r), 'DNS resolution failed for "ok.example": REFUSED')

    def test_too_many_answers(self):
        # 33 A records: over 512 bytes, so c-ares also has to retry over TCP; no answer may go unvalidated
        r = self.fetch(["many.test"], {"url": "http://many.test:%d/" % UP["a"].port})
        self.assertEqual(self.assertExecError(r), 'DNS resolution failed for "many.test": too many DNS answers')
        self.assertEqual(self.events(r.run, "egress.decision"), [])

    def test_connect_falls_back_to_the_next_validated_address(self):
        r = self.fetch(["fallback.fake.test"], {"url": "http://fallback.fake.test:%d/" % UP["a"].port})
        v, body = self.assertFetched(r, "json")
        self.assertEqual(body, b"hello")
        self.assertEqual(self.decisions(r.run, 1), [(0, "fallback.fake.test",
                                                     "127.0.0.3=allow(operator allow_cidrs),%s" % LOOPBACK_ALLOWED, "allow")])
        self.assertEqual(self.one_event(r.run, "egress.response").get("address"), "127.0.0.1")
        self.assertEqual(UP["a"].connections, 1)

    def test_concurrent_fetches(self):
        # many exchanges in flight at once on both workers: resolver sockets, pins and replies never mix
        UP["a"].route("/who", lambda h, rec: (time.sleep(0.2), h.reply(200, rec.target.encode()))[1])
        UP["b"].route("/who", lambda h, rec: (time.sleep(0.2), h.reply(200, rec.target.encode()))[1])
        jobs = []
        for i in range(24):
            kind = ("a", "b", "nx")[i % 3]
            host = {"a": "ok.test", "b": "ok2.test", "nx": "nx.test"}[kind]
            port = UP["b" if kind == "b" else "a"].port
            tok, run = self.token([host])
            jobs.append((kind, "/who?i=%d" % i, tok, run, "http://%s:%d/who?i=%d" % (host, port, i)))
        results = {}

        def call(job):
            kind, target, tok, run, u = job
            results[run] = B.rpc(tok, "http.fetch", {"url": u}, enc="msgpack", timeout=20)

        threads = [threading.Thread(target=call, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for kind, target, tok, run, u in jobs:
            r = results[run]
            r.run = run
            if kind == "nx":
                self.assertEqual(self.assertExecError(r, "msgpack"), 'DNS resolution failed for "nx.test": NXDOMAIN')
            else:
                v, body = self.assertFetched(r, "msgpack")
                self.assertEqual(body, target.encode())
        self.assertEqual(UP["a"].connections, 8)
        self.assertEqual(UP["b"].connections, 8)

    def test_connect_refused(self):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        r = self.fetch(["ok.test"], {"url": "http://ok.test:%d/" % port})
        reason = self.assertExecError(r)
        self.assertEqual(reason, "http.fetch ok.test: connect failed to every validated address")


class T5bDnsServerFailures(FetchCase):
    """A broker of its own whose only DNS server is the FakeDns (short timeout) or a dead port."""

    def _broker(self, server):
        cfg = _egress_config()
        cfg["egress"].update({"dns_servers": [server], "dns_timeout_ms": 200, "dns_tries": 1})
        return sbtest.Broker(config=cfg, env={"SANDBOX_BROKER_THREADS": "1"}).start()

    def _fetch_on(self, b, host):
        run = "%s-%s" % (self._testMethodName, host)
        tok = b.mint_ok(run, {"net": [host]})
        t0 = time.monotonic()
        r = b.rpc(tok, "http.fetch", {"url": "http://%s:%d/" % (host, UP["a"].port)}, timeout=20)
        elapsed = time.monotonic() - t0
        self.assertError(r, 500, "execution_error", EXEC_MSG)
        evs = sbtest.poll(lambda: [e for e in b.events() if e.get("event") == "egress.failed" and e.get("runId") == run], 5)
        self.assertEqual(len(evs), 1, b.log()[-3000:])
        return evs[0].get("reason"), elapsed

    def _stop(self, b):
        rc = b.stop()
        log = b.log()
        self.assertNotIn("runtime error:", log)
        self.assertNotIn("ERROR: AddressSanitizer", log)
        return rc

    def test_timeout_of_one_family(self):
        b = self._broker("127.0.0.1:%d" % FAKE.port)
        try:
            reason, elapsed = self._fetch_on(b, "slow.fake.test")
            self.assertEqual(reason, 'DNS resolution failed for "slow.fake.test": DNS timeout')
            self.assertLess(elapsed, DEADLINE_MS / 1000.0)  # the DNS timeout, not the exchange deadline, ended it
        finally:
            self._stop(b)
        self.assertNoContact("a")

    def test_unreachable_server(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        s.close()  # nothing answers there: ICMP port unreachable
        b = self._broker("127.0.0.1:%d" % dead)
        try:
            reason, elapsed = self._fetch_on(b, "ok.test")
            # the ICMP port-unreachable may or may not reach c-ares through the h2o glue; either reason names DNS,
            # and the name is rejected within the DNS budget (200 ms x 1 try), not at the exchange deadline
            self.assertIn(reason, ('DNS resolution failed for "ok.test": DNS server unreachable',
                                   'DNS resolution failed for "ok.test": DNS timeout'))
            self.assertLess(elapsed, 1.5)
        finally:
            self._stop(b)
        self.assertNoContact("a")


# ================================================================================================================
# 6. redirects


def redirect(status, location, body=b""):
    def route(h, rec):
        hdrs = [("Location", location)] if location is not None else []
        h.reply(status, body, hdrs)
    return route


class T6Redirects(FetchCase):
    def setUp(self):
        super().setUp()
        a = UP["a"]
        a.route("/land", lambda h, rec: h.reply(200, b"landed " + rec.method.encode(), [("X-Hop", "land")]))
        UP["b"].route("/landing", lambda h, rec: h.reply(200, b"other origin", [("X-Hop", "b")]))

    def test_relative_location(self):
        UP["a"].route("/r/dir/start", redirect(302, "../land?x=1#f"))
        UP["a"].route("/r/land", lambda h, rec: h.reply(200, b"landed " + rec.method.encode(), [("X-Hop", "land")]))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/r/dir/start")}), "json")
        self.assertEqual((v["status"], body, v["headers"].get("x-hop")), (200, b"landed GET", "land"))
        self.assertEqual([r.target for r in UP["a"].snapshot()], ["/r/dir/start", "/r/land?x=1"])
        UP["a"].reset()
        UP["a"].route("/r/abs-path", redirect(301, "/land"))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/r/abs-path")}), "json")
        self.assertEqual(body, b"landed GET")
        self.assertEqual([r.requestline for r in UP["a"].snapshot()], ["GET /r/abs-path HTTP/1.1", "GET /land HTTP/1.1"])

    def test_absolute_location_to_another_allowlisted_host(self):
        mark = DNS.mark()
        UP["a"].route("/r/abs", redirect(302, url("b", "/landing", "ok2.test")))
        r = self.fetch(["ok.test", "ok2.test"], {"url": url("a", "/r/abs")})
        v, body = self.assertFetched(r, "json")
        self.assertEqual(body, b"other origin")
        self.assertEqual(UP["b"].snapshot()[0].header("host"), "ok2.test:%d" % UP["b"].port)
        self.assertEqual(self.decisions(r.run, 2), [(0, "ok.test", LOOPBACK_ALLOWED, "allow"),
                                                    (1, "ok2.test", LOOPBACK_ALLOWED, "allow")])
        self.assertQueryPairs("ok.test", mark, 1)
        self.assertQueryPairs("ok2.test", mark, 1)

    def test_redirect_leaving_the_allowlist(self):
        mark = DNS.mark()
        target = url("other", "/", "other.test")
        UP["a"].route("/r/out", redirect(302, target))
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                r = self.fetch(["ok.test"], {"url": url("a", "/r/out")}, enc)
                self.assertPolicyDenied(r, 'http.fetch redirect host "other.test:%d" is not in the net allowlist'
                                     % UP["other"].port, enc)
                # decided during the fetch: the guest gets the generic message, the reason is in the log
                self.assertNotIn("redirect", r.body["error"]["message"])
        self.assertNoContact("other")
        self.assertEqual(DNS.settled_queries("other.test", mark, 0), [])
        # the same through a wildcard that does not cover the target, and a port change on an allowed host
        UP["a"].route("/r/port", redirect(302, url("b", "/landing")))
        r = self.fetch(["ok.test:%d" % UP["a"].port], {"url": url("a", "/r/port")})
        self.assertPolicyDenied(r, 'http.fetch redirect host "ok.test:%d" is not in the net allowlist' % UP["b"].port)
        self.assertNoContact("b")

    def test_redirect_to_a_blocked_address(self):
        u = url("mixed", "/", "mixed.test")
        self.guard_denied(u)
        UP["a"].route("/r/mixed", redirect(302, u))
        r = self.fetch(["ok.test", "mixed.test"], {"url": url("a", "/r/mixed")})
        self.assertPolicyDenied(r, 'http.fetch host "mixed.test" resolves to a blocked address 10.0.0.5 (private 10.0.0.0/8)')
        self.assertNoContact("mixed")

    def test_redirect_to_literals(self):
        port = UP["a"].port
        UP["a"].route("/r/lit", redirect(302, "http://127.0.0.1:%d/land" % port))
        r = self.fetch(["ok.test", "127.0.0.1"], {"url": url("a", "/r/lit")})
        v, body = self.assertFetched(r, "json")
        self.assertEqual(body, b"landed GET")
        self.assertEqual(UP["a"].snapshot()[1].header("host"), "127.0.0.1:%d" % port)
        UP["a"].route("/r/lit6", redirect(302, "http://[::1]:%d/land" % port))
        r = self.fetch(["ok.test", "[::1]"], {"url": url("a", "/r/lit6")})
        self.assertPolicyDenied(r, "http.fetch address ::1 is blocked (loopback ::1/128)")
        r = self.fetch(["ok.test"], {"url": url("a", "/r/lit6")})
        self.assertPolicyDenied(r, 'http.fetch redirect host "[::1]:%d" is not in the net allowlist' % port)

    def test_redirect_loop(self):
        UP["a"].route("/r/loop", redirect(302, "/r/loop"))
        r = self.fetch(["ok.test"], {"url": url("a", "/r/loop")})
        self.assertEqual(self.assertExecError(r), "too many redirects (> 5)")
        time.sleep(0.2)
        self.assertEqual([x.target for x in UP["a"].snapshot()], ["/r/loop"] * 6)
        # every hop resolved and was validated afresh; the same origin in the same run then kept the connection
        self.assertEqual([d[0] for d in self.decisions(r.run, 6)], [0, 1, 2, 3, 4, 5])
        self.assertEqual(UP["a"].connections, 1)
        self.assertEqual([e.get("reused") for e in self.wait_events(r.run, "egress.response", 6)], [0, 1, 1, 1, 1, 1])

    def test_five_redirects_are_fine(self):
        for i in range(5):
            UP["a"].route("/r/chain%d" % i, redirect(307, "/r/chain%d" % (i + 1)))
        UP["a"].route("/r/chain5", lambda h, rec: h.reply(200, b"end of chain"))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/r/chain0")}), "json")
        self.assertEqual(body, b"end of chain")
        self.assertEqual(len(UP["a"].snapshot()), 6)

    def _post_through(self, status, method="POST", body=b"payload\x00"):
        UP["a"].reset()
        UP["a"].route("/r/s%d" % status, redirect(status, "/land"))
        args = {"url": url("a", "/r/s%d" % status), "method": method, "headers": {"X-Keep": "1"}}
        if body is not None:
            args["bodyBase64"] = b64(body)
        v, got = self.assertFetched(self.fetch(["ok.test"], args), "json")
        reqs = UP["a"].snapshot()
        self.assertEqual(len(reqs), 2, reqs)
        return v, got, reqs

    def test_method_and_body_rules(self):
        body = b"payload\x00"
        for status in (301, 302, 303):
            with self.subTest(status=status):
                v, got, (first, second) = self._post_through(status)
                self.assertEqual((first.method, first.body), ("POST", body))
                self.assertEqual((second.method, second.body), ("GET", b""))
                self.assertEqual(second.header_values("content-length"), [])
                self.assertEqual(second.header_values("x-keep"), ["1"])
                self.assertEqual(got, b"landed GET")
        for status in (307, 308):
            with self.subTest(status=status):
                v, got, (first, second) = self._post_through(status)
                self.assertEqual((second.method, second.body), ("POST", body))
                self.assertEqual(second.header_values("content-length"), [str(len(body))])
                self.assertEqual(got, b"landed POST")
        for status in (301, 302, 307, 308):
            with self.subTest(status=status, method="PUT"):
                v, got, (first, second) = self._post_through(status, "PUT")
                self.assertEqual(second.method, "GET" if status in (301, 302) else "PUT")
        with self.subTest("303 after DELETE"):
            v, got, (first, second) = self._post_through(303, "DELETE", None)
            self.assertEqual(second.method, "GET")
        with self.subTest("301 after GET"):
            v, got, (first, second) = self._post_through(301, "GET", None)
            self.assertEqual(second.method, "GET")

    def test_303_after_head_becomes_get(self):
        # PROTOCOL.md section 6a: 303 turns any method into GET (HEAD included) and drops the body
        v, got, (first, second) = self._post_through(303, "HEAD", None)
        self.assertEqual(first.method, "HEAD")
        self.assertEqual(second.method, "GET")

    def test_3xx_without_location_is_the_answer(self):
        for status in (302, 300, 304):
            with self.subTest(status=status):
                UP["a"].reset()
                UP["a"].route("/r/noloc", lambda h, rec, s=status: h.reply(s, b"" if s == 304 else b"no location",
                                                                          [("X-S", str(s))]))
                v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/r/noloc")}), "json")
                self.assertEqual((v["status"], body, v["headers"]["x-s"]),
                                 (status, b"" if status == 304 else b"no location", str(status)))
                self.assertEqual(len(UP["a"].snapshot()), 1)
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/r/noloc")}, "msgpack"), "msgpack")
        UP["a"].route("/r/302", redirect(302, None, b"moved, but where?"))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/r/302")}, "msgpack"), "msgpack")
        self.assertEqual((v["status"], v["statusText"], body), (302, "Found", b"moved, but where?"))

    CREDS = {"Authorization": "Bearer secret", "Cookie": "sid=1", "Proxy-Foo": "p", "X-Keep": "k"}

    def test_cross_origin_hop_strips_credentials(self):
        for target, up in ((url("b", "/landing", "ok2.test"), "b"),  # another host
                           (url("b", "/landing"), "b"),  # same host, another port
                           (url("tls", "/landing", "tls.test", "https"), "tls")):  # another scheme and host
            with self.subTest(target=target):
                for u in UP.values():
                    u.reset()
                UP["a"].route("/r/cross", redirect(302, target))
                UP["tls"].route("/landing", lambda h, rec: h.reply(200, b"tls landing"))
                self.assertFetched(self.fetch(["ok.test", "ok2.test", "tls.test", "ok.test:%d" % UP["b"].port],
                                              {"url": url("a", "/r/cross"), "headers": self.CREDS}), "json")
                first, = UP["a"].snapshot()
                self.assertEqual(sorted(first.names()), sorted(["host", "authorization", "cookie", "proxy-foo", "x-keep"]))
                second, = UP[up].snapshot()
                self.assertEqual(sorted(second.names()), ["host", "x-keep"], second.headers)
                self.assertEqual(second.header("x-keep"), "k")

    def test_a_hop_to_another_origin_never_takes_the_connection(self):
        # ok.test and ok2.test are the same address and port: another host name is another origin (another
        # Host, another TLS name), so its hop connects afresh, even within one fetch of one run
        port = UP["a"].port
        UP["a"].route("/r/rename", redirect(302, "http://ok2.test:%d/land" % port))
        r = self.fetch(["ok.test", "ok2.test"], {"url": url("a", "/r/rename")})
        v, body = self.assertFetched(r, "json")
        self.assertEqual(body, b"landed GET")
        reqs = UP["a"].snapshot()
        self.assertEqual([(x.target, x.header("host")) for x in reqs],
                         [("/r/rename", "ok.test:%d" % port), ("/land", "ok2.test:%d" % port)])
        self.assertEqual(len(set(x.conn_id for x in reqs)), 2, reqs)
        self.assertEqual([e.get("reused") for e in self.wait_events(r.run, "egress.response", 2)], [0, 0])

    def test_same_origin_hop_keeps_credentials(self):
        UP["a"].route("/r/same", redirect(302, url("a", "/land")))  # absolute, but the same origin
        self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/r/same"), "headers": self.CREDS}), "json")
        first, second = UP["a"].snapshot()
        for rec in (first, second):
            self.assertEqual((rec.header("authorization"), rec.header("cookie"), rec.header("proxy-foo"),
                              rec.header("x-keep")), ("Bearer secret", "sid=1", "p", "k"))

    def test_credentials_stay_stripped_after_returning(self):
        # a -> b (cross: strip) -> a (the guest's credentials are gone for good)
        UP["a"].route("/r/away", redirect(302, url("b", "/back", "ok2.test")))
        UP["b"].route("/back", redirect(302, url("a", "/land")))
        self.assertFetched(self.fetch(["ok.test", "ok2.test"], {"url": url("a", "/r/away"), "headers": self.CREDS}), "json")
        first, last = UP["a"].snapshot()
        self.assertIn("authorization", first.names())
        self.assertEqual(sorted(last.names()), ["host", "x-keep"])

    def test_http_to_https_hop(self):
        UP["a"].route("/r/tls", redirect(302, url("tls", "/secure?y=2", "tls.test", "https")))
        UP["tls"].route("/secure", lambda h, rec: h.reply(200, b"secure", [("X-Tls", rec.tls_version)]))
        r = self.fetch(["ok.test", "tls.test"], {"url": url("a", "/r/tls")})
        v, body = self.assertFetched(r, "json")
        self.assertEqual(body, b"secure")
        rec, = UP["tls"].snapshot()
        self.assertEqual(rec.sni, "tls.test")
        self.assertEqual(rec.header("host"), "tls.test:%d" % UP["tls"].port)
        self.assertEqual(rec.requestline, "GET /secure?y=2 HTTP/1.1")

    def test_bad_locations(self):
        for loc, why in (("http://user@ok.test/", "userinfo is not allowed"),
                         ("ftp://ok.test/", "unsupported scheme"),
                         ("http://2130706433/", "non-canonical IPv4 address")):
            with self.subTest(location=loc):
                UP["a"].route("/r/bad", redirect(302, loc))
                r = self.fetch(["ok.test", "*.test"], {"url": url("a", "/r/bad")})
                self.assertEqual(self.assertExecError(r), "invalid redirect Location: " + why)


# ================================================================================================================
# 7. TTL-0 rebinding between hops


class T7Rebinding(FetchCase):
    def tearDown(self):
        DNS.rebind(INITIAL_HOSTS)

    def test_second_hop_re_resolves_and_is_refused(self):
        port = UP["a"].port
        seen = {}
        mark = DNS.mark()

        def first(h, rec):
            # the pin of this hop is in use right now: the broker resolved once for it
            seen["queries_during_hop0"] = DNS.queries("rebind.test", mark)
            DNS.rebind({"rebind.test": ["127.0.0.2"], "stable.test": ["127.0.0.1"]})
            h.reply(302, b"", [("Location", "http://rebind.test:%d/rebind/second" % port)])

        UP["a"].route("/rebind/first", first)
        wire = Tripwire("127.0.0.2", port).start()
        try:
            r = self.fetch(["rebind.test"], {"url": "http://rebind.test:%d/rebind/first" % port})
            self.assertPolicyDenied(r, 'http.fetch host "rebind.test" resolves to a blocked address 127.0.0.2 '
                                    '(loopback 127.0.0.0/8)')
            time.sleep(0.2)
            self.assertEqual(wire.connections, 0)
        finally:
            wire.stop()
        self.assertEqual(sorted(t for t, _ in seen["queries_during_hop0"]), ["A", "AAAA"])
        self.assertEqual([x.target for x in UP["a"].snapshot()], ["/rebind/first"])
        self.assertEqual(self.decisions(r.run, 2), [(0, "rebind.test", LOOPBACK_ALLOWED, "allow"),
                                                    (1, "rebind.test", "127.0.0.2=deny(loopback 127.0.0.0/8)", "deny")])
        self.assertQueryPairs("rebind.test", mark, 2)

    def test_each_hop_resolves_again(self):
        port = UP["a"].port
        mark = DNS.mark()
        UP["a"].route("/stable/first", redirect(302, "http://stable.test:%d/stable/second" % port))
        UP["a"].route("/stable/second", lambda h, rec: h.reply(200, b"second hop"))
        r = self.fetch(["stable.test"], {"url": "http://stable.test:%d/stable/first" % port})
        v, body = self.assertFetched(r, "json")
        self.assertEqual(body, b"second hop")
        self.assertQueryPairs("stable.test", mark, 2)
        self.assertEqual(self.decisions(r.run, 2), [(0, "stable.test", LOOPBACK_ALLOWED, "allow"),
                                                    (1, "stable.test", LOOPBACK_ALLOWED, "allow")])
        # the fresh answer still holds the connected address: the second hop may take the kept connection
        self.assertEqual(UP["a"].connections, 1)
        self.assertEqual([e.get("reused") for e in self.wait_events(r.run, "egress.response", 2)], [0, 1])

    def test_a_hop_rebound_to_another_allowed_address_connects_there(self):
        # between the hops the name moves to 127.0.0.3, allowed but where nothing listens: the second hop must go
        # there (and fail to connect), never over the connection kept from the first hop to 127.0.0.1
        port = UP["a"].port
        mark = DNS.mark()

        def first(h, rec):
            DNS.rebind({"rebind.test": ["127.0.0.3"], "stable.test": ["127.0.0.1"]})
            h.reply(302, b"", [("Location", "/rebind/second")])

        UP["a"].route("/rebind/first", first)
        r = self.fetch(["rebind.test"], {"url": "http://rebind.test:%d/rebind/first" % port})
        self.assertEqual(self.assertExecError(r), "http.fetch rebind.test: connect failed to every validated address")
        time.sleep(0.2)
        self.assertEqual([x.target for x in UP["a"].snapshot()], ["/rebind/first"])
        self.assertEqual(self.decisions(r.run, 2), [(0, "rebind.test", LOOPBACK_ALLOWED, "allow"),
                                                    (1, "rebind.test", "127.0.0.3=allow(operator allow_cidrs)", "allow")])
        self.assertQueryPairs("rebind.test", mark, 2)


# ================================================================================================================
# 8. response framing, caps and the deadline


def chunked(parts, trailer=b""):
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Framing: chunked\r\n\r\n"
    for p in parts:
        out += b"%x;ext=1\r\n%s\r\n" % (len(p), p)
    return out + b"0\r\n" + trailer + b"\r\n"


def stream_big(h, head, total, chunk_fn=None):
    h.raw(head, close=False)
    block = b"\x5a" * 65536
    sent = 0
    while sent < total and not h.stopping():
        n = min(len(block), total - sent)
        h.wfile.write(chunk_fn(block[:n]) if chunk_fn else block[:n])
        sent += n
    if chunk_fn:
        h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()
    h.close_connection = True


class T8Framing(FetchCase):
    CAP_REASON = r"^http\.fetch ok\.test: response body exceeds (the|5242880-byte) cap$"

    def test_chunked_response(self):
        UP["a"].route("/chunked", lambda h, rec: h.raw(chunked([b"hello ", b"chunked", b" world"], b"X-Trailer: t\r\n")))
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/chunked")}, enc), enc)
                self.assertEqual((v["status"], body), (200, b"hello chunked world"))
                self.assertEqual(v["headers"]["x-framing"], "chunked")

    def test_body_delimited_by_close(self):
        payload = bytes(range(256)) * 40
        UP["a"].route("/close", lambda h, rec: h.raw(b"HTTP/1.1 200 OK\r\nX-Framing: close\r\n\r\n" + payload))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/close")}, "msgpack"), "msgpack")
        self.assertEqual(body, payload)
        self.assertNotIn("content-length", v["headers"])

    def test_content_length_is_honoured_not_trusted(self):
        # bytes after Content-Length are not part of the body
        UP["a"].route("/extra", lambda h, rec: h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA"))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/extra")}), "json")
        self.assertEqual(body, b"hello")
        # a connection closed before Content-Length bytes arrived is an error, not a short body
        UP["a"].route("/short", lambda h, rec: h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello"))
        r = self.fetch(["ok.test"], {"url": url("a", "/short")})
        self.assertEqual(self.assertExecError(r),
                         "http.fetch ok.test: connection closed before the response body completed")
        UP["a"].route("/conflict", lambda h, rec: h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"
                                                         b"Content-Length: 6\r\n\r\nhello!"))
        r = self.fetch(["ok.test"], {"url": url("a", "/conflict")})
        self.assertEqual(self.assertExecError(r), "http.fetch ok.test: malformed or conflicting Content-Length")

    def test_body_at_the_cap(self):
        UP["a"].route("/exact", lambda h, rec: stream_big(h, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BODY_CAP,
                                                          BODY_CAP))
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/exact")}, enc), enc)
                self.assertEqual(len(body), BODY_CAP)
                self.assertEqual(body, b"\x5a" * BODY_CAP)

    def test_body_over_the_cap(self):
        six = 6 * 1024 * 1024
        routes = {
            "/big/length": lambda h, rec: stream_big(h, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % six, six),
            "/big/close": lambda h, rec: stream_big(h, b"HTTP/1.1 200 OK\r\n\r\n", six),
            "/big/chunked": lambda h, rec: stream_big(h, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", six,
                                                      lambda b: b"%x\r\n%s\r\n" % (len(b), b)),
            "/big/lying": lambda h, rec: stream_big(h, b"HTTP/1.1 200 OK\r\n\r\n", BODY_CAP + 1),
        }
        for path, fn in routes.items():
            UP["a"].route(path, fn)
            with self.subTest(path=path):
                r = self.fetch(["ok.test"], {"url": url("a", path)})
                self.assertRegex(self.assertExecError(r), self.CAP_REASON)

    def test_slow_drip_hits_the_deadline(self):
        dripped = {}

        def drip(h, rec):
            h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", close=False)
            try:
                for i in range(1000):
                    if h.stopping():
                        break
                    h.wfile.write(b"x")
                    h.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                dripped["closed_at"] = time.monotonic()
            h.close_connection = True

        UP["a"].route("/drip", drip)
        r = self.fetch(["ok.test"], {"url": url("a", "/drip")}, timeout=30)
        self.assertEqual(self.assertExecError(r), "http.fetch deadline exceeded (%d ms)" % DEADLINE_MS)
        self.assertGreaterEqual(r.elapsed, DEADLINE_MS / 1000.0 - 0.1)
        self.assertLessEqual(r.elapsed, DEADLINE_MS / 1000.0 + 1.5)
        # the broker dropped the upstream connection when the deadline fired
        self.assertTrue(sbtest.poll(lambda: "closed_at" in dripped, 5.0), "the upstream connection was left open")

    def test_slow_head_hits_the_deadline(self):
        def drip_head(h, rec):
            try:
                for c in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"y" * 100:
                    if h.stopping():
                        break
                    h.wfile.write(bytes([c]))
                    h.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            h.close_connection = True

        UP["a"].route("/drip-head", drip_head)
        r = self.fetch(["ok.test"], {"url": url("a", "/drip-head")}, timeout=30)
        self.assertEqual(self.assertExecError(r), "http.fetch deadline exceeded (%d ms)" % DEADLINE_MS)
        self.assertLessEqual(r.elapsed, DEADLINE_MS / 1000.0 + 1.5)

    @staticmethod
    def many_headers(n):
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
        head += b"".join(b"X-H%03d: %d\r\n" % (i, i) for i in range(n - 1))
        return head + b"\r\nok"

    def test_header_count_cap(self):
        UP["a"].route("/h100", lambda h, rec: h.raw(self.many_headers(100)))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/h100")}), "json")
        self.assertEqual((len(v["headers"]), body), (100, b"ok"))
        for n in (101, 150):
            UP["a"].route("/h%d" % n, lambda h, rec, n=n: h.raw(self.many_headers(n)))
            with self.subTest(headers=n):
                r = self.fetch(["ok.test"], {"url": url("a", "/h%d" % n)})
                self.assertEqual(self.assertExecError(r),
                                 "http.fetch ok.test: malformed response head (or more than 100 headers)")

    def test_head_size_cap(self):
        big = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + b"".join(
            b"X-Big%d: %s\r\n" % (i, b"v" * 7000) for i in range(10)) + b"\r\nok"
        self.assertGreater(len(big), 65536 + 1000)

        def slow(h, rec):  # in two pieces: the broker sees an incomplete head over the cap first
            try:
                h.wfile.write(big[:66000])
                h.wfile.flush()
                time.sleep(0.1)
                h.wfile.write(big[66000:])
                h.wfile.flush()
            except OSError:
                pass
            h.close_connection = True

        for path, fn in (("/bighead-pieces", slow), ("/bighead-once", lambda h, rec: h.raw(big))):
            UP["a"].route(path, fn)
            with self.subTest(path=path):
                r = self.fetch(["ok.test"], {"url": url("a", path)})
                self.assertEqual(self.assertExecError(r), "http.fetch ok.test: response head exceeds 65536 bytes")

    def test_interim_responses(self):
        UP["a"].route("/100", lambda h, rec: h.raw(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                                                    b"Link: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"))
        v, body = self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/100")}), "json")
        self.assertEqual((v["status"], body, v["headers"]), (200, b"final", {"content-length": "5"}))
        UP["a"].route("/101", lambda h, rec: h.raw(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"))
        r = self.fetch(["ok.test"], {"url": url("a", "/101")})
        self.assertEqual(self.assertExecError(r), "http.fetch ok.test: upstream switched protocols")

    def test_deadline_spans_every_hop(self):
        def slow_hop(h, rec):
            n = int(rec.target.rsplit("/", 1)[1])
            h.server.upstream.stop_event.wait(0.8)
            h.reply(302, b"", [("Location", "/slowhop/%d" % (n + 1))])

        UP["a"].route("*", slow_hop)
        try:
            r = self.fetch(["ok.test"], {"url": url("a", "/slowhop/0")}, timeout=30)
        finally:
            del UP["a"].routes["*"]
        self.assertEqual(self.assertExecError(r), "http.fetch deadline exceeded (%d ms)" % DEADLINE_MS)
        self.assertGreaterEqual(r.elapsed, DEADLINE_MS / 1000.0 - 0.1)
        self.assertLessEqual(r.elapsed, DEADLINE_MS / 1000.0 + 1.5)
        self.assertIn(len(UP["a"].snapshot()), (3, 4))

    def test_guest_hangs_up_mid_fetch(self):
        def drip(h, rec):
            h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", close=False)
            try:
                while not h.stopping():
                    h.wfile.write(b"x")
                    h.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            h.close_connection = True

        UP["a"].route("/hangup", drip)
        tok, run = self.token(["ok.test"])
        with self.assertRaises(OSError):  # socket.timeout: the guest gives up and closes its connection
            B.rpc(tok, "http.fetch", {"url": url("a", "/hangup")}, timeout=0.5)
        # the exchange still ends by itself at the deadline, and the broker carries on
        ev = self.wait_events(run, "egress.failed", 1, timeout=DEADLINE_MS / 1000.0 + 3)
        self.assertEqual([e.get("reason") for e in ev], ["http.fetch deadline exceeded (%d ms)" % DEADLINE_MS])
        self.assertTrue(B.alive())
        self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/")}), "json")

    def test_unsupported_transfer_encoding(self):
        UP["a"].route("/gzip-te", lambda h, rec: h.raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx"))
        r = self.fetch(["ok.test"], {"url": url("a", "/gzip-te")})
        self.assertEqual(self.assertExecError(r), "http.fetch ok.test: unsupported Transfer-Encoding")


# ================================================================================================================
# 9. TLS


class T9Tls(FetchCase):
    def test_https_with_sni_and_host(self):
        for name, version in (("tls", "TLSv1.3"), ("tls12", "TLSv1.2")):
            with self.subTest(server=name):
                UP[name].route("/hello", lambda h, rec: h.reply(200, b"tls hello"))
                for enc in ENCODINGS:
                    UP[name].reset()
                    r = self.fetch(["tls.test"], {"url": url(name, "/hello", "tls.test", "https")}, enc)
                    v, body = self.assertFetched(r, enc)
                    self.assertEqual(body, b"tls hello")
                    rec, = UP[name].snapshot()
                    self.assertEqual((rec.sni, rec.tls_version), ("tls.test", version))
                    self.assertEqual(UP[name].snis, ["tls.test"])
                    self.assertEqual(rec.header("host"), "tls.test:%d" % UP[name].port)
        # the default port is left out of Host (only reachable in the decision path: nothing listens on 443)

    def _refused(self, name, reason):
        r = self.fetch(["tls.test"], {"url": url(name, "/hello", "tls.test", "https")})
        self.assertError(r, 500, "execution_error", EXEC_MSG)
        time.sleep(0.2)
        self.assertEqual(UP[name].snapshot(), [], "a request went out over an unverified connection")
        self.assertEqual(UP[name].snis, ["tls.test"])
        self.assertEqual(len(UP[name].handshake_errors), 1, UP[name].handshake_errors)
        self.assertEqual(UP[name].connections, 1, "a certificate failure must not be retried")
        # the operator must learn that the certificate, not the network, is the problem
        self.assertEqual(self.assertExecError(r), reason)
        return r

    def test_untrusted_ca(self):
        self._refused("rogue", "http.fetch tls.test: TLS: certificate verification failed")

    def test_wrong_name_tls13(self):
        self._refused("wrong13", "http.fetch tls.test: TLS: certificate name mismatch")

    def test_wrong_name_tls12(self):
        self._refused("wrong12", "http.fetch tls.test: TLS: certificate name mismatch")

    def test_https_to_an_ip_literal(self):
        r = self.fetch(["127.0.0.1"], {"url": "https://127.0.0.1:%d/hello" % UP["tls"].port})
        self.assertEqual(self.assertExecError(r), "https to an IP-literal host is not supported (no name to verify)")
        self.assertNoContact("tls")

    def test_plain_http_to_a_tls_port(self):
        r = self.fetch(["tls.test"], {"url": url("tls", "/hello", "tls.test")})
        self.assertTrue(self.assertExecError(r).startswith("http.fetch tls.test: "))


# ================================================================================================================
# 9b. the rest of the issue: proxies, IDNs, metrics


def metric(text, decision, rule):
    key = 'sb_egress_decisions_total{decision="%s",rule="%s"} ' % (decision, rule)
    for line in text.splitlines():
        if line.startswith(key):
            return int(line[len(key):])
    return 0


class T9bMisc(FetchCase):
    def test_environment_proxies_are_ignored(self):
        UP["tls"].route("/hello", lambda h, rec: h.reply(200, b"tls hello"))
        self.assertFetched(self.fetch(["ok.test"], {"url": url("a", "/hello")}), "json")
        self.assertFetched(self.fetch(["tls.test"], {"url": url("tls", "/hello", "tls.test", "https")}), "json")
        self.assertEqual(UP["a"].snapshot()[0].requestline, "GET /hello HTTP/1.1")  # origin-form, not proxy form
        time.sleep(0.1)
        self.assertEqual(PROXY_TRIP.connections, 0)

    def test_idn_host_is_mapped_to_its_a_label(self):
        mark = DNS.mark()
        r = self.fetch(["xn--bcher-kva.test"], {"url": "http://B\u00fccher.test:%d/" % UP["a"].port})
        self.assertFetched(r, "json")
        self.assertEqual(UP["a"].snapshot()[0].header("host"), "xn--bcher-kva.test:%d" % UP["a"].port)
        self.assertQueryPairs("xn--bcher-kva.test", mark, 1)

    def test_metrics_count_every_verdict(self):
        u = url("mixed", "/", "mixed.test")
        self.guard_denied(u)
        before = B.admin("GET", "/metrics").raw.decode()
        self.assertPolicyDenied(self.fetch(["mixed.test"], {"url": u}),
                             'http.fetch host "mixed.test" resolves to a blocked address 10.0.0.5 (private 10.0.0.0/8)')
        after = B.admin("GET", "/metrics").raw.decode()
        self.assertEqual(metric(after, "deny", "private 10.0.0.0/8") - metric(before, "deny", "private 10.0.0.0/8"), 1)
        self.assertEqual(metric(after, "allow", "operator allow_cidrs") -
                         metric(before, "allow", "operator allow_cidrs"), 1)


# ================================================================================================================
# 10. egress-check, the operator's view (never connects)


def check_lines(out):
    return [l for l in out.splitlines() if l]


def answers_of(out):
    res = []
    for l in check_lines(out):
        m = re.match(r"^answer: (\S+) +(allow|deny) \((.*)\)$", l)
        if m:
            res.append(m.groups())
    return res


class T10EgressCheck(FetchCase):
    def test_public_name_is_allowed(self):
        mark = DNS.mark()
        rc, out, err = egress_check("http://public.test/")
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(check_lines(out), ["decision: allow", "url: http://public.test:80/",
                                            "answer: %-40s allow (global unicast)" % "93.184.216.34", "reason: allowed"])
        self.assertEqual(answers_of(out), [("93.184.216.34", "allow", "global unicast")])
        self.assertQueryPairs("public.test", mark, 1)

    def test_an_allowed_url_is_never_connected(self):
        mark = DNS.mark()
        rc, out, err = egress_check("--allow", "ok.test", url("a", "/hello"))
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(check_lines(out), ["decision: allow", "url: " + url("a", "/hello"),
                                            "answer: %-40s allow (operator allow_cidrs)" % "127.0.0.1", "reason: allowed"])
        self.assertQueryPairs("ok.test", mark, 1)
        self.assertNoContact("a")

    def test_mixed_answers_are_denied_with_every_verdict(self):
        rc, out, err = egress_check("https://mixed2.test/x")
        self.assertEqual(rc, 1, out + err)
        lines = check_lines(out)
        self.assertEqual(lines[0], "decision: deny")
        self.assertEqual(lines[1], "url: https://mixed2.test:443/x")
        self.assertEqual(sorted(answers_of(out)), sorted([("93.184.216.34", "allow", "global unicast"),
                                                          ("10.0.0.5", "deny", "private 10.0.0.0/8"),
                                                          ("fd00::1", "deny", "unique local fc00::/7")]))
        self.assertEqual(lines[-1], 'reason: http.fetch host "mixed2.test" resolves to a blocked address 10.0.0.5 '
                                    '(private 10.0.0.0/8)')
        self.assertEqual(len(lines), 6, lines)

    def test_allowlist(self):
        mark = DNS.mark()
        rc, out, err = egress_check("--allow", "other.test", "http://public.test/")
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(check_lines(out), ["decision: deny", "url: http://public.test:80/",
                                            'reason: http.fetch host "public.test:80" is not in the net allowlist'])
        self.assertEqual(DNS.settled_queries("public.test", mark, 0), [])
        rc, out, err = egress_check("--allow", "other.test", "--allow", "*.test:80", "http://public.test/")
        self.assertEqual(rc, 0, out + err)

    def test_literals_and_names(self):
        cases = [
            ("http://[::ffff:127.0.0.1]/", [("::ffff:127.0.0.1", "deny", "ipv4-mapped ::ffff:0:0/96")],
             "http.fetch address ::ffff:127.0.0.1 is blocked (ipv4-mapped ::ffff:0:0/96)"),
            ("http://10.0.0.1/", [("10.0.0.1", "deny", "private 10.0.0.0/8")],
             "http.fetch address 10.0.0.1 is blocked (private 10.0.0.0/8)"),
            ("http://169.254.169.254/latest/meta-data/", [("169.254.169.254", "deny", "metadata 169.254.169.254")],
             "http.fetch address 169.254.169.254 is blocked (metadata 169.254.169.254)"),
            ("http://[64:ff9b::a00:1]/", [("64:ff9b::a00:1", "deny", "nat64 64:ff9b::/96 embeds private 10.0.0.0/8")],
             "http.fetch address 64:ff9b::a00:1 is blocked (nat64 64:ff9b::/96 embeds private 10.0.0.0/8)"),
            ("http://localhost/", [], 'http.fetch host "localhost" is blocked (reserved name localhost)'),
        ]
        for u, answers, reason in cases:
            with self.subTest(url=u):
                rc, out, err = egress_check(u)
                self.assertEqual(rc, 1, out + err)
                lines = check_lines(out)
                self.assertEqual(lines[0], "decision: deny")
                self.assertEqual(answers_of(out), answers)
                self.assertEqual(lines[-1], "reason: " + reason)
        rc, out, err = egress_check("http://[64:ff9b::808:808]/")
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(answers_of(out), [("64:ff9b::808:808", "allow", "nat64 64:ff9b::/96 embeds global unicast")])

    def test_invalid_url(self):
        for u, why in (("http://2130706433/", "non-canonical IPv4 address"), ("http://a@public.test/", "userinfo is not allowed")):
            with self.subTest(url=u):
                rc, out, err = egress_check(u)
                self.assertEqual(rc, 1, out + err)
                self.assertEqual(check_lines(out), ["decision: deny", "reason: url is invalid: " + why])

    def test_dns_failure(self):
        rc, out, err = egress_check("http://nx.test/")
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(check_lines(out), ["decision: deny", "url: http://nx.test:80/",
                                            'reason: DNS resolution failed for "nx.test": NXDOMAIN'])

    def test_usage(self):
        for args in ((), ("--config", CONFIG_PATH), ("--bogus", "http://public.test/")):
            with self.subTest(args=args):
                rc, out, err = sbtest.run_broker_once(["egress-check"] + list(args), sbtest.base_env())
                self.assertEqual(rc, 2, out + err)
                self.assertEqual(out, "")
                self.assertIn("usage: sandbox-broker egress-check", err)


if __name__ == "__main__":
    sbtest.main()

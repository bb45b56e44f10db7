#!/usr/bin/python3
"""Secrets the guest never sees (PROTOCOL.md section 5, "Secrets"), and method/path rules for net entries.

Everything runs on loopback: dnsmasq maps the test names to 127.0.0.1, and recording upstreams
(fetchfix_upstream) on 127.0.0.1, plain and TLS (a throw-away CA made with the openssl CLI), keep
every request byte they receive, so each test states exactly what was sent on each hop, and that
nothing at all was sent when a secret is refused.
"""

import base64
import hashlib
import gzip
import json
import os
import re
import sys
import tempfile
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from fetchfix_dns import Dnsmasq  # noqa: E402
from fetchfix_upstream import TestPki, Upstream  # noqa: E402

SECRET = "ghp_S3cr3tV4lue-0123456789abcdefXYZ"
FILE_SECRET = "file-secret-value-7d1e9a0c44"
ENV_SECRET = "env-secret-value-93bb1f0e7a"
PH = "{{secret:gh}}"
EXEC_MSG = "sandbox binding operation failed"

HOST_RECORDS = ["ok.test,127.0.0.1", "ok2.test,127.0.0.1", "tls.test,127.0.0.1", "other.test,127.0.0.1"]

DNS = PKI = B = None
UP = {}
TMP = None
AUDIT = None


def echo_route(h, rec):
    """Echoes what it received, and the secret in every form an upstream might hand it back in."""
    auth = rec.header_values("authorization")
    val = SECRET if auth and SECRET in auth[0] else "none"
    body = json.dumps({
        "authorization": auth,
        "raw": val,
        "b64": base64.b64encode(val.encode()).decode(),
        "basic": base64.b64encode(("user:" + val).encode()).decode(),
        "b64url": base64.urlsafe_b64encode(("xy" + val).encode()).decode(),
        "pct": urllib.parse.quote(val + "/?&", safe=""),
        "pct_lower": re.sub("%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(val + "/", safe="")),
        "folded": ("Bearer " + val).lower(),
    }).encode()
    h.reply(200, body, [("Content-Type", "application/json"), ("X-Echo", "Bearer " + val),
                        ("X-" + (val if val != "none" else "Plain"), "name")], reason="OK " + val)


def gzip_route(h, rec):
    """Echoes the authorization header gzipped, whatever the request asked for (as a careless server might)."""
    auth = (rec.header_values("authorization") or ["none"])[0]
    h.reply(200, gzip.compress(auth.encode()), [("Content-Encoding", "gzip"), ("Content-Type", "text/plain")])


def partial_route(h, rec):
    """Answers 206 with a slice of the echoed authorization header."""
    auth = (rec.header_values("authorization") or ["none"])[0]
    h.reply(206, auth[7:12].encode(), [("Content-Range", "bytes 7-11/%d" % len(auth))])


def redirect_to(location, status=302):
    def route(h, rec):
        h.reply(status, b"", [("Location", location)])
    return route


def setUpModule():
    global DNS, PKI, B, TMP, AUDIT
    try:
        PKI = TestPki().make()
        DNS = Dnsmasq(HOST_RECORDS).start()
        UP["a"] = Upstream().start()  # ok.test
        UP["b"] = Upstream().start()  # ok2.test
        UP["tls"] = Upstream(tls=PKI.server_context(PKI.tls_leaf)).start()  # tls.test
        UP["other"] = Upstream(tls=PKI.server_context(PKI.other_leaf)).start()  # other.test
        for up in UP.values():
            up.route("/echo", echo_route)
            up.route("/repos/acme/echo", echo_route)
            up.route("/other/echo", echo_route)
            up.route("/gzip", gzip_route)
            up.route("/partial", partial_route)
        TMP = tempfile.mkdtemp(prefix="sbsecrets-")
        AUDIT = os.path.join(TMP, "audit.log")
        with open(os.path.join(TMP, "filekey"), "w") as f:
            f.write(FILE_SECRET + "\n")
        B = sbtest.Broker(config=config(), env={"SANDBOX_BROKER_THREADS": "2", "SECRETS_TEST_ENV": ENV_SECRET}).start()
    except BaseException:
        cleanup()
        raise


def config(extra_target=None):
    target = {"secrets": {
        "filekey": {"value_file": os.path.join(TMP, "filekey"), "hosts": ["ok.test:%d" % UP["a"].port], "schemes": ["http"]},
        "envkey": {"value_env": "SECRETS_TEST_ENV", "hosts": ["ok.test:%d" % UP["a"].port], "schemes": ["http"],
                   "headers": ["x-api-key"]},
    }}
    if extra_target is not None:
        target["secrets"].update(extra_target)
    return {"egress": {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False,
                       "ca_file": PKI.ca_file, "deadline_ms": 3000, "connect_timeout_ms": 1000},
            "audit": AUDIT, "targets": {"app": target}}


def cleanup():
    global B
    errors = []
    if B is not None:
        rc = B.stop()
        log = B.log()
        if rc != 0:
            errors.append("broker exited with %s:\n%s" % (rc, log[-4000:]))
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            if marker in log:
                errors.append("sanitizer report:\n%s" % log[-12000:])
        B = None
    for up in UP.values():
        up.stop()
    UP.clear()
    if DNS is not None:
        DNS.stop()
    if PKI is not None:
        PKI.cleanup()
    if TMP is not None:
        import shutil
        shutil.rmtree(TMP, ignore_errors=True)
    if errors:
        raise AssertionError("\n".join(errors))


def tearDownModule():
    cleanup()


def origin(name, up, scheme=None):
    scheme = scheme or ("https" if UP[up].tls is not None else "http")
    return "%s://%s:%d" % (scheme, name, UP[up].port)


def hp(name, up):
    return "%s:%d" % (name, UP[up].port)


class SecretsCase(sbtest.BrokerTestCase):
    _n = 0

    def setUp(self):
        for up in UP.values():
            up.reset()

    def mint(self, secrets, net, broker=None, **fields):
        SecretsCase._n += 1
        caps = fields.pop("capabilities", {"net": net})
        return (broker or B).mint("%s-%d" % (self._testMethodName, SecretsCase._n), caps, secrets=secrets, **fields)

    def token(self, secrets, net, broker=None, **fields):
        r = self.mint(secrets, net, broker=broker, **fields)
        self.assertEqual(r.status, 201, r)
        return r.body["token"]

    def fetch(self, tok, url, headers, method=None, broker=None, enc="json"):
        args = {"url": url, "headers": headers}
        if method is not None:
            args["method"] = method
        return (broker or B).rpc(tok, "http.fetch", args, enc=enc, timeout=20)

    def gh(self, **rules):
        s = {"value": SECRET, "hosts": [hp("tls.test", "tls")]}
        s.update(rules)
        return {"gh": s}

    def assertNothingSent(self, *names):
        for n in names or UP.keys():
            self.assertEqual(UP[n].snapshot(), [], n)
            self.assertEqual(UP[n].connections, 0, n)

    def assertNoValue(self, data):
        if isinstance(data, str):
            data = data.encode()
        for v in (SECRET, base64.b64encode(SECRET.encode()).decode(), urllib.parse.quote(SECRET, safe="")):
            self.assertNotIn(v.encode(), data)


class Injection(SecretsCase):
    def test_injected_over_https_and_redacted(self):
        tok = self.token(self.gh(), [hp("tls.test", "tls")])
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"Authorization": "Bearer " + PH})
        self.assertEqual(r.status, 200, r)
        reqs = UP["tls"].snapshot()
        self.assertEqual(len(reqs), 1)
        self.assertEqual(reqs[0].header("authorization"), "Bearer " + SECRET)
        # the guest gets placeholders in every place the value came back
        self.assertNoValue(r.raw)
        v = r.body["value"]
        self.assertEqual(v["statusText"], "OK " + PH)
        self.assertEqual(v["headers"]["x-echo"], "Bearer " + PH)
        # a header whose name held the value is dropped (a placeholder is no header name)
        self.assertEqual(sorted(v["headers"]), ["content-length", "content-type", "x-echo"])
        body = json.loads(base64.b64decode(v["bodyBase64"]))
        self.assertEqual(body["authorization"], ["Bearer " + PH])
        self.assertEqual(body["raw"], PH)
        self.assertEqual(body["b64"], PH)
        self.assertNotIn(SECRET, base64.b64decode(body["basic"] + "==", validate=False).decode("latin-1"))
        self.assertIn(PH, body["basic"])
        self.assertIn(PH, body["b64url"])
        self.assertTrue(body["pct"].startswith(PH), body["pct"])
        self.assertTrue(body["pct_lower"].startswith(PH), body["pct_lower"])
        self.assertEqual(body["folded"], "bearer " + PH)

    def test_msgpack_too(self):
        tok = self.token(self.gh(), [hp("tls.test", "tls")])
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": "token " + PH}, enc="msgpack")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(UP["tls"].snapshot()[0].header("authorization"), "token " + SECRET)
        self.assertNoValue(r.raw)
        self.assertEqual(r.body["value"]["headers"]["x-echo"], "Bearer " + PH)

    def test_plain_http_needs_the_scheme(self):
        net = [hp("ok.test", "a")]
        tok = self.token({"k": {"value": SECRET, "hosts": net}}, net)
        r = self.fetch(tok, origin("ok.test", "a") + "/echo", {"authorization": "{{secret:k}}"})
        self.assertError(r, 403, "forbidden", 'http.fetch secret "k" may not be sent over http (secret schemes rule)')
        self.assertNothingSent()
        tok = self.token({"k": {"value": SECRET, "hosts": net, "schemes": ["http", "https"]}}, net)
        r = self.fetch(tok, origin("ok.test", "a") + "/echo", {"authorization": "{{secret:k}}"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(UP["a"].snapshot()[0].header("authorization"), SECRET)
        self.assertNoValue(r.raw)

    def test_refusals_send_nothing(self):
        net = [hp("tls.test", "tls"), hp("other.test", "other")]
        cases = [
            ("wrong host", self.gh(), origin("other.test", "other") + "/echo", {"authorization": PH}, None,
             'http.fetch secret "gh" may not be sent to host "%s" (secret hosts rule)' % hp("other.test", "other")),
            ("wrong header", self.gh(), origin("tls.test", "tls") + "/echo", {"x-api-key": PH}, None,
             'http.fetch secret "gh" may not be sent in header "x-api-key" (secret headers rule)'),
            ("wrong method", self.gh(methods=["GET"]), origin("tls.test", "tls") + "/echo", {"authorization": PH}, "POST",
             'http.fetch secret "gh" may not be sent with method "POST" (secret methods rule)'),
            ("wrong path", self.gh(paths=["/repos/acme/**"]), origin("tls.test", "tls") + "/other/echo",
             {"authorization": PH}, None, 'http.fetch secret "gh" may not be sent to this path (secret paths rule)'),
            ("encoded path", self.gh(paths=["/repos/acme/**"]), origin("tls.test", "tls") + "/repos/acme/..%2Fother",
             {"authorization": PH}, None,
             "http.fetch secret \"gh\" may not be sent: the path has an encoded '/', '\\', '.' or '%', a ';', or a dot segment "
             "(secret paths rule)"),
            ("unknown name", self.gh(), origin("tls.test", "tls") + "/echo", {"authorization": "{{secret:nope}}"}, None,
             'http.fetch secret "nope" is not granted to this run'),
            ("second placeholder unknown", self.gh(), origin("tls.test", "tls") + "/echo",
             {"authorization": PH, "x-other": "{{secret:nope}}"}, None, 'http.fetch secret "nope" is not granted to this run'),
        ]
        for label, secrets, url, headers, method, reason in cases:
            with self.subTest(label):
                for up in UP.values():
                    up.reset()
                tok = self.token(secrets, net)
                r = self.fetch(tok, url, headers, method=method)
                self.assertError(r, 403, "forbidden", reason)
                self.assertNothingSent()
                self.assertNoValue(r.raw)

    def test_run_without_secrets_cannot_use_a_placeholder(self):
        tok = sbtest.Broker.mint_ok(B, "nosecrets-%d" % time.monotonic_ns(), {"net": [hp("tls.test", "tls")]})
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": PH})
        self.assertError(r, 403, "forbidden", 'http.fetch secret "gh" is not granted to this run')
        self.assertNothingSent()

    def test_no_content_coding_no_range_no_method_override(self):
        """Redaction needs the value's bytes whole and in the clear: a run with secrets asks for no coding and
        no range, and a coded or partial answer is refused (execution_error), never handed to the guest."""
        tok = self.token(self.gh(), [hp("tls.test", "tls")])
        sneaky = {"Authorization": "Bearer " + PH, "Accept-Encoding": "gzip, br", "Range": "bytes=7-11",
                  "If-Range": "x", "X-HTTP-Method-Override": "DELETE"}
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", sneaky)
        self.assertEqual(r.status, 200, r)
        req = UP["tls"].snapshot()[0]
        self.assertEqual(req.header_values("accept-encoding"), ["identity"])
        for name in ("range", "if-range", "x-http-method-override"):
            self.assertEqual(req.header_values(name), [], name)
        for path in ("/gzip", "/partial"):
            r = self.fetch(tok, origin("tls.test", "tls") + path, {"Authorization": "Bearer " + PH})
            self.assertError(r, 500, "execution_error")
            self.assertNoValue(r.raw)
            self.assertNotIn(gzip.compress(SECRET.encode())[10:20], r.raw)
        # a run without secrets is left as it asked
        plain = B.mint_ok("%s-plain" % self._testMethodName, {"net": [hp("tls.test", "tls")]})
        r = self.fetch(plain, origin("tls.test", "tls") + "/echo", {"Accept-Encoding": "gzip", "Range": "bytes=0-1"})
        self.assertEqual(r.status, 200, r)
        req = UP["tls"].snapshot()[-1]
        self.assertEqual((req.header_values("accept-encoding"), req.header_values("range")), (["gzip"], ["bytes=0-1"]))

    def test_malformed_placeholder_is_refused(self):
        tok = self.token(self.gh(), [hp("tls.test", "tls")])
        for value in ("{{secret:gh}", "{{secret:}}", "{{secret:bad name}}", "x {{secret:" + "a" * 65 + "}}"):
            with self.subTest(value):
                r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": value})
                self.assertError(r, 400, "bad_args", 'http.fetch header "authorization" has a malformed secret placeholder')
        self.assertNothingSent()

    def test_two_secrets_in_one_value(self):
        net = [hp("tls.test", "tls")]
        secrets = self.gh()
        secrets["two"] = {"value": "second-value-5150", "hosts": net}
        tok = self.token(secrets, net)
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": "Basic " + PH + ":{{secret:two}}"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(UP["tls"].snapshot()[0].header("authorization"), "Basic %s:second-value-5150" % SECRET)
        self.assertNotIn(b"second-value-5150", r.raw)


class Redirects(SecretsCase):
    def test_same_origin_redirect_keeps_the_secret(self):
        UP["tls"].route("/hop", redirect_to("/echo"))
        tok = self.token(self.gh(), [hp("tls.test", "tls")])
        r = self.fetch(tok, origin("tls.test", "tls") + "/hop", {"authorization": "Bearer " + PH})
        self.assertEqual(r.status, 200, r)
        reqs = UP["tls"].snapshot()
        self.assertEqual([x.target for x in reqs], ["/hop", "/echo"])
        self.assertEqual([x.header("authorization") for x in reqs], ["Bearer " + SECRET] * 2)
        self.assertNoValue(r.raw)

    def test_cross_origin_redirect_drops_the_header(self):
        # the secret names both hosts, and still the hop to the other origin never carries it
        target = origin("other.test", "other") + "/echo"
        UP["tls"].route("/away", redirect_to(target, 307))
        net = [hp("tls.test", "tls"), hp("other.test", "other")]
        tok = self.token({"gh": {"value": SECRET, "hosts": net, "headers": ["authorization", "x-key"]}}, net)
        r = self.fetch(tok, origin("tls.test", "tls") + "/away", {"authorization": "Bearer " + PH, "x-key": PH,
                                                                   "x-plain": "kept"})
        self.assertEqual(r.status, 200, r)
        first, = UP["tls"].snapshot()
        self.assertEqual(first.header("authorization"), "Bearer " + SECRET)
        self.assertEqual(first.header("x-key"), SECRET)
        second, = UP["other"].snapshot()
        self.assertEqual(second.header_values("authorization"), [])
        self.assertEqual(second.header_values("x-key"), [])
        self.assertEqual(second.header("x-plain"), "kept")
        for k, v in second.headers:
            self.assertNotIn(SECRET, v)
            self.assertNotIn("{{secret:", v)

    def test_same_origin_redirect_outside_the_paths_rule_is_refused(self):
        UP["tls"].route("/repos/acme/hop", redirect_to("/other/echo"))
        tok = self.token(self.gh(paths=["/repos/acme/**"]), [hp("tls.test", "tls")])
        r = self.fetch(tok, origin("tls.test", "tls") + "/repos/acme/hop", {"authorization": PH})
        self.assertError(r, 403, "forbidden", 'http.fetch secret "gh" may not be sent to this path (secret paths rule)')
        self.assertEqual([x.target for x in UP["tls"].snapshot()], ["/repos/acme/hop"])

    def test_location_carrying_the_value_is_redacted_before_it_is_followed(self):
        # an upstream that puts the credential into a redirect to the guest's own (allowlisted) host
        net = [hp("tls.test", "tls"), hp("ok2.test", "b")]

        def leak(h, rec):
            h.reply(302, b"", [("Location", origin("ok2.test", "b") + "/echo?k=" + rec.header("authorization"))])
        UP["tls"].route("/leak", leak)
        tok = self.token(self.gh(), net)
        r = self.fetch(tok, origin("tls.test", "tls") + "/leak", {"authorization": PH})
        self.assertEqual(r.status, 200, r)
        hop2, = UP["b"].snapshot()
        self.assertNotIn(SECRET, hop2.target)
        self.assertIn("secret", urllib.parse.unquote(hop2.target))


class Leaks(SecretsCase):
    def audit_lines(self):
        with open(AUDIT) as f:
            return [x for x in f.read().splitlines() if '"http.fetch"' in x and self._testMethodName in x]

    def test_value_in_no_log_audit_or_metric(self):
        before = len(self.audit_lines())
        tok = self.token(self.gh(), [hp("tls.test", "tls"), hp("other.test", "other")])
        self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": PH})
        self.fetch(tok, origin("other.test", "other") + "/echo", {"authorization": PH})
        self.fetch(tok, origin("tls.test", "tls") + "/nope", {"authorization": "{{secret:gh}}{{secret:zz}}"})
        # refused while its args are decoded, after one placeholder was found: the audit line still names it
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": PH, "x-bad": "{{secret:"})
        self.assertError(r, 400, "bad_args", 'http.fetch header "x-bad" has a malformed secret placeholder')
        metrics = sbtest.http_request(B.admin_port, "GET", "/metrics")
        self.assertNoValue(metrics.raw)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(self.audit_lines()) < before + 4:
            time.sleep(0.05)
        with open(AUDIT) as f:
            self.assertNoValue(f.read())
        self.assertNoValue(B.log())
        lines = [json.loads(x) for x in self.audit_lines()[before:]]
        self.assertEqual(len(lines), 4, lines)
        self.assertEqual([x["secrets"] for x in lines], ["gh", "gh", "gh,zz", "gh"])
        self.assertEqual([x["code"] for x in lines], ["ok", "forbidden", "forbidden", "bad_args"])

    def test_memory_holding_a_value_is_wiped_when_freed(self):
        """After a run that used a secret (with an upstream echoing it back) is revoked, no byte string of
        the value is left anywhere in the broker's memory: the token record, the mint body, jansson's
        buffers, the request, the response head, body and socket buffer were all wiped. The upstream
        answers in one write: when a response arrives in several reads, h2o may move the socket buffer
        (copying what is unread and freeing the old block unwiped), which this broker cannot reach."""
        value = "wipe-check-" + os.urandom(12).hex()

        def mirror(h, rec):
            # one write: a response the broker reads in one piece (see the docstring)
            a = rec.header("authorization").encode()
            body = b"echo " + a
            h.raw(b"HTTP/1.1 200 OK\r\nX-Echo: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (a, len(body), body))
        UP["a"].route("/mirror", mirror)
        net = [hp("ok.test", "a")]
        SecretsCase._n += 1
        run = "wipe-%d" % SecretsCase._n
        tok = B.mint_ok(run, {"net": net}, secrets={"w": {"value": value, "hosts": net, "schemes": ["http"]}})
        r = self.fetch(tok, origin("ok.test", "a") + "/mirror", {"authorization": "Bearer {{secret:w}}"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(UP["a"].snapshot()[0].header("authorization"), "Bearer " + value)
        self.assertNotIn(value.encode(), r.raw)
        self.assertGreater(self.count_in_memory(B.proc.pid, value.encode()), 0, "the scan finds a live value")
        self.assertEqual(B.revoke_run(run).status, 204)
        self.assertTrue(sbtest.poll(lambda: self.count_in_memory(B.proc.pid, value.encode()) == 0, 5),
                        "a copy of the value is left in the broker's memory")

    @staticmethod
    def count_in_memory(pid, needle):
        """Occurrences of needle in the process's readable private memory, read in overlapping chunks.
        Mappings over 1 GiB are left out: under ASan those are the shadow (1/8 of the address space,
        reserved, never holding data); the heap, stacks and data segments are far smaller."""
        n, chunk = 0, 16 << 20
        with open("/proc/%d/maps" % pid) as maps, open("/proc/%d/mem" % pid, "rb", 0) as mem:
            for line in maps:
                f = line.split()
                if not f[1].startswith("r") or (len(f) > 5 and f[5] in ("[vvar]", "[vsyscall]")):
                    continue
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                if hi - lo > 1 << 30:
                    continue
                at = lo
                while at < hi:
                    try:
                        mem.seek(at)
                        data = mem.read(min(chunk + len(needle), hi - at))
                    except (OSError, ValueError, OverflowError):
                        break  # a mapping that cannot be read (guard pages)
                    n += data.count(needle)
                    at += chunk
        return n

    def test_a_parked_connection_holds_no_value_and_serves_no_other_run(self):
        """Kept-alive reuse (on by default) with a run that holds secrets: the connection that carried the
        value is parked with its read buffer wiped, so once the run is revoked no copy of the value is
        left while the connection is still parked; the run's next fetch takes it, another run's fetch to
        the same origin never does (the pool keys connections on the token). One worker and a long idle
        time, so that the parked connection is there for each step."""
        value = "park-check-" + os.urandom(12).hex()

        def mirror(h, rec):
            # kept alive, in one write (see test_memory_holding_a_value_is_wiped_when_freed)
            a = (rec.header("authorization") or "").encode()
            body = b"echo " + a
            h.raw(b"HTTP/1.1 200 OK\r\nX-Echo: %s\r\nContent-Length: %d\r\n\r\n%s" % (a, len(body), body), close=False)
        UP["a"].route("/mirror-ka", mirror)
        conf = config()
        conf["egress"].update({"keepalive_pool_size": 4, "keepalive_idle_ms": 60000})
        b = sbtest.Broker(config=conf, env={"SANDBOX_BROKER_THREADS": "1", "SANDBOX_BROKER_TOKEN_STORE": "memory",
                                            "SECRETS_TEST_ENV": ENV_SECRET}).start()
        try:
            net = [hp("ok.test", "a")]
            tok = b.mint_ok("park-1", {"net": net}, secrets={"w": {"value": value, "hosts": net, "schemes": ["http"]}})
            other = b.mint_ok("park-2", {"net": net})
            url = origin("ok.test", "a") + "/mirror-ka"
            for _ in range(2):
                r = self.fetch(tok, url, {"authorization": "Bearer {{secret:w}}"}, broker=b)
                self.assertEqual(r.status, 200, r)
                self.assertNotIn(value.encode(), r.raw)
            r = self.fetch(other, url, {"authorization": "Bearer none"}, broker=b)
            self.assertEqual(r.status, 200, r)
            recs = UP["a"].snapshot()
            self.assertEqual([x.header("authorization") for x in recs], ["Bearer " + value] * 2 + ["Bearer none"])
            self.assertEqual(recs[0].conn_id, recs[1].conn_id, "the run's second fetch reuses its parked connection")
            self.assertNotEqual(recs[2].conn_id, recs[0].conn_id, "another run never takes it")
            self.assertGreater(self.count_in_memory(b.proc.pid, value.encode()), 0, "the scan finds a live value")
            self.assertEqual(b.revoke_run("park-1").status, 204)
            self.assertTrue(sbtest.poll(lambda: self.count_in_memory(b.proc.pid, value.encode()) == 0, 5),
                            "a copy of the value is left in the broker's memory")
        finally:
            rc = b.stop()
            log = b.log()
        self.assertEqual(rc, 0, log[-4000:])
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            self.assertNotIn(marker, log)
        self.assertNotIn(value, log)

    def test_mint_validation(self):
        net = [hp("tls.test", "tls")]
        good = {"value": SECRET, "hosts": net}
        cases = [
            ([], "secrets: expected an object"),
            ({"bad name": good}, "secrets.bad name: expected a name of [A-Za-z0-9_.-]{1,64}"),
            ({"a" * 65: good}, "secrets.%s: expected a name of [A-Za-z0-9_.-]{1,64}" % ("a" * 64)),
            ({"s%d" % i: good for i in range(33)}, "secrets: more than 32 secrets"),
            ({"gh": "x"}, "secrets.gh: expected an object"),
            ({"gh": {"hosts": net}}, "secrets.gh.value: expected a string of 1-8192 bytes"),
            ({"gh": dict(good, value="")}, "secrets.gh.value: expected a string of 1-8192 bytes"),
            ({"gh": dict(good, value="x" * 8193)}, "secrets.gh.value: expected a string of 1-8192 bytes"),
            ({"gh": dict(good, value="a\nb")}, "secrets.gh.value: must not contain CR, LF or NUL"),
            ({"gh": dict(good, value="a\rb")}, "secrets.gh.value: must not contain CR, LF or NUL"),
            # a NUL escape is refused by the mint body's JSON reader before any key is looked at
            ({"gh": dict(good, value="a\u0000b")}, "invalid JSON body"),
            ({"gh": {"value": SECRET}}, "secrets.gh.hosts: expected a non-empty array of net entries"),
            ({"gh": dict(good, hosts=[])}, "secrets.gh.hosts: expected a non-empty array of net entries"),
            ({"gh": dict(good, hosts=["a/b"])}, "secrets.gh.hosts[0]: '/' is not allowed"),
            ({"gh": dict(good, hosts=["other.test"])}, "secrets.gh.hosts[0]: the host is not in capabilities.net"),
            ({"gh": dict(good, hosts=["tls.test"])}, "secrets.gh.hosts[0]: the host is not in capabilities.net"),
            ({"gh": dict(good, headers=[])}, "secrets.gh.headers: expected an array of 1-256 header names"),
            ({"gh": dict(good, headers=["bad header"])}, "secrets.gh.headers[0]: expected a header name"),
            ({"gh": dict(good, methods=["get"])}, "secrets.gh.methods[0]: expected an uppercase HTTP method"),
            ({"gh": dict(good, paths=["x"])}, "secrets.gh.paths[0]: expected a glob starting with '/'"),
            ({"gh": dict(good, schemes=["ftp"])}, "secrets.gh.schemes[0]: expected \"http\" or \"https\""),
            ({"gh": dict(good, schemes=[])}, "secrets.gh.schemes: expected an array of \"http\" and/or \"https\""),
            ({"gh": dict(good, value_file="/x")}, "secrets.gh.value_file: unknown key"),
        ]
        for secrets, message in cases:
            with self.subTest(message):
                r = self.mint(secrets, net)
                self.assertError(r, 400, "bad_args", message)
                self.assertNotIn(SECRET.encode(), r.raw)
        self.assertNoValue(B.log())

    def test_value_at_the_cap_and_wildcard_cover(self):
        net = ["*.test"]
        tok = self.token({"gh": {"value": "v" * 8192, "hosts": ["tls.test:%d" % UP["tls"].port, "*.sub.test"]}}, net)
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": PH})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(UP["tls"].snapshot()[0].header("authorization"), "v" * 8192)


class NetRules(SecretsCase):
    def test_method_and_path_rules(self):
        entry = {"host": hp("ok.test", "a"), "methods": ["GET"], "paths": ["/repos/acme/**"]}
        tok = B.mint_ok("rules-%d" % time.monotonic_ns(), {"net": [entry]})
        base = origin("ok.test", "a")
        r = B.rpc(tok, "http.fetch", {"url": base + "/repos/acme/echo"})
        self.assertEqual(r.status, 200, r)
        refused = [
            ({"url": base + "/repos/acme/echo", "method": "DELETE"},
             'http.fetch method "DELETE" is not allowed for host "%s" (net methods rule)' % hp("ok.test", "a")),
            ({"url": base + "/other/echo"}, 'http.fetch path is not allowed for host "%s" (net paths rule)' % hp("ok.test", "a")),
            ({"url": base + "/repos/acme/..%2f..%2fother/echo"},
             "http.fetch path for host \"%s\" has an encoded '/', '\\', '.' or '%%', a ';', or a dot segment (net paths rule)"
             % hp("ok.test", "a")),
            ({"url": base + "/repos/acme/%2E%2E/x"},
             "http.fetch path for host \"%s\" has an encoded '/', '\\', '.' or '%%', a ';', or a dot segment (net paths rule)"
             % hp("ok.test", "a")),
            ({"url": base + "/repos/acme/a%5Cb"},
             "http.fetch path for host \"%s\" has an encoded '/', '\\', '.' or '%%', a ';', or a dot segment (net paths rule)"
             % hp("ok.test", "a")),
        ]
        for args, reason in refused:
            with self.subTest(args["url"]):
                UP["a"].reset()
                r = B.rpc(tok, "http.fetch", args)
                self.assertError(r, 403, "forbidden", reason)
                self.assertNothingSent("a")

    def test_redirect_from_an_allowed_path_to_a_refused_one(self):
        UP["a"].route("/repos/acme/go", redirect_to("/other/echo"))
        entry = {"host": hp("ok.test", "a"), "paths": ["/repos/acme/**"]}
        tok = B.mint_ok("rules-redir-%d" % time.monotonic_ns(), {"net": [entry]})
        r = B.rpc(tok, "http.fetch", {"url": origin("ok.test", "a") + "/repos/acme/go"})
        self.assertError(r, 500, "execution_error")
        self.assertEqual([x.target for x in UP["a"].snapshot()], ["/repos/acme/go"])
        cid = r.body["error"]["correlationId"]
        want = 'http.fetch redirect path is not allowed for host \\"%s\\" (net paths rule)' % hp("ok.test", "a")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any('"egress.failed"' in line and cid in line and want in line
                                                      for line in B.log().splitlines()):
            time.sleep(0.05)
        self.assertTrue(any('"egress.failed"' in line and cid in line and want in line for line in B.log().splitlines()),
                        B.log()[-3000:])

    def test_egress_check_method(self):
        entry = json.dumps({"host": "ok.test", "methods": ["GET"]})
        path = os.path.join(TMP, "check.json")
        with open(path, "w") as f:
            json.dump({"egress": config()["egress"]}, f)
        rc, out, err = sbtest.run_broker_once(["egress-check", "--config", path, "--allow", entry, "--method", "post",
                                               "http://ok.test/x"], sbtest.base_env())
        self.assertEqual(rc, 1, out + err)
        self.assertIn("method: POST\n", out)
        self.assertIn('rule: http.fetch method "POST" is not allowed for host "ok.test:80" (net methods rule)\n', out)
        rc, out, err = sbtest.run_broker_once(["egress-check", "--config", path, "--allow", entry, "--method", "GET",
                                               "http://ok.test/x"], sbtest.base_env())
        self.assertEqual(rc, 0, out + err)
        self.assertIn("rule: allowed\n", out)


class Inspection(SecretsCase):
    def test_token_inspection_shows_rules_and_names_never_values(self):
        """GET /admin/v1/tokens/<t> (PROTOCOL.md section 9): net entries with rules in their object form,
        the secrets axis and the names of the secrets the run holds, never a value."""
        net = [{"host": hp("tls.test", "tls"), "methods": ["GET", "HEAD"], "paths": ["/repos/acme/**"]}, hp("ok.test", "a")]
        caps = {"net": net, "secrets": ["filekey"]}
        tok = self.token(self.gh(), net, target="app", capabilities=caps)
        r = B.admin("GET", "/admin/v1/tokens/" + tok)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body["capabilities"], caps)
        self.assertEqual(sorted(r.body["secrets"]), ["filekey", "gh"])
        self.assertNoValue(r.raw)
        self.assertNotIn(FILE_SECRET.encode(), r.raw)
        # a manifest without rules or secrets shows neither
        tok = self.token(None, [hp("ok.test", "a")])
        r = B.admin("GET", "/admin/v1/tokens/" + tok)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body["capabilities"], {"net": [hp("ok.test", "a")]})
        self.assertNotIn("secrets", r.body)


class TargetSecrets(SecretsCase):
    def test_target_secrets_by_name(self):
        net = [hp("ok.test", "a")]
        tok = self.token(None, net, target="app", capabilities={"net": net, "secrets": ["filekey", "envkey"]})
        r = self.fetch(tok, origin("ok.test", "a") + "/echo", {"authorization": "{{secret:filekey}}",
                                                               "x-api-key": "{{secret:envkey}}"})
        self.assertEqual(r.status, 200, r)
        rec, = UP["a"].snapshot()
        self.assertEqual(rec.header("authorization"), FILE_SECRET)
        self.assertEqual(rec.header("x-api-key"), ENV_SECRET)
        self.assertNotIn(FILE_SECRET.encode(), r.raw)
        # omitted = none: the same target without the axis has no secret
        tok = self.token(None, net, target="app", capabilities={"net": net})
        r = self.fetch(tok, origin("ok.test", "a") + "/echo", {"authorization": "{{secret:filekey}}"})
        self.assertError(r, 403, "forbidden", 'http.fetch secret "filekey" is not granted to this run')

    def test_target_secret_errors(self):
        net = [hp("ok.test", "a")]
        r = self.mint(None, net, target="app", capabilities={"net": net, "secrets": ["missing"]})
        self.assertError(r, 400, "bad_args", 'capabilities.secrets[0]: the run\'s target has no secret named "missing"')
        r = self.mint(None, net, capabilities={"net": net, "secrets": ["filekey"]})
        self.assertError(r, 400, "bad_args", "capabilities.secrets[0]: the run has no target to take secrets from")
        r = self.mint(None, ["ok2.test"], target="app", capabilities={"net": ["ok2.test"], "secrets": ["filekey"]})
        self.assertError(r, 400, "bad_args", "capabilities.secrets[0].filekey.hosts[0]: the host is not in capabilities.net")
        r = self.mint({"filekey": {"value": "x", "hosts": net}}, net, target="app",
                      capabilities={"net": net, "secrets": ["filekey"]})
        self.assertError(r, 400, "bad_args", 'capabilities.secrets[0]: the run already has a secret named "filekey"')

    def test_reload_reads_values_again_and_fails_closed(self):
        import signal
        keyfile = os.path.join(TMP, "rotating")
        with open(keyfile, "w") as f:
            f.write("first-value-0001\n")
        cfg = config({"rot": {"value_file": keyfile, "hosts": [hp("ok.test", "a")], "schemes": ["http"]}})
        net = [hp("ok.test", "a")]
        with sbtest.Broker(config=cfg, env={"SECRETS_TEST_ENV": ENV_SECRET}) as b:
            def hup(event):
                before = b.log().count('"event":"%s"' % event)
                b.proc.send_signal(signal.SIGHUP)
                self.assertTrue(sbtest.poll(lambda: b.log().count('"event":"%s"' % event) > before, 10), b.log()[-3000:])

            def sent_with(tok):
                UP["a"].reset()
                r = self.fetch(tok, origin("ok.test", "a") + "/echo", {"authorization": "{{secret:rot}}"}, broker=b)
                self.assertEqual(r.status, 200, r)
                return UP["a"].snapshot()[0].header("authorization")
            caps = {"net": net, "secrets": ["rot"]}
            old = self.token(None, net, broker=b, target="app", capabilities=caps)
            self.assertEqual(sent_with(old), "first-value-0001")
            with open(keyfile, "w") as f:
                f.write("second-value-0002\n")
            hup("reload.applied")
            new = self.token(None, net, broker=b, target="app", capabilities=caps)
            self.assertEqual(sent_with(new), "second-value-0002")
            self.assertEqual(sent_with(old), "first-value-0001")  # a run keeps what it was minted with
            os.unlink(keyfile)
            hup("reload.rejected")
            self.assertIn("targets.app.secrets.rot.value_file: cannot open %s" % keyfile, b.log())
            self.assertEqual(sent_with(self.token(None, net, broker=b, target="app", capabilities=caps)), "second-value-0002")
            for v in ("first-value-0001", "second-value-0002"):
                self.assertNotIn(v, b.log())

    def test_check_config_fails_closed(self):
        cases = [
            ({"bad": {"value_file": os.path.join(TMP, "absent"), "hosts": ["ok.test"]}},
             "targets.app.secrets.bad.value_file: cannot open %s: No such file or directory" % os.path.join(TMP, "absent")),
            ({"bad": {"value_env": "SECRETS_TEST_UNSET", "hosts": ["ok.test"]}},
             "targets.app.secrets.bad.value_env: SECRETS_TEST_UNSET is not set"),
            ({"bad": {"value": "inline", "hosts": ["ok.test"]}}, "targets.app.secrets.bad.value: unknown key"),
            ({"bad": {"value_file": os.path.join(TMP, "filekey"), "value_env": "X", "hosts": ["ok.test"]}},
             "targets.app.secrets.bad: expected exactly one of value_file and value_env"),
        ]
        for extra, message in cases:
            with self.subTest(message):
                path = os.path.join(TMP, "bad.json")
                with open(path, "w") as f:
                    json.dump(config(extra), f)
                rc, out, err = sbtest.run_broker_once(["--config", path, "--check-config", "--offline"],
                                                      sbtest.base_env({"SECRETS_TEST_ENV": ENV_SECRET}))
                self.assertEqual(rc, 1, out + err)
                self.assertIn(message, err)
                self.assertNotIn(FILE_SECRET, out + err)
                self.assertNotIn(ENV_SECRET, out + err)


class RedisAtRest(SecretsCase):
    @classmethod
    def setUpClass(cls):
        cls.redis = sbtest.RedisServer().start()
        cls.keyfile = os.path.join(TMP, "secrets.key")
        with open(cls.keyfile, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        cls.env = {"SANDBOX_BROKER_TOKEN_STORE": cls.redis.url, "SANDBOX_BROKER_REDIS_PREFIX": "sbsec:",
                   "SANDBOX_BROKER_THREADS": "2"}
        cls.rb = sbtest.Broker(config=config(), env=dict(cls.env, SANDBOX_BROKER_SECRETS_KEY_FILE=cls.keyfile,
                                                         SECRETS_TEST_ENV=ENV_SECRET)).start()
        assert cls.rb.wait_store_up(2), cls.rb.log()[-3000:]

    @classmethod
    def tearDownClass(cls):
        cls.rb.stop()
        log = cls.rb.log()
        cls.redis.stop()
        assert "AddressSanitizer" not in log and "runtime error:" not in log, log[-8000:]
        assert SECRET not in log, "the value is in the broker log"

    def test_sealed_in_redis(self):
        net = [hp("tls.test", "tls")]
        r = self.mint(self.gh(), net, broker=self.rb)
        self.assertEqual(r.status, 201, r)
        tok = r.body["token"]
        raw = sbtest.redis_command(self.redis.port, "GET", "sbsec:tok:" + hashlib.sha256(tok.encode()).hexdigest())
        self.assertIsNotNone(raw)
        self.assertNoValue(raw)
        self.assertIn(b'"sealed"', raw)
        # and the broker opens it again on the call path
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": PH}, broker=self.rb)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(UP["tls"].snapshot()[0].header("authorization"), SECRET)
        self.assertNoValue(r.raw)

    def test_tampered_record_fails_closed(self):
        net = [hp("tls.test", "tls")]
        tok = self.mint(self.gh(), net, broker=self.rb).body["token"]
        key = "sbsec:tok:" + hashlib.sha256(tok.encode()).hexdigest()
        rec = json.loads(sbtest.redis_command(self.redis.port, "GET", key))
        sealed = base64.b64decode(rec["secrets"]["gh"]["sealed"])
        rec["secrets"]["gh"]["sealed"] = base64.b64encode(sealed[:-1] + bytes([sealed[-1] ^ 1])).decode()
        rec["mint"] = "0" * 32
        sbtest.redis_command(self.redis.port, "SET", key, json.dumps(rec, separators=(",", ":")))
        r = self.fetch(tok, origin("tls.test", "tls") + "/echo", {"authorization": PH}, broker=self.rb)
        self.assertEqual(r.status, 503, r)
        self.assertNothingSent()

    def test_widened_rules_fail_closed(self):
        """The rules are in the associated data: whoever can write to Redis but has no key cannot send a
        value to another host by editing the record's rules (and the run's net beside them)."""
        net = [hp("tls.test", "tls")]
        tok = self.mint(self.gh(), net, broker=self.rb).body["token"]
        key = "sbsec:tok:" + hashlib.sha256(tok.encode()).hexdigest()
        rec = json.loads(sbtest.redis_command(self.redis.port, "GET", key))
        self.assertIn("hosts", rec["secrets"]["gh"], rec["secrets"]["gh"])
        rec["secrets"]["gh"]["hosts"] = rec["secrets"]["gh"]["hosts"] + [hp("other.test", "other")]
        rec["capabilities"]["net"] = rec["capabilities"]["net"] + [hp("other.test", "other")]
        rec["mint"] = "1" * 32
        sbtest.redis_command(self.redis.port, "SET", key, json.dumps(rec, separators=(",", ":")))
        for name in ("other", "tls"):
            r = self.fetch(tok, origin(name + ".test" if name == "other" else "tls.test", name) + "/echo",
                           {"authorization": PH}, broker=self.rb)
            self.assertEqual(r.status, 503, r)
        self.assertNothingSent()

    def test_no_key_refuses_secrets(self):
        b = sbtest.Broker(env=self.env).start()
        try:
            self.assertTrue(b.wait_store_up(2), b.log()[-3000:])
            r = self.mint(self.gh(), [hp("tls.test", "tls")], broker=b)
            self.assertError(r, 400, "bad_args",
                             "secrets: the Redis token store has no secrets_key_file; a run with secrets cannot be stored")
            self.assertEqual(self.mint(None, ["x.test"], broker=b).status, 201)
            self.assertIn('"event":"secrets.disabled"', b.log())
        finally:
            self.assertEqual(b.stop(), 0)

    def test_bad_key_file(self):
        path = os.path.join(TMP, "short.key")
        with open(path, "w") as f:
            f.write("abcd\n")
        rc, out, err = sbtest.run_broker_once(["--check-config", "--offline"],
                                              sbtest.base_env(dict(self.env, SANDBOX_BROKER_SECRETS_KEY_FILE=path)))
        self.assertEqual(rc, 1, out + err)
        self.assertIn("secrets_key_file: %s holds neither 32 raw bytes nor 64 hex digits" % path, err)


if __name__ == "__main__":
    sbtest.main()

#!/usr/bin/python3
"""The admin listener (issue 2 "Tokens and the admin endpoint", "Configuration and
operation"): separation from the public listener, the admin secret, metrics,
health, and the start-up / --check-config refusals."""

import json
import os
import re
import socket
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from sbtest import ADMIN_SECRET  # noqa: E402

CAPS = {"services": ["mailer"]}
ADMIN_401 = "missing or wrong admin secret"


def parse_metrics(text):
    """{(name, ((label, value), ...)): float} from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        if m is None:
            raise AssertionError("bad metrics line: %r" % line)
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(3) or "")))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def L(**kw):
    return tuple(sorted(kw.items()))


class AdminSeparation(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.b = sbtest.Broker().start()

    @classmethod
    def tearDownClass(cls):
        rc = cls.b.stop()
        log = cls.b.log()
        if rc != 0:
            raise AssertionError("broker exited with %s:\n%s" % (rc, log[-4000:]))
        if ADMIN_SECRET in log:
            raise AssertionError("the admin secret appears in the log")

    def test_admin_paths_not_on_public_listener(self):
        tok = self.b.mint_ok("run-sep", CAPS)
        auth = {"Authorization": "Bearer " + ADMIN_SECRET, "Content-Type": "application/json"}
        mint_body = json.dumps({"runId": "run-sep-public", "capabilities": CAPS}).encode()
        cases = [
            ("POST", "/admin/v1/tokens", mint_body),
            ("GET", "/admin/v1/tokens", None),
            ("DELETE", "/admin/v1/tokens/" + tok, None),
            ("DELETE", "/admin/v1/runs/run-sep", None),
            ("GET", "/metrics", None),
            ("POST", "/api/sandbox/../../admin/v1/tokens", mint_body),
            ("POST", "//admin/v1/tokens", mint_body),
            ("POST", "/admin/v1/tokens?x=1", mint_body),
            ("POST", "/admin/v1/tokens/", mint_body),
            ("POST", "/%61dmin/v1/tokens", mint_body),
        ]
        for verb, path, body in cases:
            with self.subTest(verb=verb, path=path):
                r = self.b.public(verb, path, body=body, headers=auth)
                self.assertEqual(r.status, 404, r)
                self.assertNotIn(b"token", r.raw)
        # nothing above minted or revoked anything
        r = self.b.rpc(tok, "services.mailer.send", {})
        self.assertError(r, 501, "not_implemented", "services dispatch is not implemented")

    def test_rpc_not_on_admin_listener(self):
        tok = self.b.mint_ok("run-sep2", CAPS)
        r = sbtest.http_request(self.b.admin_port, "POST", sbtest.RPC_PATH,
                                body=b'{"method":"services.mailer.send"}',
                                headers={sbtest.TOKEN_HEADER: tok, "Content-Type": "application/json",
                                         "Authorization": "Bearer " + ADMIN_SECRET})
        self.assertEqual(r.status, 404, r)

    def test_admin_secret_required(self):
        tok = self.b.mint_ok("run-auth", CAPS)
        bad_headers = [
            {},
            {"Authorization": ""},
            {"Authorization": "Bearer"},
            {"Authorization": "Bearer "},
            {"Authorization": "Bearer wrong-secret-wrong-secret"},
            {"Authorization": "Bearer " + ADMIN_SECRET[:-1]},
            {"Authorization": "Bearer " + ADMIN_SECRET + "x"},
            {"Authorization": "Bearer " + ADMIN_SECRET.upper()},
            {"Authorization": "Bearer  " + ADMIN_SECRET},
            {"Authorization": "Basic " + ADMIN_SECRET},
            {"Authorization": ADMIN_SECRET},
            {"Authorization": "Token " + ADMIN_SECRET},
            {"X-Admin-Secret": ADMIN_SECRET},
            {"Cookie": "Authorization=Bearer " + ADMIN_SECRET},
        ]
        requests = [
            ("POST", "/admin/v1/tokens", json.dumps({"runId": "r-x", "capabilities": CAPS}).encode()),
            ("DELETE", "/admin/v1/tokens/" + tok, None),
            ("DELETE", "/admin/v1/runs/run-auth", None),
            ("GET", "/admin/v1/nothing-here", None),
        ]
        for hdrs in bad_headers:
            for verb, path, body in requests:
                with self.subTest(headers=hdrs, verb=verb, path=path):
                    h = dict(hdrs)
                    if body is not None:
                        h["Content-Type"] = "application/json"
                    r = sbtest.http_request(self.b.admin_port, verb, path, body, h)
                    self.assertError(r, 401, "unauthorized", ADMIN_401)
                    self.assertNotIn(b"token\"", r.raw)
        # the refused revocations revoked nothing
        r = self.b.rpc(tok, "services.mailer.send", {})
        self.assertError(r, 501, "not_implemented", "services dispatch is not implemented")

    def test_bearer_scheme_is_case_insensitive(self):
        for scheme in ("Bearer", "bearer", "BEARER"):
            with self.subTest(scheme=scheme):
                r = sbtest.http_request(self.b.admin_port, "POST", "/admin/v1/tokens",
                                        json.dumps({"runId": "r-case"}).encode(),
                                        {"Authorization": scheme + " " + ADMIN_SECRET,
                                         "Content-Type": "application/json"})
                self.assertEqual(r.status, 201, r)

    def test_unknown_admin_path(self):
        for verb, path in (("GET", "/admin/v1/nothing"), ("POST", "/admin/v2/tokens"), ("GET", "/admin/"),
                           ("DELETE", "/admin/v1/runs/")):
            with self.subTest(path=path):
                r = self.b.admin(verb, path)
                self.assertError(r, 404, "not_found", "no such admin endpoint")

    def test_health_and_ready(self):
        for port in (self.b.port, self.b.admin_port):
            with self.subTest(port=port):
                r = sbtest.http_request(port, "GET", "/healthz")
                self.assertEqual(r.status, 200, r)
                self.assertEqual(r.headers.get("content-type"), "application/json")
                self.assertEqual(r.body, {"ok": True})
                r = sbtest.http_request(port, "GET", "/readyz")
                self.assertEqual(r.status, 200, r)
                self.assertEqual(r.body, {"ok": True, "tokenStore": "up"})
                r = sbtest.http_request(port, "HEAD", "/healthz")
                self.assertEqual(r.status, 200, r)
                r = sbtest.http_request(port, "GET", "/nothing")
                self.assertEqual(r.status, 404, r)


class Metrics(sbtest.BrokerTestCase):
    """A fresh broker, so every counter is exact."""

    def setUp(self):
        self.b = sbtest.Broker().start()

    def tearDown(self):
        self.assertEqual(self.b.stop(), 0, self.b.log()[-4000:])

    def metrics(self):
        r = sbtest.http_request(self.b.admin_port, "GET", "/metrics")
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers.get("content-type", "").startswith("text/plain"), r.headers)
        text = r.raw.decode()
        self.assertIn("# TYPE sb_calls_total counter", text)
        self.assertIn("# TYPE sb_denials_total counter", text)
        self.assertIn("# TYPE sb_call_duration_seconds histogram", text)
        return parse_metrics(text)

    def test_metrics_count_calls_and_denials(self):
        tok = self.b.mint_ok("run-m", CAPS)
        tok2 = self.b.mint_ok("run-m2", CAPS)
        for enc in ("json", "msgpack", "json"):
            self.b.rpc(tok, "services.mailer.send", {}, enc=enc)
        for enc in ("json", "msgpack"):
            self.b.rpc(tok, "email.send", {}, enc=enc)
        self.b.rpc(tok, "services.other.x", {})
        self.b.rpc(None, "services.mailer.send", {})
        self.b.rpc(None, "services.mailer.send", {}, enc="msgpack")
        self.b.rpc("ab" * 32, "services.mailer.send", {})
        self.b.rpc(tok, "foo", {})
        self.b.rpc(tok, body=b"[]")
        self.b.rpc(tok, body=b'{"method":"email.send","args":"%s"}' % (b"x" * sbtest.NATIVE_REQUEST_CAP))
        self.assertEqual(self.b.revoke_token(tok2).status, 204)

        m = self.metrics()
        calls = {k[1]: v for k, v in m.items() if k[0] == "sb_calls_total"}
        self.assertEqual(calls, {
            L(kind="services", code="not_implemented", status="501"): 3,
            L(kind="email", code="forbidden", status="403"): 2,
            L(kind="services", code="forbidden", status="403"): 1,
            L(kind="invalid", code="unauthorized", status="401"): 3,
            L(kind="invalid", code="bad_method", status="400"): 1,
            L(kind="invalid", code="bad_args", status="400"): 1,
            L(kind="invalid", code="bad_args", status="413"): 1,
        })
        denials = {dict(k[1])["reason"]: v for k, v in m.items() if k[0] == "sb_denials_total"}
        self.assertEqual(denials["token_missing"], 2)
        self.assertEqual(denials["token_invalid"], 1)
        self.assertEqual(denials["axis_email"], 2)
        self.assertEqual(denials["axis_services"], 1)
        self.assertEqual(sum(denials.values()), 6)
        self.assertEqual(m[("sb_call_duration_seconds_count", ())], 12)
        self.assertEqual(m[("sb_call_duration_seconds_bucket", L(le="+Inf"))], 12)
        self.assertEqual(m[("sb_tokens_live", ())], 1)
        self.assertEqual(m[("sb_token_store_up", ())], 1)
        self.assertEqual(m[("sb_admin_requests_total", L(op="mint", **{"class": "2xx"}))], 2)
        self.assertEqual(m[("sb_admin_requests_total", L(op="revoke_token", **{"class": "2xx"}))], 1)

    def test_metrics_do_not_need_the_secret_but_live_only_on_admin(self):
        r = sbtest.http_request(self.b.admin_port, "GET", "/metrics")
        self.assertEqual(r.status, 200)
        r = sbtest.http_request(self.b.port, "GET", "/metrics")
        self.assertEqual(r.status, 404)


class StartupRefusals(unittest.TestCase):
    maxDiff = None

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="sbtest-admin-")

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, content):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def run_broker(self, args=(), env=None, secret=ADMIN_SECRET):
        return sbtest.run_broker_once(list(args), sbtest.base_env(env, secret=secret))

    def assertRefused(self, result, *needles, rc=1):
        code, out, err = result
        self.assertEqual(code, rc, (out, err))
        for n in needles:
            self.assertIn(n, err)

    def test_no_admin_secret(self):
        self.assertRefused(self.run_broker(secret=None), "SANDBOX_BROKER_ADMIN_SECRET")
        self.assertRefused(self.run_broker(secret=""), "SANDBOX_BROKER_ADMIN_SECRET")
        self.assertRefused(self.run_broker(["--check-config"], secret=None), "SANDBOX_BROKER_ADMIN_SECRET")

    def test_short_admin_secret(self):
        self.assertRefused(self.run_broker(secret="x" * 15), "admin secret: shorter than 16 bytes")
        path = self.write("secret", "short\n")
        self.assertRefused(self.run_broker(secret=None, env={"SANDBOX_BROKER_ADMIN_SECRET_FILE": path}),
                           "admin secret: shorter than 16 bytes")

    def test_secret_of_16_bytes_starts(self):
        b = sbtest.Broker(secret="s" * 16).start()
        try:
            self.assertEqual(b.mint("run-16").status, 201)
        finally:
            self.assertEqual(b.stop(), 0)

    def test_secret_file(self):
        secret = "file-secret-0123456789abcdef"
        path = self.write("secret", secret + "\n")
        b = sbtest.Broker(env={"SANDBOX_BROKER_ADMIN_SECRET_FILE": path}, secret=None)
        b.secret = secret
        b.start()
        try:
            self.assertEqual(b.mint("run-file").status, 201)
            r = b.admin("POST", "/admin/v1/tokens", {"runId": "x"}, secret=ADMIN_SECRET)
            self.assertEqual(r.status, 401)
        finally:
            self.assertEqual(b.stop(), 0)
        self.assertNotIn(secret, b.log())
        missing = os.path.join(self.tmp.name, "nope")
        self.assertRefused(self.run_broker(secret=None, env={"SANDBOX_BROKER_ADMIN_SECRET_FILE": missing}),
                           "admin_secret_file: cannot open " + missing)

    def test_check_config(self):
        good = self.write("good.json", {"listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "threads": 2,
                                        "token_store": "memory", "max_ttl_ms": 600000, "targets": {"app": {}},
                                        "rpc_path": "/api/sandbox/rpc", "log_calls": True})
        code, out, err = self.run_broker(["--check-config", "--config", good])
        self.assertEqual(code, 0, (out, err))
        self.assertIn("configuration OK", out)
        code, out, err = self.run_broker(["--check-config"])
        self.assertEqual(code, 0, (out, err))

        bad = self.write("bad.json", {"listen": "127.0.0.1:0", "bogus_key": 1})
        self.assertRefused(self.run_broker(["--check-config", "--config", bad]), bad + ": bogus_key: unknown key")
        # the same file is refused when starting for real
        self.assertRefused(self.run_broker(["--config", bad]), "bogus_key: unknown key")

        cases = [
            ({"threads": "two"}, "threads: expected an integer from 1 to 64"),
            ({"threads": 0}, "threads: expected an integer from 1 to 64"),
            ({"max_ttl_ms": 10}, "max_ttl_ms: expected an integer from 1000 to 604800000"),
            ({"listen": ""}, "listen: expected a non-empty string"),
            ({"log_calls": "yes"}, "log_calls: expected true or false"),
            ({"targets": []}, "targets: expected an object"),
            ({"targets": {"bad name": {}}}, "targets.bad name: target names are [A-Za-z0-9_-]{1,128}"),
            ({"max_ttl_ms": 60000, "default_ttl_ms": 120000}, "default_ttl_ms: larger than max_ttl_ms"),
            ({"rpc_path": "/admin/rpc"}, "rpc_path: expected an absolute path outside /admin, /healthz and /readyz"),
            ({"rpc_path": "relative"}, "rpc_path: expected an absolute path outside /admin, /healthz and /readyz"),
            ({"log_level": "loud"}, "log_level: expected debug, info, warn or error"),
            ({"token_store": "postgres://127.0.0.1/x"},
             'token_store: expected "memory", redis://host:port[/db] or unix:///path'),
            ({"token_store": "redis://redis.example.com:6379"},
             "token_store: the redis host must be an IP literal or localhost"),
        ]
        for content, needle in cases:
            with self.subTest(config=content):
                path = self.write("case.json", content)
                self.assertRefused(self.run_broker(["--check-config", "--config", path]), needle)
        # several errors are all reported
        path = self.write("multi.json", {"threads": 0, "zzz": 1, "log_level": "loud"})
        code, out, err = self.run_broker(["--check-config", "--config", path])
        self.assertEqual(code, 1)
        for needle in ("threads:", "zzz: unknown key", "log_level:"):
            self.assertIn(needle, err)
        # not JSON, not an object, missing file
        self.assertRefused(self.run_broker(["--check-config", "--config", self.write("x.json", "{")]), "x.json")
        self.assertRefused(self.run_broker(["--check-config", "--config", self.write("y.json", "[]")]),
                           "expected a JSON object")
        self.assertRefused(self.run_broker(["--check-config", "--config", os.path.join(self.tmp.name, "none.json")]),
                           "none.json")

    def test_env_overrides(self):
        self.assertRefused(self.run_broker(["--check-config"], env={"SANDBOX_BROKER_THREADS": "abc"}),
                           "env SANDBOX_BROKER_THREADS: not valid JSON")
        self.assertRefused(self.run_broker(["--check-config"], env={"SANDBOX_BROKER_THREADS": "100"}),
                           "env SANDBOX_BROKER_THREADS: threads: expected an integer from 1 to 64")
        self.assertRefused(self.run_broker(["--check-config"], env={"SANDBOX_BROKER_TARGETS": "[1]"}),
                           "env SANDBOX_BROKER_TARGETS: targets: expected an object")
        # env wins over the file
        path = self.write("c.json", {"threads": 0})
        code, out, err = self.run_broker(["--check-config", "--config", path], env={"SANDBOX_BROKER_THREADS": "3"})
        self.assertEqual(code, 1, err)  # the file's own value is still validated
        path = self.write("c.json", {"rpc_path": "/from/file", "threads": 1})
        b = sbtest.Broker(config=None, args=["--config", path], env={"SANDBOX_BROKER_RPC_PATH": "/from/env"}).start()
        try:
            tok = b.mint_ok("run-env", CAPS)
            r = b.rpc(tok, "services.mailer.send", {}, path="/from/env")
            self.assertEqual(r.status, 501, r)
            self.assertEqual(b.rpc(tok, "services.mailer.send", {}, path="/from/file").status, 404)
            self.assertEqual(b.rpc(tok, "services.mailer.send", {}, path=sbtest.RPC_PATH).status, 404)
            started = b.wait_for_event("started")
            self.assertEqual(started.get("rpcPath"), "/from/env")
            self.assertEqual(started.get("threads"), 1)
        finally:
            self.assertEqual(b.stop(), 0)

    def test_invalid_listen_address(self):
        for key in ("SANDBOX_BROKER_LISTEN", "SANDBOX_BROKER_ADMIN_LISTEN"):
            name = "listen" if key == "SANDBOX_BROKER_LISTEN" else "admin_listen"
            for value in ("nonsense", "example.com:80", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:-1", ":80",
                          "[::1]80", "127.0.0.1:80x"):
                with self.subTest(key=key, value=value):
                    self.assertRefused(self.run_broker(env={key: value}),
                                       '%s: expected host:port with a numeric host, got "%s"' % (name, value))

    def test_listen_port_in_use(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
            port = s.getsockname()[1]
            for key, what in (("SANDBOX_BROKER_LISTEN", "public"), ("SANDBOX_BROKER_ADMIN_LISTEN", "admin")):
                with self.subTest(listener=what):
                    code, out, err = self.run_broker(env={key: "127.0.0.1:%d" % port})
                    self.assertEqual(code, 1, err)
                    events = [json.loads(l) for l in err.splitlines() if l.startswith("{")]
                    failed = [e for e in events if e.get("event") == "listen.failed"]
                    self.assertEqual(len(failed), 1, err)
                    self.assertEqual(failed[0].get("listener"), what)

    def test_unknown_argument(self):
        code, out, err = self.run_broker(["--frobnicate"])
        self.assertEqual(code, 2)
        self.assertIn('unknown argument "--frobnicate"', err)
        code, out, err = self.run_broker(["--version"])
        self.assertEqual(code, 0)
        self.assertIn("sandbox-broker", out)


if __name__ == "__main__":
    sbtest.main()

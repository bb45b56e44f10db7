#!/usr/bin/python3
"""import.fetch through the real broker: the module path of capabilities.import (PROTOCOL.md section 6c).

Everything is on loopback: dnsmasq (fetchfix_dns) is the broker's resolver and maps the test names to
127.0.0.1 (allowed by the test config's egress.allow_cidrs) or, for mixed.test, to a private address too;
the module servers are fetchfix_upstream's recording HTTPS servers with a throw-away CA (TestPki), whose
leaf names tls.test (other.test for the second origin). Each refusal is checked twice: the answer, and
that the server holding the refused module saw nothing.
"""

import base64
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from fetchfix_dns import Dnsmasq  # noqa: E402
from fetchfix_upstream import TestPki, Upstream  # noqa: E402

EXEC_MSG = "sandbox binding operation failed"
# the supervisor's module path: a supervisor never sends it for a guest's relayed call
MODULE_PATH = {"x-sandbox-module-fetch": "1"}
MAX_MODULES = 4
MAX_MODULE_BYTES = 4096
MAX_TOTAL_BYTES = 10000
MODULE = b'export const answer = 42;\n'
TS_MODULE = b'export const greet = (name: string): string => "hi " + name;\n'

DNS = PKI = B = None
UP = {}


def modules_route(h, rec):
    path = rec.target.split("?")[0]
    if path == "/mod.js":
        h.reply(200, MODULE, [("Content-Type", "application/javascript; charset=utf-8")])
    elif path == "/mod.ts":
        h.reply(200, TS_MODULE, [("Content-Type", "application/typescript"), ("X-TypeScript-Types", "/mod.d.ts")])
    elif path == "/moved.js":
        h.reply(302, b"", [("Location", "/v2/mod.js")])
    elif path == "/v2/mod.js":
        h.reply(200, b'export * from "../mod.js";\n', [("Content-Type", "text/javascript")])
    elif path == "/away.js":
        h.reply(302, b"", [("Location", "https://other.test:%d/mod.js" % UP["other"].port)])
    elif path == "/3k.js":
        h.reply(200, b"/" * 3000, [("Content-Type", "text/javascript")])
    elif path == "/big.js":
        h.reply(200, b"/" * (MAX_MODULE_BYTES + 1), [("Content-Type", "text/javascript")])
    elif path == "/missing.js":
        h.reply(404, b"not found", [("Content-Type", "text/plain")])
    else:
        h.reply(500, b"unexpected path")


def setUpModule():
    global DNS, PKI, B
    try:
        PKI = TestPki().make()
        DNS = Dnsmasq(["tls.test,127.0.0.1", "other.test,127.0.0.1", "mixed.test,127.0.0.1", "mixed.test,10.0.0.5"]).start()
        UP["tls"] = Upstream({"*": modules_route}, tls=PKI.server_context(PKI.tls_leaf)).start()
        UP["other"] = Upstream({"*": modules_route}, tls=PKI.server_context(PKI.other_leaf)).start()
        UP["rogue"] = Upstream({"*": modules_route}, tls=PKI.server_context(PKI.rogue_leaf)).start()
        config = {"egress": {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False,
                             "ca_file": PKI.ca_file, "deadline_ms": 3000, "connect_timeout_ms": 1000,
                             "import_max_modules": MAX_MODULES, "import_max_module_bytes": MAX_MODULE_BYTES,
                             "import_max_total_bytes": MAX_TOTAL_BYTES}}
        B = sbtest.Broker(config=config, env={"SANDBOX_BROKER_THREADS": "2"}).start()
    except BaseException:
        tearDownModule()
        raise


def tearDownModule():
    global B
    errors = []
    if B is not None:
        rc = B.stop()
        log = B.log()
        if rc != 0:
            errors.append("broker exited with %s:\n%s" % (rc, log[-6000:]))
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            if marker in log:
                errors.append("sanitizer report in the broker log:\n%s" % log[-12000:])
        B = None
    for up in UP.values():
        up.stop()
    UP.clear()
    if DNS is not None:
        DNS.stop()
    if PKI is not None:
        PKI.cleanup()
    if errors:
        raise AssertionError("\n".join(errors))


class ImportCase(sbtest.BrokerTestCase):
    _n = 0

    def setUp(self):
        for up in UP.values():
            up.reset()
        ImportCase._n += 1
        self.run_id = "%s-%d" % (self._testMethodName, ImportCase._n)

    def tls(self, name="tls"):
        return "tls.test:%d" % UP[name].port if name != "other" else "other.test:%d" % UP[name].port

    def token(self, caps):
        return B.mint_ok(self.run_id, caps)

    def events(self, name):
        return [e for e in B.events() if e.get("event") == name and e.get("runId") == self.run_id]

    def reason(self, cid, timeout=5.0):
        sbtest.poll(lambda: any(e.get("cid") == cid for e in self.events("egress.failed")), timeout)
        return [e.get("reason") for e in self.events("egress.failed") if e.get("cid") == cid]

    def module(self, tok, url, enc="json"):
        return B.rpc(tok, "import.fetch", {"url": url}, enc=enc, headers=MODULE_PATH)

    def assert_exec_error(self, r):
        self.assertEqual(r.status, 500, r)
        self.assertEqual(r.body["error"]["code"], "execution_error", r)
        self.assertEqual(r.body["error"]["message"], EXEC_MSG)
        return r.body["error"]["correlationId"]

    # --- what works ---

    def test_a_module_comes_through_the_broker(self):
        tok = self.token({"import": [self.tls()]})
        url = "https://%s/mod.js" % self.tls()
        s, body, _ = self.module(tok, url)
        self.assertEqual(s, 200, body)
        v = body["value"]
        self.assertEqual(sorted(v), ["bodyBase64", "contentType", "status", "url"])
        self.assertEqual((v["url"], v["status"], v["contentType"]), (url, 200, "application/javascript; charset=utf-8"))
        self.assertEqual(base64.b64decode(v["bodyBase64"]), MODULE)
        # the module server saw the import host in SNI and Host, a GET, no body, only the broker's own headers
        reqs = UP["tls"].snapshot()
        self.assertEqual(len(reqs), 1, reqs)
        rec = reqs[0]
        self.assertEqual((rec.sni, rec.method, rec.target, rec.body), ("tls.test", "GET", "/mod.js", b""))
        self.assertEqual(rec.header("Host"), self.tls())
        self.assertEqual(sorted(set(rec.names()) - {"connection"}), ["accept", "host", "user-agent"])
        self.assertTrue(rec.header("User-Agent").startswith("Deno/"))
        # logged and counted
        sbtest.poll(lambda: self.events("import.module"), 5)
        ev = self.events("import.module")
        self.assertEqual([(e["host"], e["status"], e["bytes"], e["hops"]) for e in ev], [("tls.test", 200, len(MODULE), 1)])
        metrics = B.admin("GET", "/metrics").raw.decode()
        self.assertRegex(metrics, r'(?m)^sb_module_fetches_total\{outcome="ok"\} [1-9]')
        self.assertRegex(metrics, r'(?m)^sb_module_bytes_total [1-9]')

    def test_typescript_and_msgpack(self):
        tok = self.token({"import": [self.tls()]})
        r = self.module(tok, "https://%s/mod.ts" % self.tls(), enc="msgpack")
        self.assertEqual(r.status, 200, r)
        v = r.body["value"]
        self.assertEqual((v["contentType"], v["body"]), ("application/typescript", TS_MODULE))
        self.assertNotIn("bodyBase64", v)

    def test_a_redirect_inside_import_reports_the_final_url(self):
        tok = self.token({"import": [self.tls()]})
        s, body, _ = self.module(tok, "https://%s/moved.js" % self.tls())
        self.assertEqual(s, 200, body)
        # relative imports of the module resolve against where it was found, as Deno resolves them
        self.assertEqual(body["value"]["url"], "https://%s/v2/mod.js" % self.tls())
        self.assertEqual([r.target for r in UP["tls"].snapshot()], ["/moved.js", "/v2/mod.js"])

    def test_an_error_status_is_the_modules_answer(self):
        tok = self.token({"import": [self.tls()]})
        s, body, _ = self.module(tok, "https://%s/missing.js" % self.tls())
        self.assertEqual((s, body["value"]["status"]), (200, 404), body)

    def test_hosts_and_ports_match_as_for_net(self):
        # an entry without a port admits any port of its host (as Deno's --allow-import and our net entries do)
        tok = self.token({"import": ["tls.test"]})
        self.assertEqual(self.module(tok, "https://%s/mod.js" % self.tls()).status, 200)
        UP["tls"].reset()
        # an entry with a port admits that port only; a wildcard admits subdomains only
        tok = self.token({"import": ["tls.test:1", "*.tls.test"]})
        r = self.module(tok, "https://%s/mod.js" % self.tls())
        self.assertError(r, 403, "forbidden", 'import.fetch host "%s" is not in the import allowlist' % self.tls())
        self.assertEqual(UP["tls"].snapshot(), [])

    # --- the grants stay apart ---

    def test_a_net_grant_never_imports(self):
        tok = self.token({"net": [self.tls()]})
        r = self.module(tok, "https://%s/mod.js" % self.tls())
        self.assertError(r, 403, "forbidden", "import.fetch requires an import allowlist")
        tok = self.token({"net": [self.tls()], "import": [self.tls("other")]})
        r = self.module(tok, "https://%s/mod.js" % self.tls())
        self.assertError(r, 403, "forbidden", 'import.fetch host "%s" is not in the import allowlist' % self.tls())
        self.assertEqual(UP["tls"].snapshot(), [])

    def test_an_import_grant_never_fetches(self):
        tok = self.token({"import": [self.tls()]})
        r = B.rpc(tok, "http.fetch", {"url": "https://%s/mod.js" % self.tls()})
        self.assertError(r, 403, "forbidden", "http.fetch requires a net allowlist")
        tok = self.token({"import": [self.tls()], "net": [self.tls("other")]})
        r = B.rpc(tok, "http.fetch", {"url": "https://%s/mod.js" % self.tls()})
        self.assertError(r, 403, "forbidden", 'http.fetch host "%s" is not in the net allowlist' % self.tls())
        self.assertEqual(UP["tls"].snapshot(), [])

    def test_a_redirect_leaving_import_is_refused_even_to_a_net_host(self):
        tok = self.token({"import": [self.tls()], "net": [self.tls("other")]})
        cid = self.assert_exec_error(self.module(tok, "https://%s/away.js" % self.tls()))
        self.assertEqual(self.reason(cid), ['import.fetch redirect host "%s" is not in the import allowlist' % self.tls("other")])
        self.assertEqual(UP["other"].snapshot(), [])
        self.assertEqual(UP["other"].snis, [])

    # --- the request is the broker's, not the guest's ---

    def test_a_binding_call_never_imports(self):
        # a guest's call, relayed by a supervisor as {method, args}, comes without the module path's header
        tok = self.token({"import": [self.tls()]})
        url = "https://%s/mod.js" % self.tls()
        for headers in (None, {"x-sandbox-module-fetch": "0"}, {"x-sandbox-module-fetch": "1 "}):
            with self.subTest(headers=headers):
                self.assertError(B.rpc(tok, "import.fetch", {"url": url}, headers=headers), 403, "forbidden",
                                 "import.fetch is the supervisor's module path, not a binding")
        # two of them are no module path either
        body = b'{"method":"import.fetch","args":{"url":"%s"}}' % url.encode()
        req = (b"POST %s HTTP/1.1\r\nHost: x\r\nx-questpie-sandbox-token: %s\r\nContent-Type: application/json\r\n"
               b"x-sandbox-module-fetch: 1\r\nx-sandbox-module-fetch: 1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
               % (sbtest.RPC_PATH.encode(), tok.encode(), len(body))) + body
        with socket.create_connection(("127.0.0.1", B.port), timeout=10) as sock:
            sock.sendall(req)
            raw = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                raw += chunk
        self.assertTrue(raw.startswith(b"HTTP/1.1 403 "), raw)
        self.assertIn(b"import.fetch is the supervisor's module path, not a binding", raw)
        self.assertEqual(UP["tls"].snapshot(), [])

    def test_only_a_url(self):
        tok = self.token({"import": [self.tls()]})
        url = "https://%s/mod.js" % self.tls()
        for args in ({"url": url, "method": "POST"}, {"url": url, "headers": {"authorization": "x"}},
                     {"url": url, "bodyBase64": "eA=="}):
            with self.subTest(args=args):
                self.assertError(B.rpc(tok, "import.fetch", args, headers=MODULE_PATH), 400, "bad_args", "import.fetch takes only a url")
        for args, why in (({}, "missing or not a string"), ({"url": 7}, "missing or not a string"),
                          ({"url": "ftp://%s/x" % self.tls()}, None), ({"url": "https://u:p@%s/x" % self.tls()}, None)):
            with self.subTest(args=args):
                s, body, _ = B.rpc(tok, "import.fetch", args, headers=MODULE_PATH)
                self.assertEqual((s, body["error"]["code"]), (400, "bad_args"), body)
                self.assertTrue(body["error"]["message"].startswith("import.fetch url is invalid: "), body)
                if why is not None:
                    self.assertEqual(body["error"]["message"], "import.fetch url is invalid: " + why)
        self.assertEqual(UP["tls"].snapshot(), [])

    def test_secrets_never_travel_with_a_module(self):
        tok = B.mint_ok(self.run_id, {"import": [self.tls()], "net": [self.tls()]},
                        secrets={"k": {"value": "s3cr3t-value", "hosts": [self.tls()], "headers": ["authorization", "cookie"]}})
        s, body, _ = self.module(tok, "https://%s/mod.js" % self.tls())
        self.assertEqual(s, 200, body)
        rec = UP["tls"].snapshot()[0]
        self.assertNotIn(b"s3cr3t", repr(rec.headers).encode())
        self.assertNotIn("authorization", rec.names())
        self.assertNotIn("cookie", rec.names())

    # --- the egress policy, as for http.fetch ---

    def test_the_address_policy_and_tls_verification_hold(self):
        port = UP["tls"].port
        tok = self.token({"import": ["mixed.test:%d" % port, "tls.test:%d" % UP["rogue"].port]})
        cid = self.assert_exec_error(self.module(tok, "https://mixed.test:%d/mod.js" % port))
        self.assertIn('resolves to a blocked address 10.0.0.5', self.reason(cid)[0])
        self.assertEqual(UP["tls"].snapshot(), [])
        # the rogue server's leaf names tls.test but is signed by a CA the broker does not trust
        cid = self.assert_exec_error(self.module(tok, "https://tls.test:%d/mod.js" % UP["rogue"].port))
        self.assertEqual(UP["rogue"].snapshot(), [])
        self.assertTrue(self.reason(cid))

    # --- caps ---

    def test_a_module_over_the_per_module_cap_is_an_error(self):
        tok = self.token({"import": [self.tls()]})
        cid = self.assert_exec_error(self.module(tok, "https://%s/big.js" % self.tls()))
        self.assertTrue(self.reason(cid))

    def test_module_count_per_run(self):
        tok = self.token({"import": [self.tls()]})
        for _ in range(MAX_MODULES):
            self.assertEqual(self.module(tok, "https://%s/mod.js" % self.tls()).status, 200)
        UP["tls"].reset()
        r = self.module(tok, "https://%s/mod.js" % self.tls())
        self.assertError(r, 429, "rate_limited", "run quota exceeded: modules per run")
        self.assertEqual(UP["tls"].snapshot(), [], "the refused module was fetched")
        # another token of the same run shares the count
        tok2 = self.token({"import": [self.tls()]})
        self.assertError(self.module(tok2, "https://%s/mod.js" % self.tls()), 429, "rate_limited",
                         "run quota exceeded: modules per run")
        self.assertEqual(UP["tls"].snapshot(), [])
        metrics = B.admin("GET", "/metrics").raw.decode()
        self.assertRegex(metrics, r'(?m)^sb_quota_hits_total\{quota="modules per run"\} [1-9]')
        self.assertRegex(metrics, r'(?m)^sb_module_fetches_total\{outcome="quota"\} [1-9]')

    def test_module_bytes_per_run(self):
        tok = self.token({"import": [self.tls()]})
        # 3000 + 3000 + 3000 fit in 10000; the fourth takes the run over the cap and is not answered
        for _ in range(3):
            self.assertEqual(self.module(tok, "https://%s/3k.js" % self.tls()).status, 200)
        self.assertError(self.module(tok, "https://%s/3k.js" % self.tls()), 429, "rate_limited",
                         "run quota exceeded: module bytes per run")


class ImportOnRedis(sbtest.BrokerTestCase):
    """The run's module counters in the Redis store: one count across broker instances."""

    def test_counts_are_shared_across_instances(self):
        redis = sbtest.RedisServer()
        redis.start()
        b1 = b2 = None
        try:
            config = {"egress": {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False,
                                 "ca_file": PKI.ca_file, "import_max_modules": 2, "import_max_total_bytes": 5000}}
            env = {"SANDBOX_BROKER_TOKEN_STORE": redis.url, "SANDBOX_BROKER_THREADS": "1"}
            b1 = sbtest.Broker(config=config, env=env).start()
            b2 = sbtest.Broker(config=config, env=env).start()
            host = "tls.test:%d" % UP["tls"].port
            tok = b1.mint_ok("redis-import", {"import": [host]})
            UP["tls"].reset()
            self.assertEqual(b1.rpc(tok, "import.fetch", {"url": "https://%s/3k.js" % host}, headers=MODULE_PATH).status, 200)
            # the second module takes the run's bytes over 5000 on the other instance
            self.assertError(b2.rpc(tok, "import.fetch", {"url": "https://%s/3k.js" % host}, headers=MODULE_PATH), 429, "rate_limited",
                             "run quota exceeded: module bytes per run")
            # and the third is over the count: refused before it is fetched
            n = len(UP["tls"].snapshot())
            self.assertError(b1.rpc(tok, "import.fetch", {"url": "https://%s/mod.js" % host}, headers=MODULE_PATH), 429, "rate_limited",
                             "run quota exceeded: modules per run")
            self.assertEqual(len(UP["tls"].snapshot()), n)
            self.assertGreater(int(sbtest.redis_command(redis.port, "PTTL", "sb:q:modules:redis-import")), 0)
            self.assertEqual(int(sbtest.redis_command(redis.port, "GET", "sb:q:modules:redis-import")), 3)
        finally:
            for b in (b1, b2):
                if b is not None:
                    b.stop()
            redis.stop()

    def test_a_slow_count_outlives_the_deadline(self):
        """The module has arrived and Redis is slow to count its bytes: the exchange's deadline passes meanwhile.
        The count's answer decides (the exchange must not be ended, and freed, under the store's pending call)."""
        redis = sbtest.RedisServer()
        redis.start()
        proxy = sbtest.DelayProxy(redis.port, 0.0)
        b = None
        try:
            config = {"egress": {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False,
                                 "ca_file": PKI.ca_file, "deadline_ms": 700}}
            env = {"SANDBOX_BROKER_TOKEN_STORE": "redis://127.0.0.1:%d" % proxy.port, "SANDBOX_BROKER_THREADS": "1",
                   "SANDBOX_BROKER_STORE_TIMEOUT_MS": "5000"}
            b = sbtest.Broker(config=config, env=env).start()
            self.assertTrue(b.wait_store_up(1), b.log())
            host = "tls.test:%d" % UP["tls"].port
            tok = b.mint_ok("redis-slow-count", {"import": [host]})

            def slow_redis(h, rec):
                proxy.delay = 1.5  # every Redis answer from now on: the count of this module's bytes
                h.reply(200, MODULE, [("Content-Type", "application/javascript")])

            UP["tls"].route("/slow-count.js", slow_redis)
            r = b.rpc(tok, "import.fetch", {"url": "https://%s/slow-count.js" % host}, headers=MODULE_PATH, timeout=20)
            proxy.delay = 0.0
            self.assertEqual(r.status, 200, r)
            self.assertEqual(base64.b64decode(r.body["value"]["bodyBase64"]), MODULE)
            # one answer, and the broker is still there to answer the next call
            self.assertEqual(b.rpc(tok, "import.fetch", {"url": "https://%s/mod.js" % host}, headers=MODULE_PATH).status, 200)
            self.assertTrue(b.alive())
        finally:
            proxy.delay = 0.0
            if b is not None:
                rc = b.stop()
                log = b.log()
                self.assertEqual(rc, 0, log[-4000:])
                self.assertNotIn("AddressSanitizer", log)
            proxy.close()
            redis.stop()


if __name__ == "__main__":
    sbtest.main()

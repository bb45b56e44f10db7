#!/usr/bin/python3
"""The net-mint credential (PROTOCOL.md section 9): a second admin secret that mints only
{net, timeoutMs} tokens under the reserved run id prefix, and revokes only those.

Covered: the shapes it may mint (and that such a token grants http.fetch's net check and
nothing else), every shape it may not (extra keys, other axes, missing or out-of-range
timeoutMs, empty net, foreign run ids, malformed JSON, a bad net entry), the short life,
revocation scope (its own tokens yes; the admin secret's tokens, run revocation and every
other endpoint no), a wrong credential, the admin secret's refusal of the reserved prefix,
and the configuration refusals (short, equal to the admin secret, file form)."""

import json
import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from sbtest import ADMIN_SECRET, MISSING  # noqa: E402

NETMINT_SECRET = "net-mint-secret-for-the-tests-0123456789"
PREFIX = "net-mint:"
SHAPE = ('the net-mint credential mints only {runId: "net-mint:...", capabilities: {net?: [hosts], '
         'import?: [hosts], timeoutMs: 1..30000}}')
REVOKE_SCOPE = "the net-mint credential revokes only the network tokens it mints"


class NetMint(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.b = sbtest.Broker(env={"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET": NETMINT_SECRET}).start()

    @classmethod
    def tearDownClass(cls):
        rc = cls.b.stop()
        log = cls.b.log()
        if rc != 0:
            raise AssertionError("broker exited with %s:\n%s" % (rc, log[-4000:]))
        if NETMINT_SECRET in log or ADMIN_SECRET in log:
            raise AssertionError("a secret appears in the log")

    def nm(self, method, path, body=None, secret=NETMINT_SECRET):
        return self.b.admin(method, path, body, secret=secret)

    def mint(self, body):
        return self.nm("POST", "/admin/v1/tokens", body)

    def good(self, run="net-mint:a1", net=("api.example.com",), timeout=5000):
        return {"runId": run, "capabilities": {"net": list(net), "timeoutMs": timeout}}

    def forbidden(self, r, message):
        self.assertEqual(r.status, 403, r)
        self.assertEqual(r.body, {"ok": False, "error": {"code": "forbidden", "message": message}})

    def test_mints_net_only_tokens(self):
        before = int(time.time() * 1000)
        r = self.mint(self.good("net-mint:m1", ("api.example.com", "example.org:8443"), 5000))
        self.assertEqual(r.status, 201, r)
        tok = r.body["token"]
        self.assertRegex(tok, r"^[0-9a-f]{64}$")
        # short-lived: timeoutMs + 30 s
        self.assertGreaterEqual(r.body["expiresAt"], before + 35000)
        self.assertLessEqual(r.body["expiresAt"], int(time.time() * 1000) + 35000)
        # the manifest is net: a host outside it is refused by the capability check, before any I/O
        s, body, _ = self.b.rpc(tok, "http.fetch", {"url": "https://other.example.net/x"})
        self.assertEqual((s, body["error"]["code"]), (403, "forbidden"), body)
        self.assertIn("not in the net allowlist", body["error"]["message"])
        # and nothing else: no data, files, tools or services
        for method, args in (("collections.posts.find", {}), ("files.read", {"path": "a"}), ("services.x.y", {}),
                             ("store.notes.find", {}), ("tools.list", {})):
            s, body, _ = self.b.rpc(tok, method, args)
            self.assertIn(s, (403, 401), (method, body))
            self.assertIn(body["error"]["code"], ("forbidden", "unauthorized"), (method, body))
        self.assertIn("credential", self.b.wait_for_event("token.minted") or {})

    def test_mints_import_tokens(self):
        # import alone, and net with import: module hosts for a run without bindings (PROTOCOL.md section 6c)
        r = self.mint({"runId": "net-mint:i1", "capabilities": {"import": ["esm.example"], "timeoutMs": 5000}})
        self.assertEqual(r.status, 201, r)
        tok = r.body["token"]
        # an import grant is no net grant, and a host outside import is refused before any I/O
        s, body, _ = self.b.rpc(tok, "http.fetch", {"url": "https://esm.example/x"})
        self.assertEqual((s, body["error"]), (403, {"code": "forbidden", "message": "http.fetch requires a net allowlist"}))
        s, body, _ = self.b.rpc(tok, "import.fetch", {"url": "https://other.example/x.js"},
                                 headers={"x-sandbox-module-fetch": "1"})
        self.assertEqual((s, body["error"]["message"]), (403, 'import.fetch host "other.example:443" is not in the import allowlist'))
        r = self.mint({"runId": "net-mint:i2", "capabilities": {"net": ["api.example"], "import": ["esm.example:8443"],
                                                               "timeoutMs": 5000}})
        self.assertEqual(r.status, 201, r)
        s, body, _ = self.b.rpc(r.body["token"], "import.fetch", {"url": "https://api.example/x.js"},
                                 headers={"x-sandbox-module-fetch": "1"})
        self.assertEqual((s, body["error"]["message"]), (403, 'import.fetch host "api.example:443" is not in the import allowlist'))
        r = self.mint({"runId": "net-mint:i3", "capabilities": {"import": ["exa mple"], "timeoutMs": 5000}})
        self.assertEqual((r.status, r.body["error"]["code"]), (400, "bad_args"), r)
        self.assertIn("import", r.body["error"]["message"])

    def test_refused_shapes(self):
        g = self.good
        cases = [
            dict(g(), ttlMs=600000),
            dict(g(), target="app"),
            dict(g(), scope={"tenantId": "t1"}),
            dict(g(), quotas={"calls": 100000}),
            dict(g(), token="ab" * 32),
            {"runId": "net-mint:x", "capabilities": {"net": ["a.example"], "timeoutMs": 5000, "data": {}}},
            {"runId": "net-mint:x", "capabilities": {"net": ["a.example"], "timeoutMs": 5000, "files": {"read": ["**"]}}},
            {"runId": "net-mint:x", "capabilities": {"net": ["a.example"], "services": ["s"]}},
            {"runId": "net-mint:x", "capabilities": {"net": ["a.example"]}},
            {"runId": "net-mint:x", "capabilities": {"timeoutMs": 5000, "tools": ["*"]}},
            g(net=()),
            {"runId": "net-mint:x", "capabilities": {"import": [], "timeoutMs": 5000}},
            {"runId": "net-mint:x", "capabilities": {"net": ["a.example"], "import": [], "timeoutMs": 5000}},
            {"runId": "net-mint:x", "capabilities": {"import": "a.example", "timeoutMs": 5000}},
            {"runId": "net-mint:x", "capabilities": {"import": ["a.example"], "timeoutMs": 5000, "memoryMb": 64}},
            {"runId": "net-mint:x", "capabilities": {"import": ["a.example"]}},
            g(timeout=0),
            g(timeout=30001),
            g(timeout=5000.5),
            g(run="run-1"),
            g(run="NET-MINT:x"),
            {"runId": "net-mint:x"},
            {"capabilities": {"net": ["a.example"], "timeoutMs": 5000}},
            [g()],
        ]
        for body in cases:
            with self.subTest(body=body):
                self.forbidden(self.mint(body), SHAPE)
        r = self.nm("POST", "/admin/v1/tokens", "{not json")
        self.assertEqual((r.status, r.body["error"]["code"]), (400, "bad_args"), r)
        # the manifest parser still judges the entries: a malformed host is bad_args, as for the admin secret
        r = self.mint(g(net=("exa mple.com",)))
        self.assertEqual((r.status, r.body["error"]["code"]), (400, "bad_args"), r)
        self.assertIn("net", r.body["error"]["message"])

    def test_revokes_only_its_own_tokens(self):
        tok = self.mint(self.good("net-mint:r1")).body["token"]
        s, body, _ = self.b.rpc(tok, "http.fetch", {"url": "https://other.example.net/x"})
        self.assertEqual(s, 403, body)
        r = self.nm("DELETE", "/admin/v1/tokens/" + tok)
        self.assertEqual(r.status, 204, r)
        s, body, _ = self.b.rpc(tok, "http.fetch", {"url": "https://other.example.net/x"})
        self.assertEqual((s, body["error"]["code"]), (401, "unauthorized"), body)
        # idempotent, like the admin secret's
        self.assertEqual(self.nm("DELETE", "/admin/v1/tokens/" + tok).status, 204)
        self.assertEqual(self.nm("DELETE", "/admin/v1/tokens/" + "cd" * 32).status, 204)
        # a token of the admin secret's is out of reach, and keeps working
        other = self.b.mint_ok("run-host-1", {"net": ["api.example.com"], "timeoutMs": 5000})
        self.forbidden(self.nm("DELETE", "/admin/v1/tokens/" + other), REVOKE_SCOPE)
        s, body, _ = self.b.rpc(other, "http.fetch", {"url": "https://other.example.net/x"})
        self.assertEqual((s, body["error"]["code"]), (403, "forbidden"), body)
        # runs, and every other endpoint, are the admin secret's
        for method, path in (("DELETE", "/admin/v1/runs/run-host-1"), ("DELETE", "/admin/v1/runs/net-mint%3Ar1"),
                             ("GET", "/admin/v1/tokens"), ("POST", "/admin/v1/tokens/" + other),
                             ("GET", "/admin/v1/other")):
            with self.subTest(path=path):
                self.forbidden(self.nm(method, path), "the net-mint credential can only mint and revoke network tokens")
        s, body, _ = self.b.rpc(other, "http.fetch", {"url": "https://other.example.net/x"})
        self.assertEqual(s, 403, body)
        r = self.nm("DELETE", "/admin/v1/tokens/not-a-token")
        self.assertEqual((r.status, r.body["error"]["code"]), (400, "bad_args"), r)

    def test_wrong_credential(self):
        for secret in (NETMINT_SECRET + "x", NETMINT_SECRET[:-1], "", None):
            with self.subTest(secret=secret):
                r = self.nm("POST", "/admin/v1/tokens", self.good(), secret=secret)
                self.assertEqual(r.status, 401, r)
                self.assertEqual(r.body["error"]["code"], "unauthorized")
        # the admin secret is unchanged by it
        self.assertEqual(self.b.mint("run-admin-ok", {"services": ["s"]}).status, 201)

    def test_admin_secret_cannot_mint_under_the_prefix(self):
        r = self.b.mint("net-mint:host-made", {"net": ["api.example.com"], "timeoutMs": 5000})
        self.assertEqual(r.status, 400, r)
        self.assertEqual(r.body["error"]["message"], "runId: the prefix net-mint: is reserved for the net-mint credential")

    def test_metrics_count_its_operations(self):
        def minted():
            for line in self.b.admin("GET", "/metrics").raw.decode().splitlines():
                if line.startswith('sb_admin_requests_total{op="mint",class="2xx"}'):
                    return int(line.split()[-1])
            return 0
        before = minted()
        self.assertEqual(self.mint(self.good("net-mint:metrics")).status, 201)
        self.assertEqual(minted(), before + 1)


class NotConfigured(sbtest.BrokerTestCase):
    def test_without_the_credential_it_is_just_a_wrong_secret(self):
        with sbtest.Broker() as b:
            r = b.admin("POST", "/admin/v1/tokens", {"runId": "net-mint:x", "capabilities": {"net": ["a.example"],
                                                                                          "timeoutMs": 5000}},
                        secret=NETMINT_SECRET)
            self.assertEqual(r.status, 401, r)


class Config(unittest.TestCase):
    def check(self, env):
        return sbtest.run_broker_once(["--check-config"], sbtest.base_env(env))

    def test_short_secret(self):
        rc, out, err = self.check({"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET": "x" * 31})
        self.assertNotEqual(rc, 0)
        self.assertIn("net-mint secret: shorter than 32 bytes", out + err)

    def test_equal_to_the_admin_secret(self):
        rc, out, err = self.check({"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET": ADMIN_SECRET})
        self.assertNotEqual(rc, 0)
        self.assertIn("net-mint secret: must differ from the admin secret", out + err)

    def test_file_form(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "netmint")
            with open(path, "w") as f:
                f.write(NETMINT_SECRET + "\n")
            rc, out, err = self.check({"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET_FILE": path})
            self.assertEqual(rc, 0, out + err)
            self.assertNotIn(NETMINT_SECRET, out + err)
            rc, out, err = self.check({"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET_FILE": path + ".missing"})
            self.assertNotEqual(rc, 0)
            self.assertIn("admin_net_mint_secret_file: cannot open", out + err)
            with sbtest.Broker(env={"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET_FILE": path}) as b:
                r = b.admin("POST", "/admin/v1/tokens", {"runId": "net-mint:f", "capabilities": {"net": ["a.example"],
                                                                                              "timeoutMs": 10}},
                            secret=NETMINT_SECRET)
                self.assertEqual(r.status, 201, r)


if __name__ == "__main__":
    sbtest.main()

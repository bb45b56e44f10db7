#!/usr/bin/python3
"""Token minting, registration, TTL, expiry and revocation through the admin API
(PROTOCOL.md section 9)."""

import hashlib
import os
import re
import sys
import time
import unittest
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from sbtest import MISSING, MSG_UNAUTHORIZED  # noqa: E402

ENCODINGS = ("json", "msgpack")
TOKEN_RE = re.compile(r"^[0-9a-f]{64}$")
CAPS = {"services": ["mailer"]}
GRANTED_MSG = "services dispatch is not implemented"


def now_ms():
    return int(time.time() * 1000)


def tokref(token):
    return hashlib.sha256(token.encode()).hexdigest()[:12]


class TokenBase(sbtest.BrokerTestCase):
    broker_env = {}

    @classmethod
    def setUpClass(cls):
        env = {"SANDBOX_BROKER_TARGETS": '{"app":{},"other-app":{}}'}
        env.update(cls.broker_env)
        cls.b = sbtest.Broker(env=env).start()
        cls.tokens_seen = []

    @classmethod
    def tearDownClass(cls):
        rc = cls.b.stop()
        if rc != 0:
            raise AssertionError("broker exited with %s:\n%s" % (rc, cls.b.log()[-4000:]))

    def mint_ok(self, run_id="run-1", capabilities=CAPS, **kw):
        tok = self.b.mint_ok(run_id, capabilities, **kw)
        self.tokens_seen.append(tok)
        return tok

    def assert_works(self, tok, enc="json"):
        r = self.b.rpc(tok, "services.mailer.send", {}, enc=enc)
        self.assertError(r, 501, "not_implemented", GRANTED_MSG, enc=enc)

    def assert_refused(self, tok, enc="json"):
        r = self.b.rpc(tok, "services.mailer.send", {}, enc=enc)
        self.assertError(r, 401, "unauthorized", MSG_UNAUTHORIZED, enc=enc)

    def assert_bad_mint(self, resp, message):
        self.assertError(resp, 400, "bad_args", message)
        self.assertEqual(resp.headers.get("content-type"), "application/json")


class Mint(TokenBase):
    def test_mint_shape(self):
        before = now_ms()
        r = self.b.mint("run-shape", CAPS)
        after = now_ms()
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.headers.get("content-type"), "application/json")
        self.assertEqual(set(r.body.keys()), {"token", "expiresAt"}, r)
        self.assertRegex(r.body["token"], TOKEN_RE)
        self.assertIsInstance(r.body["expiresAt"], int)
        self.assertGreaterEqual(r.body["expiresAt"], before + 300000 - 5)
        self.assertLessEqual(r.body["expiresAt"], after + 300000 + 5)
        self.tokens_seen.append(r.body["token"])
        for enc in ENCODINGS:
            self.assert_works(r.body["token"], enc)

    def test_tokens_are_distinct(self):
        toks = {self.mint_ok("run-distinct") for _ in range(32)}
        self.assertEqual(len(toks), 32)
        for t in toks:
            self.assertRegex(t, TOKEN_RE)

    def test_minimal_bodies(self):
        # capabilities omitted or {}: a token that grants nothing
        for caps in (MISSING, {}):
            with self.subTest(caps=caps):
                tok = self.mint_ok("run-min", caps)
                r = self.b.rpc(tok, "services.mailer.send", {})
                self.assertError(r, 403, "forbidden", 'service "mailer" is not granted')
        tok = self.mint_ok("run-target", CAPS, target="app", scope={"tenantId": "t1", "user_id": "u-2"})
        self.assert_works(tok)
        tok = self.mint_ok("run-null-target", CAPS, target=None, scope=None)
        self.assert_works(tok)

    BAD_MINTS = [
        ({"runId": "r", "foo": 1}, "foo: unknown key"),
        ({"runId": "r", "capabilities": {}, "ttl": 5}, "ttl: unknown key"),
        ({"runId": "r", "capabilities": {"fils": {}}}, "capabilities.fils: unknown key"),
        ({"runId": "r", "capabilities": {"files": {"red": []}}}, "capabilities.files.red: unknown key"),
        ({"runId": "r", "capabilities": {"data": {"colections": {}}}}, "capabilities.data.colections: unknown key"),
        ({"runId": "r", "capabilities": {"tool": []}}, "capabilities.tool: unknown key"),
        ({"runId": "r", "capabilities": []}, "capabilities: expected an object"),
        ({"runId": "r", "capabilities": "all"}, "capabilities: expected an object"),
        ({"runId": "r", "capabilities": None}, "capabilities: expected an object"),
        ({"runId": "r", "capabilities": {"services": "mailer"}}, "capabilities.services: must be an array"),
        ({"runId": "r", "capabilities": {"services": [1]}}, "capabilities.services[0]: must be a string"),
        ({"runId": "r", "capabilities": {"services": ["ok", "a b"]}}, "capabilities.services[1]: invalid name"),
        ({"runId": "r", "capabilities": {"jobs": {"a": 1}}}, "capabilities.jobs: must be an array"),
        ({"runId": "r", "capabilities": {"files": []}}, "capabilities.files: must be an object"),
        ({"runId": "r", "capabilities": {"files": {"read": ["../x"]}}}, "capabilities.files.read[0]: unsafe glob"),
        ({"runId": "r", "capabilities": {"files": {"write": "x"}}}, "capabilities.files.write: must be an array"),
        ({"runId": "r", "capabilities": {"data": []}}, "capabilities.data: must be an object"),
        ({"runId": "r", "capabilities": {"data": {"collections": {"posts": ["write"]}}}},
         'capabilities.data.collections.posts[0]: unknown verb "write"'),
        ({"runId": "r", "capabilities": {"data": {"globals": {"g": ["create"]}}}},
         'capabilities.data.globals.g[0]: unknown verb "create"'),
        ({"runId": "r", "capabilities": {"data": {"stores": {"s": "read"}}}},
         "capabilities.data.stores.s: must be an array"),
        ({"runId": "r", "capabilities": {"data": {"collections": {"a b": ["read"]}}}},
         'capabilities.data.collections: invalid name "a b"'),
        ({"runId": "r", "capabilities": {"timeoutMs": "5"}}, "capabilities.timeoutMs: must be an integer from 1 to 86400000"),
        ({"runId": "r", "capabilities": {"timeoutMs": 0}}, "capabilities.timeoutMs: must be an integer from 1 to 86400000"),
        ({"runId": "r", "capabilities": {"timeoutMs": 1.5}}, "capabilities.timeoutMs: must be an integer from 1 to 86400000"),
        ({"runId": "r", "capabilities": {"memoryMb": 8}}, "capabilities.memoryMb: must be an integer from 16 to 65536"),
        ({"runId": "r", "capabilities": {"net": ["a.com/x"]}}, "capabilities.net[0]: '/' is not allowed"),
        ({"runId": "r", "capabilities": {"net": ["user@a.com"]}}, "capabilities.net[0]: '@' is not allowed"),
        ({"runId": "r", "capabilities": {"net": ["a.*.com"]}}, "capabilities.net[0]: '*' is only allowed as a leading \"*.\""),
        ({"runId": "r", "capabilities": {"net": ["a.com:99999"]}}, "capabilities.net[0]: invalid port"),
        ({"runId": "r", "capabilities": {"net": [""]}}, "capabilities.net[0]: empty entry"),
        ({"runId": "r", "capabilities": {"tools": ["a/b"]}}, "capabilities.tools[0]: invalid tool glob"),
        ({"capabilities": {}}, "runId: expected a string"),
        ({"runId": 5}, "runId: expected a string"),
        ({"runId": None}, "runId: expected a string"),
        ({"runId": ""}, "runId: expected 1-256 printable bytes"),
        ({"runId": "r" * 257}, "runId: expected 1-256 printable bytes"),
        ({"runId": "a\nb"}, "runId: expected 1-256 printable bytes"),
        ({"runId": "a\u0000b"}, "invalid JSON body"),  # jansson refuses \u0000 without JSON_ALLOW_NUL
        ({"runId": "r", "target": 5}, "target: expected a string"),
        ({"runId": "r", "target": "nope"}, 'target: no target named "nope" is configured'),
        ({"runId": "r", "target": "App"}, 'target: no target named "App" is configured'),
        ({"runId": "r", "scope": "t1"}, "scope: expected an object"),
        ({"runId": "r", "scope": {"a b": "x"}}, "scope.a b: expected a key of [A-Za-z0-9_-]{1,64}"),
        ({"runId": "r", "scope": {"k": 5}}, "scope.k: expected a string of 1-256 printable bytes"),
        ({"runId": "r", "scope": {"k": ""}}, "scope.k: expected a string of 1-256 printable bytes"),
        ({"runId": "r", "scope": {"k%d" % i: "v" for i in range(17)}}, "scope: more than 16 entries"),
        ({"runId": "r", "ttlMs": 0}, "ttlMs: expected a positive integer"),
        ({"runId": "r", "ttlMs": -5}, "ttlMs: expected a positive integer"),
        ({"runId": "r", "ttlMs": "1000"}, "ttlMs: expected a positive integer"),
        ({"runId": "r", "ttlMs": 1000.5}, "ttlMs: expected a positive integer"),
        ({"runId": "r", "token": "AB" * 32}, "token: expected 64 lowercase hex characters"),
        ({"runId": "r", "token": "ab" * 31}, "token: expected 64 lowercase hex characters"),
        ({"runId": "r", "token": "ab" * 33}, "token: expected 64 lowercase hex characters"),
        ({"runId": "r", "token": "zz" * 32}, "token: expected 64 lowercase hex characters"),
        ({"runId": "r", "token": 5}, "token: expected 64 lowercase hex characters"),
        ({"runId": "r", "token": None}, "token: expected 64 lowercase hex characters"),
    ]

    def test_mint_validation(self):
        for body, message in self.BAD_MINTS:
            with self.subTest(body=str(body)[:80]):
                r = self.b.admin("POST", "/admin/v1/tokens", body)
                self.assert_bad_mint(r, message)

    def test_mint_bad_bodies(self):
        for raw in (b"", b"{", b"[]", b'"x"', b"null", b'{"runId":"a","runId":"b"}', b"\xff"):
            with self.subTest(raw=raw):
                r = self.b.admin("POST", "/admin/v1/tokens", raw, headers={"Content-Type": "application/json"})
                self.assert_bad_mint(r, "invalid JSON body")

    def test_mint_wrong_http_method(self):
        r = self.b.admin("GET", "/admin/v1/tokens")
        self.assertError(r, 405, "bad_method", "use POST")
        r = self.b.admin("POST", "/admin/v1/tokens/" + "ab" * 32, {"runId": "r"})
        self.assertError(r, 405, "bad_method", "use GET or DELETE")
        r = self.b.admin("PUT", "/admin/v1/runs/r")
        self.assertError(r, 405, "bad_method", "use GET or DELETE")

    # ---- registering the caller's own token ----

    def test_register_own_token(self):
        own = hashlib.sha256(b"host-minted-1").hexdigest()
        r = self.b.mint("run-own", CAPS, token=own)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.body["token"], own)
        self.tokens_seen.append(own)
        for enc in ENCODINGS:
            self.assert_works(own, enc)
        # a second, different registration is independent of the first
        own2 = hashlib.sha256(b"host-minted-2").hexdigest()
        r = self.b.mint("run-own-2", CAPS, token=own2)
        self.assertEqual(r.status, 201, r)
        self.tokens_seen.append(own2)
        self.assert_works(own2)
        self.assert_works(own)
        # registering it again is a conflict, and the original stays valid
        r = self.b.mint("run-own", CAPS, token=own)
        self.assertError(r, 409, "conflict", "that token is already registered")
        r = self.b.mint("run-other", {"services": ["other"]}, token=own)
        self.assertError(r, 409, "conflict", "that token is already registered")
        self.assert_works(own)
        # so is registering a token the broker minted itself
        minted = self.mint_ok("run-own")
        r = self.b.mint("run-own", CAPS, token=minted)
        self.assertError(r, 409, "conflict", "that token is already registered")
        # a registered token is revocable like any other, and logged by hash prefix only
        self.assertEqual(self.b.revoke_token(own).status, 204)
        self.assert_refused(own)
        self.assert_works(own2)
        refs = [ev.get("token") for ev in self.b.events() if ev.get("event") == "token.minted"]
        self.assertIn(tokref(own), refs)
        self.assertIn(tokref(own2), refs)

    # ---- TTL ----

    def ttl_of(self, **kw):
        caps = kw.pop("capabilities", CAPS)
        before = now_ms()
        r = self.b.mint("run-ttl", caps, **kw)
        after = now_ms()
        self.assertEqual(r.status, 201, r)
        self.tokens_seen.append(r.body["token"])
        return r.body["expiresAt"], before, after

    def assertTtl(self, expected, **kw):
        exp, before, after = self.ttl_of(**kw)
        self.assertGreaterEqual(exp, before + expected - 5, kw)
        self.assertLessEqual(exp, after + expected + 5, kw)

    def test_ttl_rules(self):
        self.assertTtl(300000)                                                   # default
        self.assertTtl(5000, ttlMs=5000)                                         # explicit
        self.assertTtl(40000, capabilities={"timeoutMs": 10000})                 # timeoutMs + 30 s
        self.assertTtl(30001, capabilities={"timeoutMs": 1})
        self.assertTtl(7000, capabilities={"timeoutMs": 10000}, ttlMs=7000)      # explicit wins
        self.assertTtl(3600000, ttlMs=99999999)                                  # clamped to max_ttl_ms (default 1 h)
        self.assertTtl(3600000, capabilities={"timeoutMs": 86400000})            # timeoutMs + 30 s, clamped

    # ---- expiry ----

    def test_expiry(self):
        r = self.b.mint("run-expiry", CAPS, ttlMs=1000)
        self.assertEqual(r.status, 201, r)
        tok, exp = r.body["token"], r.body["expiresAt"]
        self.tokens_seen.append(tok)
        for enc in ENCODINGS:
            self.assert_works(tok, enc)
        # wait past expiresAt (about 1.2 s after the mint), no longer
        time.sleep(max(0.0, (exp + 200 - now_ms()) / 1000.0))
        for enc in ENCODINGS:
            self.assert_refused(tok, enc)
        # an expired token stays refused, and revoking it is still a no-op success
        self.assert_refused(tok)
        self.assertEqual(self.b.revoke_token(tok).status, 204)

    # ---- revocation ----

    def test_revoke_token(self):
        t1 = self.mint_ok("run-rv")
        t2 = self.mint_ok("run-rv")
        self.assert_works(t1)
        r = self.b.revoke_token(t1)
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.raw, b"")
        for enc in ENCODINGS:
            self.assert_refused(t1, enc)
        self.assert_works(t2)  # the same run's other token is untouched
        # idempotent, also for tokens that never existed
        self.assertEqual(self.b.revoke_token(t1).status, 204)
        self.assertEqual(self.b.revoke_token(t1).status, 204)
        self.assertEqual(self.b.revoke_token("cd" * 32).status, 204)

    def test_revoke_token_malformed(self):
        for bad in ("xyz", "AB" * 32, "ab" * 31, "ab" * 33, "%zz", "ab" * 31 + "%2F0"):
            with self.subTest(token=bad):
                r = self.b.admin("DELETE", "/admin/v1/tokens/" + bad)
                self.assertEqual(r.status, 400, r)
                self.assertEqual(r.body["error"]["code"], "bad_args", r)
                self.assertIn(r.body["error"]["message"],
                              ("token: expected 64 lowercase hex characters", "token: malformed"), r)
        r = self.b.admin("DELETE", "/admin/v1/tokens/xyz")
        self.assertError(r, 400, "bad_args", "token: expected 64 lowercase hex characters")
        r = self.b.admin("DELETE", "/admin/v1/tokens/%zz")
        self.assertError(r, 400, "bad_args", "token: malformed")

    def test_revoke_run(self):
        a1 = self.mint_ok("run-A")
        a2 = self.mint_ok("run-A", {"services": ["mailer"], "jobs": ["x"]})
        b1 = self.mint_ok("run-B")
        ab = self.mint_ok("run-AB")  # a run id that starts with the other's
        for t in (a1, a2, b1, ab):
            self.assert_works(t)
        r = self.b.revoke_run("run-A")
        self.assertEqual(r.status, 204, r)
        self.assertEqual(r.raw, b"")
        for enc in ENCODINGS:
            self.assert_refused(a1, enc)
            self.assert_refused(a2, enc)
            self.assert_works(b1, enc)
            self.assert_works(ab, enc)
        self.assertEqual(self.b.revoke_run("run-A").status, 204)
        self.assertEqual(self.b.revoke_run("never-existed").status, 204)
        # a token minted for the run after its revocation is a new grant (the host decides)
        a3 = self.mint_ok("run-A")
        self.assert_works(a3)
        self.assert_works(b1)

    def test_revoke_run_with_special_characters(self):
        rid = "run 1?x=%25&y=\u00e9#frag"
        t = self.mint_ok(rid)
        other = self.mint_ok("run 1")
        self.assert_works(t)
        self.assertEqual(self.b.revoke_run(rid).status, 204)
        self.assert_refused(t)
        self.assert_works(other)

    def test_every_mintable_run_is_revocable(self):
        rid = "org/run-7"
        r = self.b.mint(rid, CAPS)
        if r.status == 400:
            return  # refusing such run ids at mint would also keep the invariant
        self.assertEqual(r.status, 201, r)
        tok = r.body["token"]
        self.tokens_seen.append(tok)
        r = self.b.admin("DELETE", "/admin/v1/runs/" + quote(rid, safe=""))
        self.assertEqual(r.status, 204, r)
        self.assert_refused(tok)

    def test_revoke_run_malformed(self):
        # "%2F" is not here: it decodes to "/", a valid run id (test_every_mintable_run_is_revocable)
        for seg in ("%zz", "%0a", "a%00b", "%", "a%2"):
            with self.subTest(seg=seg):
                r = self.b.admin("DELETE", "/admin/v1/runs/" + seg)
                self.assertError(r, 400, "bad_args", "runId: malformed")

    # ---- logs ----

    def test_tokens_never_logged(self):
        t = self.mint_ok("run-log", CAPS, scope={"tenantId": "t1"})
        self.assert_works(t)
        self.b.rpc(t, "email.send", {})
        self.b.rpc(t.upper(), "email.send", {})
        self.b.rpc(t[:-1] + "0", "email.send", {})
        self.b.revoke_token(t)
        self.assert_refused(t)
        log = self.b.log()
        self.assertIn("token.minted", log)
        self.assertIn("token.revoked", log)
        for tok in self.tokens_seen + [t]:
            self.assertNotIn(tok, log)
            self.assertNotIn(tok.upper(), log)
            self.assertNotIn(tok[:32], log)
        # the log refers to a token by a short prefix of its SHA-256
        refs = [ev.get("token") for ev in self.b.events() if ev.get("event") in ("token.minted", "rpc")]
        self.assertIn(tokref(t), refs)
        for ref in refs:
            if ref is not None:
                self.assertRegex(ref, r"^[0-9a-f]{12}$")


class TtlClamp(TokenBase):
    broker_env = {"SANDBOX_BROKER_MAX_TTL_MS": "120000", "SANDBOX_BROKER_DEFAULT_TTL_MS": "60000"}

    def assertTtl(self, expected, caps=CAPS, **kw):
        before = now_ms()
        r = self.b.mint("run-clamp", caps, **kw)
        after = now_ms()
        self.assertEqual(r.status, 201, r)
        self.assertGreaterEqual(r.body["expiresAt"], before + expected - 5, kw)
        self.assertLessEqual(r.body["expiresAt"], after + expected + 5, kw)

    def test_configured_ttls(self):
        self.assertTtl(60000)                                    # configured default
        self.assertTtl(120000, ttlMs=500000)                     # explicit, clamped
        self.assertTtl(120000, caps={"timeoutMs": 100000})       # 130 s, clamped
        self.assertTtl(95000, caps={"timeoutMs": 65000})         # under the clamp
        self.assertTtl(1000, ttlMs=1000)


class StoreFull(TokenBase):
    broker_env = {"SANDBOX_BROKER_MAX_TOKENS": "3"}

    def test_store_full_is_429(self):
        toks = [self.mint_ok("run-full-%d" % i) for i in range(3)]
        r = self.b.mint("run-full-x", CAPS)
        self.assertError(r, 429, "rate_limited", "the token store is full")
        for t in toks:
            self.assert_works(t)
        self.assertEqual(self.b.revoke_token(toks[0]).status, 204)
        t = self.mint_ok("run-full-y")
        self.assert_works(t)


if __name__ == "__main__":
    sbtest.main()

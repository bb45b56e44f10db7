#!/usr/bin/python3
"""Diagnostics and inspection on the admin listener (PROTOCOL.md section 9): admin refusals logged with
their op and peer, X-Request-Id logged beside the correlation id and echoed, and GET
/admin/v1/runs/<runId> and /admin/v1/tokens/<token> on the memory and the Redis store."""

import hashlib
import http.client
import json
import os
import re
import sys
import tempfile
import unittest
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from sbtest import ADMIN_SECRET  # noqa: E402

NETMINT_SECRET = "inspect-net-mint-secret-0123456789abcdef"
CAPS = {"services": ["mailer"], "net": ["Api.Example.COM:443", "*.cdn.test", "[0:0::1]:8443"],
        "files": {"read": ["./data//in/**"]}, "data": {"collections": {"posts": ["delete", "read"]}},
        "timeoutMs": 5000}
# what the broker enforces for CAPS: hosts lowercased, IPv6 canonical, globs normalised, verbs in a fixed order
CAPS_ENFORCED = {"net": ["api.example.com:443", "*.cdn.test", "[::1]:8443"], "files": {"read": ["data/in/**"]},
                 "data": {"collections": {"posts": ["read", "delete"]}}, "services": ["mailer"], "timeoutMs": 5000}
UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def ref(token):
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def raw_request(port, method, path, headers, body=b""):
    """One request whose headers go out exactly as given (repeats kept); returns (status, [(name, value)], body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for k, v in headers:
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return r.status, [(k.lower(), v) for k, v in r.getheaders()], r.read()
    finally:
        conn.close()


def events(broker, name):
    return [e for e in broker.events() if e.get("event") == name]


class Refusals(sbtest.BrokerTestCase):
    """Every admin refusal: one admin.refused line with the op asked for and the peer, never the secret."""

    @classmethod
    def setUpClass(cls):
        cls.b = sbtest.Broker(env={"SANDBOX_BROKER_ADMIN_NET_MINT_SECRET": NETMINT_SECRET}).start()

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()
        log = cls.b.log()
        if ADMIN_SECRET in log or NETMINT_SECRET in log or "wrong-secret-value" in log:
            raise AssertionError("a secret appears in the log")

    def refused_after(self, before):
        return [e for e in events(self.b, "admin.refused")][before:]

    def test_wrong_missing_and_malformed_credentials(self):
        tok = self.b.mint_ok("refuse-run", {"services": ["mailer"]})
        cases = [
            ("POST", "/admin/v1/tokens", {"Authorization": "Bearer wrong-secret-value"}, "mint", "wrong admin secret"),
            ("DELETE", "/admin/v1/tokens/" + tok, {}, "revoke_token", "no Authorization header"),
            ("DELETE", "/admin/v1/runs/refuse-run", {"Authorization": "Basic d3Jvbmc="}, "revoke_run",
             "the Authorization header is not a Bearer credential"),
            ("GET", "/admin/v1/tokens/" + tok, {"Authorization": "Bearer wrong-secret-value"}, "inspect_token",
             "wrong admin secret"),
            ("GET", "/admin/v1/runs/refuse-run", {"Authorization": "Bearer "}, "inspect_run", "wrong admin secret"),
            ("PUT", "/admin/v1/nothing", {}, "other", "no Authorization header"),
        ]
        for method, path, hdrs, op, why in cases:
            with self.subTest(op=op):
                before = len(events(self.b, "admin.refused"))
                hdrs = dict(hdrs, **{"X-Request-Id": "refused-" + op})
                r = sbtest.http_request(self.b.admin_port, method, path, b"{}" if method == "POST" else None, hdrs)
                self.assertError(r, 401, "unauthorized", "missing or wrong admin secret")
                got = sbtest.poll(lambda: self.refused_after(before), 5)
                self.assertEqual(len(got), 1, got)
                line = got[0]
                self.assertRegex(line.pop("remote"), r"^127\.0\.0\.1:\d+$")
                line.pop("ts")
                self.assertEqual(line, {"level": "warn", "event": "admin.refused", "op": op, "method": method,
                                        "requestId": "refused-" + op, "status": 401, "reason": why})
        # the token named in a refused path is not logged either
        self.assertNotIn(tok, self.b.log())
        # nothing was done: the token still answers
        self.assertEqual(self.b.rpc(tok, "services.mailer.send", {}).status, 501)

    def test_refusals_are_counted_under_their_op(self):
        self.b.admin("POST", "/admin/v1/tokens", {"runId": "x"}, secret="wrong-secret-value")
        self.b.admin("GET", "/admin/v1/runs/x", secret=None)
        text = self.b.admin("GET", "/metrics").raw.decode()
        self.assertRegex(text, r'sb_admin_requests_total\{op="mint",class="4xx"\} [1-9]')
        self.assertRegex(text, r'sb_admin_requests_total\{op="inspect_run",class="4xx"\} [1-9]')

    def test_net_mint_credential_refusals_and_no_inspection(self):
        tok = self.b.mint_ok("inspect-target", {"services": ["mailer"]})
        cases = [("GET", "/admin/v1/tokens/" + tok, "inspect_token"), ("GET", "/admin/v1/runs/inspect-target", "inspect_run"),
                 ("DELETE", "/admin/v1/runs/inspect-target", "revoke_run")]
        for method, path, op in cases:
            with self.subTest(op=op):
                before = len(events(self.b, "admin.refused"))
                r = self.b.admin(method, path, secret=NETMINT_SECRET)
                self.assertError(r, 403, "forbidden", "the net-mint credential can only mint and revoke network tokens")
                got = sbtest.poll(lambda: self.refused_after(before), 5)
                self.assertEqual(len(got), 1, got)
                self.assertEqual((got[0]["op"], got[0]["credential"], got[0]["status"], got[0]["method"]),
                                 (op, "net-mint", 403, method))
                self.assertRegex(got[0]["remote"], r"^127\.0\.0\.1:\d+$")
        self.assertNotIn(tok, self.b.log())
        # a mint outside the credential's shape is refused and logged the same way
        before = len(events(self.b, "admin.refused"))
        r = self.b.admin("POST", "/admin/v1/tokens", {"runId": "inspect-x", "capabilities": {"services": ["a"]}},
                         secret=NETMINT_SECRET)
        self.assertEqual(r.status, 403)
        got = sbtest.poll(lambda: self.refused_after(before), 5)
        self.assertEqual((got[0]["op"], got[0]["credential"]), ("mint", "net-mint"), got)


class RequestId(sbtest.BrokerTestCase):
    """X-Request-Id: a safe one is logged on the call and audit lines and echoed; the correlation id stays ours."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sb-reqid-")
        cls.b = sbtest.Broker().start()
        cls.tok = cls.b.mint_ok("reqid-run", {"services": ["mailer"]})

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()

    def rpc_lines(self, before):
        return events(self.b, "rpc")[before:]

    def test_safe_id_is_logged_audited_and_echoed(self):
        rid = "11111111-2222-3333-4444-555555555555"
        audit = os.path.join(self.dir, "audit-echo.log")
        with sbtest.Broker(env={"SANDBOX_BROKER_AUDIT": audit}) as b:
            tok = b.mint_ok("reqid-audit", {"services": ["mailer"]})
            r = b.rpc(tok, "services.mailer.send", {}, headers={"X-Request-Id": rid})
            self.assertEqual(r.status, 501)
            self.assertEqual(r.headers.get("x-request-id"), rid)
            lines = sbtest.poll(lambda: events(b, "rpc"), 5)
            self.assertEqual(len(lines), 1, lines)
            line = lines[0]
            self.assertEqual(line["requestId"], rid)
            # the correlation id is the broker's own, never the proxy's
            self.assertRegex(line["cid"], UUID)
            self.assertNotEqual(line["cid"], rid)
            # SIGTERM flushes the audit buffer
            self.assertEqual(b.stop(), 0)
        with open(audit) as f:
            audited = [a for a in map(json.loads, f.read().splitlines()) if a["event"] == "audit"]
        self.assertEqual([(a["cid"], a["requestId"]) for a in audited], [(line["cid"], rid)])

    def test_every_accepted_byte_and_the_length_cap(self):
        for rid in ("a", "A.b_c:d-9", "x" * 128, "0123456789abcdef0123456789abcdef"):
            with self.subTest(rid=rid[:20]):
                before = len(events(self.b, "rpc"))
                r = self.b.rpc(self.tok, "services.mailer.send", {}, headers={"X-Request-Id": rid})
                self.assertEqual(r.headers.get("x-request-id"), rid)
                self.assertEqual(sbtest.poll(lambda: self.rpc_lines(before), 5)[0]["requestId"], rid)

    def test_unsafe_ids_are_dropped(self):
        for rid in ("x" * 129, "has space", 'quote"d', "back\\slash", "per%63ent", "semi;colon", "slash/", "caf\u00e9",
                    "new\tline", "{json}"):
            with self.subTest(rid=rid[:20]):
                before = len(events(self.b, "rpc"))
                status, hdrs, _ = raw_request(self.b.port, "POST", sbtest.RPC_PATH,
                                              [(sbtest.TOKEN_HEADER, self.tok), ("Content-Type", "application/json"),
                                               ("X-Request-Id", rid.encode("utf-8").decode("latin-1"))],
                                              b'{"method":"services.mailer.send","args":{}}')
                self.assertEqual(status, 501)
                self.assertNotIn("x-request-id", [k for k, _ in hdrs])
                line = sbtest.poll(lambda: self.rpc_lines(before), 5)[0]
                self.assertNotIn("requestId", line)
                self.assertRegex(line["cid"], UUID)

    def test_two_ids_are_ambiguous_and_dropped(self):
        before = len(events(self.b, "rpc"))
        status, hdrs, _ = raw_request(self.b.port, "POST", sbtest.RPC_PATH,
                                      [(sbtest.TOKEN_HEADER, self.tok), ("Content-Type", "application/json"),
                                       ("X-Request-Id", "one"), ("X-Request-Id", "two")],
                                      b'{"method":"services.mailer.send","args":{}}')
        self.assertEqual(status, 501)
        self.assertNotIn("x-request-id", [k for k, _ in hdrs])
        self.assertNotIn("requestId", sbtest.poll(lambda: self.rpc_lines(before), 5)[0])

    def test_echoed_exactly_once_on_refusals_and_admin_answers(self):
        status, hdrs, _ = raw_request(self.b.port, "POST", sbtest.RPC_PATH,
                                      [("Content-Type", "application/json"), ("X-Request-Id", "no-token")],
                                      b'{"method":"services.mailer.send","args":{}}')
        self.assertEqual((status, [v for k, v in hdrs if k == "x-request-id"]), (401, ["no-token"]))
        status, hdrs, _ = raw_request(self.b.admin_port, "GET", "/admin/v1/runs/reqid-run",
                                      [("Authorization", "Bearer " + ADMIN_SECRET), ("X-Request-Id", "adm-1")])
        self.assertEqual((status, [v for k, v in hdrs if k == "x-request-id"]), (200, ["adm-1"]))
        status, hdrs, _ = raw_request(self.b.port, "GET", "/healthz", [("X-Request-Id", "hz")])
        self.assertEqual((status, [v for k, v in hdrs if k == "x-request-id"]), (200, ["hz"]))


class InspectMemory(sbtest.BrokerTestCase):
    """GET /admin/v1/runs/<runId> and /admin/v1/tokens/<token> on the memory store."""

    env = {}
    store_workers = 0

    @classmethod
    def setUpClass(cls):
        cls.b = sbtest.Broker(env=dict(cls.env, SANDBOX_BROKER_ADMIN_NET_MINT_SECRET=NETMINT_SECRET),
                              config={"targets": {"main": {}}}).start()
        if cls.store_workers:
            assert cls.b.wait_store_up(cls.store_workers)

    @classmethod
    def tearDownClass(cls):
        cls.b.stop()

    def mint(self, run_id, caps, **fields):
        r = self.b.mint(run_id, caps, **fields)
        self.assertEqual(r.status, 201, r)
        return r.body["token"], r.body["expiresAt"]

    def inspect_run(self, run_id):
        return self.b.admin("GET", "/admin/v1/runs/" + quote(run_id, safe=""))

    def inspect_token(self, token):
        return self.b.admin("GET", "/admin/v1/tokens/" + token)

    def test_run_shows_tokens_usage_and_the_enforced_manifest(self):
        run = "insp-" + self.id().rsplit(".", 1)[-1]
        t1, e1 = self.mint(run, CAPS, target="main", scope={"tenantId": "t1"}, quotas={"calls": 50})
        t2, e2 = self.mint(run, {"services": ["mailer"]}, ttlMs=60000)
        for _ in range(3):
            self.assertEqual(self.b.rpc(t2, "services.mailer.send", {}).status, 501)
        self.assertEqual(self.b.rpc(t2, "services.other.send", {}).status, 403)  # denied calls count too
        # the Redis store sends a call's release without waiting for it, so the last one may still be on its way
        self.assertTrue(sbtest.poll(lambda: self.inspect_run(run).body.get("usage", {}).get("inFlight") == 0, 5))
        # and the timeline's events after the reply (the counts come from them)
        self.assertTrue(sbtest.poll(lambda: sum(self.inspect_run(run).body.get("callsByOutcome", {}).values()) == 4, 5))
        r = self.inspect_run(run)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.headers.get("content-type"), "application/json")
        body = r.body
        toks = sorted(body.pop("tokens"), key=lambda t: t["expiresAt"])
        self.assertEqual(body, {"runId": run, "liveTokens": 2, "truncated": False,
                                "usage": {"calls": 4, "inFlight": 0, "fetchedBytes": 0},
                                "callsByOutcome": {"not_implemented": 3, "forbidden": 1}, "secretsByHost": {}})
        want1 = {"tokenHash": ref(t1), "expiresAt": e1, "target": "main", "scope": {"tenantId": "t1"},
                 "quotas": {"calls": 50, "concurrent": 16, "fetchBytes": 67108864}, "capabilities": CAPS_ENFORCED}
        want2 = {"tokenHash": ref(t2), "expiresAt": e2, "target": None, "scope": {},
                 "quotas": {"calls": 1024, "concurrent": 16, "fetchBytes": 67108864},
                 "capabilities": {"services": ["mailer"]}}
        self.assertEqual(toks, sorted([want1, want2], key=lambda t: t["expiresAt"]))
        # never the token itself, in the answer or the log
        for t in (t1, t2):
            self.assertNotIn(t, r.raw.decode())
            self.assertNotIn(t, self.b.log())
        # inspection counts nothing
        self.assertEqual(self.inspect_run(run).body["usage"]["calls"], 4)

    def test_token_shows_its_record_and_its_run_usage(self):
        run = "insp-" + self.id().rsplit(".", 1)[-1]
        tok, exp = self.mint(run, CAPS, target="main", scope={"tenantId": "t9"})
        self.assertEqual(self.b.rpc(tok, "services.mailer.send", {}).status, 501)
        self.assertTrue(sbtest.poll(lambda: self.inspect_token(tok).body.get("usage", {}).get("inFlight") == 0, 5))
        r = self.inspect_token(tok)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body, {"tokenHash": ref(tok), "runId": run, "expiresAt": exp, "target": "main",
                                  "scope": {"tenantId": "t9"},
                                  "quotas": {"calls": 1024, "concurrent": 16, "fetchBytes": 67108864},
                                  "capabilities": CAPS_ENFORCED, "usage": {"calls": 1, "inFlight": 0, "fetchedBytes": 0}})
        self.assertNotIn(tok, r.raw.decode())
        # the enforced manifest is itself a manifest that mints the same grants
        again, _ = self.mint(run + "-again", r.body["capabilities"], target="main")
        self.assertEqual(self.inspect_token(again).body["capabilities"], CAPS_ENFORCED)

    def test_unknown_revoked_and_malformed(self):
        run = "insp-" + self.id().rsplit(".", 1)[-1]
        self.assertError(self.inspect_run("no-such-run"), 404, "not_found", "no live token for that run")
        self.assertError(self.inspect_token("0" * 64), 404, "not_found", "no live token with that value")
        keep, _ = self.mint(run, {"services": ["mailer"]})
        gone, _ = self.mint(run, {"services": ["mailer"]})
        self.assertEqual(self.b.revoke_token(gone).status, 204)
        self.assertError(self.inspect_token(gone), 404, "not_found", "no live token with that value")
        body = self.inspect_run(run).body
        self.assertEqual((body["liveTokens"], [t["tokenHash"] for t in body["tokens"]]), (1, [ref(keep)]))
        self.assertEqual(self.b.revoke_run(run).status, 204)
        self.assertError(self.inspect_run(run), 404, "not_found", "no live token for that run")
        self.assertError(self.inspect_token(keep), 404, "not_found", "no live token with that value")
        for bad in ("ABCD" * 16, "0" * 63, "0" * 65, "%zz"):
            with self.subTest(bad=bad):
                r = self.b.admin("GET", "/admin/v1/tokens/" + bad)
                self.assertEqual(r.status, 400, r)
                self.assertEqual(r.body["error"]["code"], "bad_args")
        self.assertError(self.b.admin("GET", "/admin/v1/runs/a%00b"), 400, "bad_args", "runId: malformed")
        for path in ("/admin/v1/runs/x", "/admin/v1/tokens/" + "0" * 64):
            r = self.b.admin("PUT", path)
            self.assertError(r, 405, "bad_method", "use GET or DELETE")
            self.assertEqual(r.headers.get("allow"), "GET, DELETE")
        r = self.b.admin("GET", "/admin/v1/tokens")
        self.assertError(r, 405, "bad_method", "use POST")
        self.assertEqual(r.headers.get("allow"), "POST")

    def test_run_ids_are_decoded_as_revocation_decodes_them(self):
        run = "tenant/7 run%"
        tok, _ = self.mint(run, {"services": ["mailer"]})
        r = self.inspect_run(run)
        self.assertEqual((r.status, r.body["runId"], r.body["tokens"][0]["tokenHash"]), (200, run, ref(tok)), r)

    def test_expired_tokens_are_not_live(self):
        run = "insp-" + self.id().rsplit(".", 1)[-1]
        tok, _ = self.mint(run, {"services": ["mailer"]}, ttlMs=1)
        sbtest.poll(lambda: self.inspect_token(tok).status == 404, 5)
        self.assertError(self.inspect_token(tok), 404, "not_found", "no live token with that value")
        self.assertError(self.inspect_run(run), 404, "not_found", "no live token for that run")

    def test_a_large_run_is_listed_up_to_the_cap(self):
        run = "insp-" + self.id().rsplit(".", 1)[-1]
        for _ in range(101):
            self.mint(run, {})
        body = self.inspect_run(run).body
        self.assertEqual((body["liveTokens"], len(body["tokens"]), body["truncated"]), (101, 100, True))

    def test_counted_in_the_admin_metric(self):
        self.inspect_run("metric-run")
        self.inspect_token("1" * 64)
        text = self.b.admin("GET", "/metrics").raw.decode()
        self.assertRegex(text, r'sb_admin_requests_total\{op="inspect_run",class="4xx"\} [1-9]')
        self.assertRegex(text, r'sb_admin_requests_total\{op="inspect_token",class="4xx"\} [1-9]')


class InspectRedis(InspectMemory):
    """The same answers from the Redis store, plus what only Redis can hold."""

    @classmethod
    def setUpClass(cls):
        cls.redis = sbtest.RedisServer()
        cls.redis.start()
        cls.prefix = "sbinspect:"
        cls.env = {"SANDBOX_BROKER_TOKEN_STORE": cls.redis.url, "SANDBOX_BROKER_REDIS_PREFIX": cls.prefix,
                   "SANDBOX_BROKER_THREADS": "2"}
        cls.store_workers = 2
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.redis.stop()

    def rcmd(self, *args):
        return sbtest.redis_command(type(self).redis.port, *args)

    def test_fetched_bytes_come_from_the_shared_counter(self):
        run = "insp-bytes"
        tok, _ = self.mint(run, {"services": ["mailer"]})
        # another instance's http.fetch would have added these
        self.assertEqual(self.rcmd("INCRBY", self.prefix + "q:bytes:" + run, "12345"), 12345)
        self.assertEqual(self.inspect_run(run).body["usage"]["fetchedBytes"], 12345)
        self.assertEqual(self.inspect_token(tok).body["usage"]["fetchedBytes"], 12345)

    def test_an_unreadable_record_is_unavailable_not_hidden(self):
        run = "insp-bad"
        self.mint(run, {"services": ["mailer"]})
        h = hashlib.sha256(b"planted").hexdigest()
        self.rcmd("SADD", self.prefix + "run:" + run, h)
        self.rcmd("SET", self.prefix + "tok:" + h, "not a record")
        self.assertError(self.inspect_run(run), 503, "unavailable", "the token store is unavailable")
        self.rcmd("DEL", self.prefix + "tok:" + h)
        self.assertEqual(self.inspect_run(run).body["liveTokens"], 1)

    def test_a_record_indexed_under_another_run_is_refused(self):
        tok, _ = self.mint("insp-owner", {"services": ["mailer"]})
        h = hashlib.sha256(tok.encode()).hexdigest()
        self.rcmd("SADD", self.prefix + "run:insp-other", h)
        self.assertError(self.inspect_run("insp-other"), 503, "unavailable", "the token store is unavailable")

    def test_store_down_is_unavailable(self):
        b = sbtest.Broker(env={"SANDBOX_BROKER_TOKEN_STORE": "redis://127.0.0.1:%d" % sbtest.closed_port()}).start()
        try:
            r = b.admin("GET", "/admin/v1/runs/x")
            self.assertError(r, 503, "unavailable", "the token store is unavailable")
            r = b.admin("GET", "/admin/v1/tokens/" + "2" * 64)
            self.assertError(r, 503, "unavailable", "the token store is unavailable")
        finally:
            b.stop()


if __name__ == "__main__":
    sbtest.main()

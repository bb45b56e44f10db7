#!/usr/bin/python3
"""The run timeline (docs/audit.md, "The run timeline"): GET /admin/v1/runs/<runId>/events returns, in order, every
decision made for the run: calls, http.fetch hops, secrets placed (the name and host, never the value), revocation.
The memory store keeps it per instance; on Redis two instances share it, and a run's events made through both come
back complete and in order. The run inspection gains calls by outcome and secrets used per host."""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from fetchfix_dns import Dnsmasq  # noqa: E402
from fetchfix_upstream import Upstream  # noqa: E402

from test_redis import shared_redis_port  # noqa: E402

SECRET = "tl-S3cr3t-value-0123456789abcdef"


def events_of(b, run, want=None, timeout=10.0):
    """The run's events; with `want`, polls until there are at least that many (Redis writes after the reply)."""
    def get():
        r = b.admin("GET", "/admin/v1/runs/%s/events" % run)
        if want is None or (r.status == 200 and len(r.body["events"]) >= want):
            return r
        return None
    r = sbtest.poll(get, timeout) if want is not None else get()
    if r is None:
        r = b.admin("GET", "/admin/v1/runs/%s/events" % run)
        raise AssertionError("fewer than %d events: %s" % (want, r.body))
    return r


def metric(b, name):
    for line in b.admin("GET", "/metrics").raw.decode().splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    raise AssertionError("no metric " + name)


class Memory(sbtest.BrokerTestCase):
    def test_calls_and_revocation_in_order(self):
        with sbtest.Broker() as b:
            tok = b.mint_ok("tl-mem", {"services": ["svc"]})
            self.assertEqual(b.rpc(tok, "services.svc.one", {}).status, 501)
            self.assertEqual(b.rpc(tok, "services.other.fn", {}).status, 403)
            self.assertEqual(b.rpc(tok, "services.svc.two", {}).status, 501)
            # the inspection's counts, from the timeline
            r = b.admin("GET", "/admin/v1/runs/tl-mem")
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.body["callsByOutcome"], {"not_implemented": 2, "forbidden": 1})
            self.assertEqual(r.body["secretsByHost"], {})
            # one token revoked on its own: its run's timeline says which one
            extra = b.mint_ok("tl-mem", {"services": ["svc"]})
            self.assertEqual(b.admin("DELETE", "/admin/v1/tokens/" + extra).status, 204)
            self.assertEqual(b.rpc(tok, "services.svc.three", {}).status, 501)
            self.assertEqual(b.admin("DELETE", "/admin/v1/runs/tl-mem").status, 204)
            self.assertEqual(b.rpc(tok, "services.svc.fn", {}).status, 401)
            r = events_of(b, "tl-mem")
            self.assertEqual(r.status, 200, r.body)
            ev = r.body["events"]
            self.assertEqual([(e["event"], e.get("method"), e.get("decision"), e.get("code"), e.get("status")) for e in ev], [
                ("call", "services.svc.one", "allow", "not_implemented", 501),
                ("call", "services.other.fn", "deny", "forbidden", 403),
                ("call", "services.svc.two", "allow", "not_implemented", 501),
                ("revoke", None, None, None, None),
                ("call", "services.svc.three", "allow", "not_implemented", 501),
                ("revoke", None, None, None, None)])
            self.assertEqual(ev[3]["token"], hashlib.sha256(extra.encode()).hexdigest()[:12])
            self.assertNotIn("token", ev[5])
            self.assertEqual(ev[1]["reason"], 'service "other" is not granted')
            self.assertTrue(all(isinstance(e["us"], int) for e in ev[:3]))
            self.assertEqual(len({e["inst"] for e in ev}), 1)
            self.assertEqual([e["n"] for e in ev], sorted(e["n"] for e in ev))
            self.assertEqual((r.body["runId"], r.body["invalid"], r.body["capped"]), ("tl-mem", 0, False))
            # the call after the revocation has no run: it is not the run's
            self.assertNotIn(tok, json.dumps(r.body))

    def test_a_quota_refusal_is_a_call_with_its_code(self):
        with sbtest.Broker() as b:
            tok = b.mint_ok("tl-quota", {"services": ["svc"]}, quotas={"calls": 2})
            self.assertEqual([b.rpc(tok, "services.svc.fn", {}).status for _ in range(3)], [501, 501, 429])
            ev = events_of(b, "tl-quota").body["events"]
            self.assertEqual([(e["event"], e["code"], e["status"]) for e in ev],
                             [("call", "not_implemented", 501)] * 2 + [("call", "rate_limited", 429)])
            self.assertEqual(b.admin("GET", "/admin/v1/runs/tl-quota").body["callsByOutcome"],
                             {"not_implemented": 2, "rate_limited": 1})

    def test_unknown_run_bad_id_and_wrong_method(self):
        with sbtest.Broker() as b:
            r = b.admin("GET", "/admin/v1/runs/nobody/events")
            self.assertEqual((r.status, r.body["error"]["message"]), (404, "no events for that run"))
            r = b.admin("GET", "/admin/v1/runs/%ZZ/events")
            self.assertEqual((r.status, r.body["error"]["message"]), (400, "runId: malformed"))
            r = b.admin("DELETE", "/admin/v1/runs/x/events")
            self.assertEqual(r.status, 405)
            self.assertEqual(r.headers.get("allow"), "GET")

    def test_the_cap_keeps_the_newest_and_counts_the_rest(self):
        with sbtest.Broker(env={"SANDBOX_BROKER_TIMELINE_MAX_EVENTS": "3"}) as b:
            tok = b.mint_ok("tl-cap", {"services": ["svc"]})
            for i in range(5):
                self.assertEqual(b.rpc(tok, "services.svc.f%d" % i, {}).status, 501)
            r = events_of(b, "tl-cap")
            self.assertEqual([e["method"] for e in r.body["events"]], ["services.svc.f2", "services.svc.f3", "services.svc.f4"])
            self.assertTrue(r.body["capped"])
            self.assertEqual(metric(b, "sb_timeline_dropped_total"), 2)

    def test_off(self):
        with sbtest.Broker(env={"SANDBOX_BROKER_TIMELINE_MAX_EVENTS": "0"}) as b:
            tok = b.mint_ok("tl-off", {"services": ["svc"]})
            self.assertEqual(b.rpc(tok, "services.svc.fn", {}).status, 501)
            r = b.admin("GET", "/admin/v1/runs/tl-off/events")
            self.assertEqual((r.status, r.body["error"]["message"]),
                             (404, "the run timeline is off (timeline_max_events is 0)"))
            self.assertNotIn("callsByOutcome", b.admin("GET", "/admin/v1/runs/tl-off").body)


class OnRedis(sbtest.BrokerTestCase):
    """Two instances on one Redis, one run, its events made through both."""

    @classmethod
    def setUpClass(cls):
        port = shared_redis_port()
        if port is None:
            raise unittest_skip("SB_TEST_REDIS_URL names no loopback Redis")
        cls.tmp = tempfile.mkdtemp(prefix="sb-tl-")
        key = os.path.join(cls.tmp, "secrets.key")
        with open(key, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        cls.dns = Dnsmasq(["ok.test,127.0.0.1"]).start()
        cls.up = Upstream().start()
        cls.up.route("/start", lambda h, rec: h.reply(302, b"", [("Location", "/middle")]))
        cls.up.route("/middle", lambda h, rec: h.reply(307, b"", [("Location", "/end")]))
        cls.up.route("/end", lambda h, rec: h.reply(200, b"the end", [("Content-Type", "text/plain")]))
        prefix = "sbtl-%s:" % uuid.uuid4().hex[:8]
        conf = {"egress": {"dns_servers": [cls.dns.server], "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False,
                           "deadline_ms": 3000, "connect_timeout_ms": 1000}}
        env = {"SANDBOX_BROKER_TOKEN_STORE": "redis://127.0.0.1:%d" % port, "SANDBOX_BROKER_REDIS_PREFIX": prefix,
               "SANDBOX_BROKER_SECRETS_KEY_FILE": key, "SANDBOX_BROKER_THREADS": "2"}
        cls.a = sbtest.Broker(env=env, config=conf).start()
        cls.b = sbtest.Broker(env=env, config=conf).start()

    @classmethod
    def tearDownClass(cls):
        for x in ("a", "b"):
            if getattr(cls, x, None) is not None:
                getattr(cls, x).stop()
        cls.up.stop()
        cls.dns.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_events_through_both_instances_come_back_complete_and_in_order(self):
        run = "tl-two-" + uuid.uuid4().hex[:6]
        tok = self.a.mint_ok(run, {"services": ["svc"]})
        order = []
        for i in range(8):
            br = (self.a, self.b)[i % 2]
            m = "services.svc.s%d" % i if i != 5 else "services.nope.s5"
            self.assertEqual(br.rpc(tok, m, {}).status, 501 if i != 5 else 403)
            order.append(m)
            time.sleep(0.01)  # the order is the time order: a few ms apart
        for br in (self.a, self.b):
            r = events_of(br, run, want=8)
            ev = r.body["events"]
            self.assertEqual([e["method"] for e in ev], order)
            insts = [e["inst"] for e in ev]
            self.assertEqual(len(set(insts)), 2)
            self.assertEqual(insts[0::2], [insts[0]] * 4)
            self.assertEqual(insts[1::2], [insts[1]] * 4)
            self.assertEqual([e["decision"] for e in ev], ["allow"] * 5 + ["deny"] + ["allow"] * 2)
        r = self.b.admin("GET", "/admin/v1/runs/%s" % run)
        self.assertEqual(r.body["callsByOutcome"], {"not_implemented": 7, "forbidden": 1})
        # a token revoked on its own through one instance is in the run's story on the other
        extra = self.a.mint_ok(run, {"services": ["svc"]})
        self.assertEqual(self.a.admin("DELETE", "/admin/v1/tokens/" + extra).status, 204)
        ev = events_of(self.b, run, want=9).body["events"]
        self.assertEqual((ev[-1]["event"], ev[-1]["runId"], ev[-1]["token"]),
                         ("revoke", run, hashlib.sha256(extra.encode()).hexdigest()[:12]))
        # the revocation through the other instance closes the story
        self.assertEqual(self.b.admin("DELETE", "/admin/v1/runs/%s" % run).status, 204)
        ev = events_of(self.a, run, want=10).body["events"]
        self.assertEqual(ev[-1]["event"], "revoke")
        self.assertNotIn("token", ev[-1])

    def test_a_redirect_chain_with_a_secret_shows_each_hop_and_the_name_only(self):
        run = "tl-fetch-" + uuid.uuid4().hex[:6]
        net = ["ok.test:%d" % self.up.port]
        tok = self.a.mint_ok(run, {"net": net}, secrets={"gh": {"value": SECRET, "hosts": net, "schemes": ["http"]}})
        r = self.a.rpc(tok, "http.fetch", {"url": "http://ok.test:%d/start" % self.up.port,
                                           "headers": {"authorization": "Bearer {{secret:gh}}"}}, timeout=20)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual([x.target for x in self.up.snapshot()], ["/start", "/middle", "/end"])
        body = events_of(self.b, run, want=7).body
        ev = body["events"]
        self.assertNotIn(SECRET, json.dumps(body))
        self.assertEqual([e["event"] for e in ev], ["secret", "fetch", "secret", "fetch", "secret", "fetch", "call"])
        hops = [e for e in ev if e["event"] == "fetch"]
        self.assertEqual([(e["hop"], e["host"], e["address"], e["status"], e["redirect"]) for e in hops],
                         [(0, "ok.test", "127.0.0.1", 302, 1), (1, "ok.test", "127.0.0.1", 307, 1),
                          (2, "ok.test", "127.0.0.1", 200, 0)])
        secrets = [e for e in ev if e["event"] == "secret"]
        self.assertEqual([(e["hop"], e["name"], e["host"], e["header"]) for e in secrets],
                         [(0, "gh", "ok.test", "authorization"), (1, "gh", "ok.test", "authorization"),
                          (2, "gh", "ok.test", "authorization")])
        call = ev[-1]
        self.assertEqual((call["method"], call["decision"], call["status"], call["secrets"]), ("http.fetch", "allow", 200, "gh"))
        self.assertEqual(len({e["cid"] for e in ev}), 1)
        r = self.a.admin("GET", "/admin/v1/runs/%s" % run)
        self.assertEqual(r.body["secretsByHost"], {"ok.test": {"gh": 3}})
        self.assertEqual(r.body["callsByOutcome"], {"ok": 1})
        self.assertGreater(r.body["usage"]["fetchedBytes"], 0)


def unittest_skip(why):
    import unittest
    return unittest.SkipTest(why)


if __name__ == "__main__":
    sbtest.main()

#!/usr/bin/python3
"""Every path of the Redis token store against a real redis-server: the call-path script (found,
missing, expired, revoked token, revoked run, records it knows, records written in an older order,
unreadable records), the quotas it takes and gives back (calls, concurrency, fetched bytes), the
script cache emptied under traffic (NOSCRIPT), quota updates that fail (logged and counted), a node
that is or becomes a replica, wrong passwords and databases (what the log says), and
--check-config with network checks."""

import hashlib
import http.server
import json
import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redisfix  # noqa: E402
import sbtest  # noqa: E402
from sbtest import MSG_UNAUTHORIZED, poll  # noqa: E402

CAPS = {"services": ["mailer"], "net": ["127.0.0.1"]}
EGRESS = {"allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False}
GRANTED_MSG = "services dispatch is not implemented"
UNAVAILABLE_MSG = "sandbox token store is unavailable"
RELEASE_FAILED = 'sb_quota_update_failures_total{update="release"}'
FETCH_ADD_FAILED = 'sb_quota_update_failures_total{update="fetch_bytes"}'


def token_hash(tok):
    return hashlib.sha256(tok.encode()).hexdigest()


class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    arrived = threading.Event()  # set when a slow request reached the upstream

    def do_GET(self):
        if self.path.startswith("/slow"):
            Handler.arrived.set()
            time.sleep(1.0)
        body = b"x" * 100
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Base(sbtest.BrokerTestCase):
    def setUp(self):
        self.cleanups = []

    def tearDown(self):
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception:
                pass

    def node(self, **kw):
        n = redisfix.Node(**kw).start()
        self.cleanups.append(n.cleanup)
        return n

    def broker(self, url, threads=1, wait=True, config=None, **env):
        e = {"SANDBOX_BROKER_TOKEN_STORE": url, "SANDBOX_BROKER_THREADS": str(threads)}
        e.update(env)
        b = sbtest.Broker(env=e, config=config).start()
        self.cleanups.append(b.kill)
        if wait:
            self.assertTrue(b.wait_store_up(threads), b.log()[-3000:])
        return b

    def upstream(self):
        srv = Upstream(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.cleanups.append(srv.shutdown)
        return "http://127.0.0.1:%d" % srv.server_address[1]

    def call(self, b, tok, method="services.mailer.send", enc="json"):
        return b.rpc(tok, method, {}, enc=enc)

    def works(self, b, tok, enc="json"):
        self.assertError(self.call(b, tok, enc=enc), 501, "not_implemented", GRANTED_MSG, enc=enc)

    def refused(self, b, tok, enc="json"):
        self.assertError(self.call(b, tok, enc=enc), 401, "unauthorized", MSG_UNAUTHORIZED, enc=enc)

    def unavailable(self, b, tok, enc="json"):
        self.assertError(self.call(b, tok, enc=enc), 503, "unavailable", UNAVAILABLE_MSG, enc=enc)

    def events(self, b, name):
        return [e for e in b.events() if e.get("event") == name]

    def inflight(self, node, run):
        v = node.cmd("GET", "sb:q:inflight:" + run)
        return None if v is None else int(v)

    def calls_settle_at(self, node, run, n, prefix="sb:"):
        """The run's calls counter comes to n: calls leased and not used go back once the lease is idle."""
        key = prefix + "q:calls:" + run
        self.assertTrue(poll(lambda: node.cmd("GET", key) == str(n).encode(), 2.0), node.cmd("GET", key))


class Lookup(Base):
    """The call-path script: what it finds, and what it counts."""

    def setUp(self):
        super().setUp()
        self.r = self.node()
        self.b = self.broker(self.r.url)

    def test_found_missing_expired_revoked(self):
        tok = self.b.mint_ok("run-found", CAPS)
        for enc in ("json", "msgpack"):
            self.works(self.b, tok, enc)
            self.works(self.b, tok, enc)  # the second time the worker knows the record
        self.calls_settle_at(self.r, "run-found", 4)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-found") == 0, 2.0), "every slot came back")
        # never minted
        self.refused(self.b, "ab" * 32)
        self.refused(self.b, "ab" * 32, "msgpack")
        # expired by Redis
        r = self.b.mint("run-exp", CAPS, ttlMs=1000)
        self.assertEqual(r.status, 201, r)
        short = r.body["token"]
        self.works(self.b, short)
        time.sleep(max(0.0, (r.body["expiresAt"] + 150 - time.time() * 1000) / 1000.0))
        self.refused(self.b, short)
        # revoked token, revoked run
        t1 = self.b.mint_ok("run-rv", CAPS)
        t2 = self.b.mint_ok("run-rv", CAPS)
        t3 = self.b.mint_ok("run-keep", CAPS)
        for t in (t1, t2, t3):
            self.works(self.b, t)
        self.assertEqual(self.b.revoke_token(t1).status, 204)
        self.refused(self.b, t1)
        self.works(self.b, t2)
        self.assertEqual(self.b.revoke_run("run-rv").status, 204)
        self.refused(self.b, t2)
        self.works(self.b, t3)
        # a refusal takes no slot and counts no call
        self.calls_settle_at(self.r, "run-rv", 3)

    def test_expired_by_the_broker_clock_gives_the_slot_back(self):
        """A record Redis still holds but whose expiresAt has passed (clocks that disagree): refused,
        and the slot the script took for it goes back."""
        tok = self.b.mint_ok("run-skew", CAPS)
        self.works(self.b, tok)
        key = "sb:tok:" + token_hash(tok)
        rec = json.loads(self.r.cmd("GET", key))
        rec["mint"] = "0" * 32  # a new write carries a new mint id
        rec["expiresAt"] = int(time.time() * 1000) - 5000
        self.r.cmd("SET", key, json.dumps(rec, separators=(",", ":")), "PX", "60000")
        self.refused(self.b, tok)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-skew") == 0, 2.0), self.r.cmd("GET", "sb:q:inflight:run-skew"))

    def test_a_registered_again_token_is_read_again(self):
        """The worker keeps the parsed form of records it has seen: a token revoked and registered
        again with another manifest must be read again, not served from that memory."""
        own = hashlib.sha256(b"paths-own-token").hexdigest()
        self.assertEqual(self.b.mint("run-own", {"services": ["mailer"]}, token=own).status, 201)
        self.works(self.b, own)
        self.works(self.b, own)
        self.assertEqual(self.b.revoke_token(own).status, 204)
        self.refused(self.b, own)
        self.assertEqual(self.b.mint("run-own", {"services": ["billing"]}, token=own).status, 201)
        self.assertError(self.call(self.b, own), 403, "forbidden", 'service "mailer" is not granted')
        self.assertError(self.call(self.b, own, "services.billing.charge"), 501, "not_implemented", GRANTED_MSG)

    def legacy(self, run, tok, caps, order, exp_ms=None):
        """Writes a record the way an older version did: no mint id, keys in `order`."""
        exp = exp_ms or int(time.time() * 1000) + 60000
        fields = {"v": 1, "runId": run, "target": "", "scope": {}, "expiresAt": exp,
                  "quota": {"calls": 5, "concurrent": 2, "fetchBytes": 1000}, "capabilities": caps}
        rec = json.dumps({k: fields[k] for k in order}, separators=(",", ":"))
        self.r.cmd("SET", "sb:tok:" + token_hash(tok), rec, "PX", "60000")
        self.r.cmd("SADD", "sb:run:" + run, token_hash(tok))

    def test_records_in_the_older_key_order(self):
        tok = "cd" * 32
        self.legacy("run-old", tok, CAPS, ["v", "runId", "target", "scope", "expiresAt", "quota", "capabilities"])
        for _ in range(5):
            self.works(self.b, tok)
        self.assertError(self.call(self.b, tok), 429, "rate_limited", "run quota exceeded: calls per run")
        # a call refused for the calls quota is not counted: the counter never passes the quota
        self.calls_settle_at(self.r, "run-old", 5)
        self.assertGreater(self.r.cmd("PTTL", "sb:q:calls:run-old"), 0)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-old") == 0, 2.0))
        self.assertEqual(self.b.revoke_run("run-old").status, 204)
        self.refused(self.b, tok)

    def test_a_run_id_with_quotes_and_backslashes(self):
        run = 'run "quoted" \\back\\slash'
        tok = self.b.mint_ok(run, CAPS, quotas={"calls": 3})
        for _ in range(3):
            self.works(self.b, tok)
        self.assertError(self.call(self.b, tok), 429, "rate_limited", "run quota exceeded: calls per run")
        # the counters carry the run id itself, exactly
        self.calls_settle_at(self.r, run, 3)
        self.assertTrue(poll(lambda: self.inflight(self.r, run) == 0, 2.0))

    def test_unreadable_records_fail_closed(self):
        cases = [
            ("not json at all", "the script cannot read it"),
            (json.dumps({"v": 1, "runId": "run-bad"}), "no quota"),
            (json.dumps({"v": 1, "runId": 7, "expiresAt": 1, "quota": {"calls": 1, "concurrent": 1}}), "a numeric run id"),
        ]
        for i, (rec, why) in enumerate(cases):
            with self.subTest(why=why):
                tok = "%02x" % i * 32
                self.r.cmd("SET", "sb:tok:" + token_hash(tok), rec, "PX", "60000")
                self.unavailable(self.b, tok)
                self.unavailable(self.b, tok, "msgpack")
        # one the script can count but the broker cannot read (a manifest it refuses): refused, call and slot given back
        tok = "ef" * 32
        self.legacy("run-badcaps", tok, {"services": "not-a-list"},
                    ["v", "runId", "expiresAt", "quota", "target", "scope", "capabilities"])
        self.unavailable(self.b, tok)
        self.calls_settle_at(self.r, "run-badcaps", 0)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-badcaps") == 0, 2.0))

    def test_a_run_id_longer_than_any_the_broker_writes(self):
        """A record changed behind the broker's back to a run id longer than the longest it registers: the
        call is refused, and what the script counted against that id is never given back to another run
        whose id is its first 256 bytes (a cut id would name that run)."""
        run = "p" * 256
        tok = self.b.mint_ok(run, CAPS, quotas={"calls": 50})
        self.works(self.b, tok)
        self.works(self.b, tok)
        self.calls_settle_at(self.r, run, 2)
        forged = "ab" * 32
        self.legacy(run + "-tail", forged, CAPS, ["v", "runId", "expiresAt", "quota", "target", "scope", "capabilities"])
        self.unavailable(self.b, forged)
        self.assertTrue(poll(lambda: self.events(self.b, "redis.quota_update_failed"), 2.0), self.b.log()[-2000:])
        self.assertEqual(self.events(self.b, "redis.quota_update_failed")[0]["reason"],
                         "the record's run id is not one the broker writes")
        # the other run's counters are as its own calls left them
        time.sleep(0.3)
        self.calls_settle_at(self.r, run, 2)
        self.assertTrue(poll(lambda: self.inflight(self.r, run) == 0, 2.0))

    def test_counters_live_as_long_as_the_latest_token(self):
        a = self.b.mint("run-ttl", CAPS, ttlMs=2000)
        b = self.b.mint("run-ttl", CAPS, ttlMs=60000)
        self.assertEqual((a.status, b.status), (201, 201))
        self.works(self.b, a.body["token"])
        for kind in ("calls", "inflight"):
            self.assertGreater(self.r.cmd("PTTL", "sb:q:%s:run-ttl" % kind), 50000, kind)
        time.sleep(2.2)
        self.refused(self.b, a.body["token"])  # gone from Redis: nothing counted
        self.works(self.b, b.body["token"])
        self.calls_settle_at(self.r, "run-ttl", 2)

    def test_longest_prefix_and_run_id(self):
        """Keys the broker builds and keys the script builds must be the same bytes, however long."""
        prefix, run = "p" * 255 + ":", "r" * 256
        b = self.broker(self.r.url, SANDBOX_BROKER_REDIS_PREFIX=prefix)
        tok = b.mint_ok(run, CAPS, quotas={"calls": 2, "concurrent": 1})
        self.works(b, tok)
        self.works(b, tok)
        self.assertError(self.call(b, tok), 429, "rate_limited", "run quota exceeded: calls per run")
        self.calls_settle_at(self.r, run, 2, prefix)
        self.assertTrue(poll(lambda: self.r.cmd("GET", prefix + "q:inflight:" + run) == b"0", 2.0))
        self.assertEqual(redisfix.metric(b, RELEASE_FAILED), 0)
        rc, out, err = sbtest.run_broker_once(["--check-config"], sbtest.base_env(
            {"SANDBOX_BROKER_TOKEN_STORE": self.r.url, "SANDBOX_BROKER_REDIS_PREFIX": "p" * 257}))
        self.assertEqual(rc, 1, out)
        self.assertIn("redis_prefix: at most 256 bytes", err)

    def test_unix_socket(self):
        n = self.node(unixsocket=True)
        b = self.broker("unix://" + n.socket)
        tok = b.mint_ok("run-unix", CAPS)
        self.works(b, tok)
        self.calls_settle_at(n, "run-unix", 1)


class Tracking(Base):
    """Records kept while Redis tracks them, and quota leased: what a granted call asks Redis."""

    def setUp(self):
        super().setUp()
        self.r = self.node()
        self.b = self.broker(self.r.url)

    def evalsha_calls(self):
        for line in self.r.cmd("INFO", "commandstats").decode().splitlines():
            if line.startswith("cmdstat_evalsha:"):
                return int(line.split("calls=")[1].split(",")[0])
        return 0

    def connections(self, name):
        out = []
        for line in self.r.cmd("CLIENT", "LIST").decode().splitlines():
            f = dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
            if f.get("name") == name:
                out.append(f)
        return out

    def test_granted_calls_in_steady_state_ask_redis_nothing(self):
        # no timeline: its events are written to Redis after the replies, batched, and would be counted below
        self.b = self.broker(self.r.url, SANDBOX_BROKER_TIMELINE_MAX_EVENTS="0")
        tok = self.b.mint_ok("run-steady", CAPS, quotas={"calls": 100000})
        for _ in range(3):
            self.works(self.b, tok)
        before, local = self.evalsha_calls(), redisfix.metric(self.b, 'sb_redis_lookups_total{path="local"}')
        for _ in range(120):
            self.works(self.b, tok)
        asked = self.evalsha_calls() - before
        # leases of 4, 8, 16, 32, 64 calls: five scripts for 120 calls, not 120
        self.assertLessEqual(asked, 6)
        self.assertGreaterEqual(redisfix.metric(self.b, 'sb_redis_lookups_total{path="local"}') - local, 114)
        # once idle, the leased calls not used go back: the counter is what was used
        self.calls_settle_at(self.r, "run-steady", 123)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-steady") == 0, 2.0))

    def test_links_are_named_and_tracking(self):
        data, inv = self.connections("sandbox-broker:data"), self.connections("sandbox-broker:inv")
        self.assertEqual((len(data), len(inv)), (1, 1))
        self.assertIn("t", data[0]["flags"])  # CLIENT TRACKING on
        self.assertIn("P", inv[0]["flags"])  # subscribed
        self.assertEqual(data[0]["redir"], inv[0]["id"])

    def test_a_record_deleted_in_redis_is_refused_without_the_broker_being_told(self):
        tok = self.b.mint_ok("run-del", CAPS)
        for _ in range(3):
            self.works(self.b, tok)
        # straight in Redis: only the invalidation can tell the broker
        self.assertEqual(self.r.cmd("DEL", "sb:tok:" + token_hash(tok)), 1)
        self.assertTrue(poll(lambda: self.call(self.b, tok).status == 401, 1.0))
        for _ in range(20):
            self.refused(self.b, tok)
        # FLUSHALL drops everything tracked too
        tok2 = self.b.mint_ok("run-flushall", CAPS)
        self.works(self.b, tok2)
        self.works(self.b, tok2)
        self.assertEqual(self.r.cmd("FLUSHALL"), "OK")
        self.assertTrue(poll(lambda: self.call(self.b, tok2).status == 401, 1.0))

    def test_the_invalidation_link_lost_fails_closed_then_recovers(self):
        tok = self.b.mint_ok("run-inv", CAPS)
        for _ in range(3):
            self.works(self.b, tok)
        inv = self.connections("sandbox-broker:inv")
        self.assertEqual(len(inv), 1)
        self.assertEqual(self.r.cmd("CLIENT", "KILL", "ID", inv[0]["id"]), 1)
        # whatever the broker answers from now on, the record deleted behind its back is never granted
        self.assertEqual(self.r.cmd("DEL", "sb:tok:" + token_hash(tok)), 1)
        seen = set()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            r = self.call(self.b, tok)
            seen.add(r.status)
            if r.status == 401:
                break
        self.assertNotIn(501, seen)
        self.assertTrue(seen <= {401, 503}, seen)
        self.assertTrue(poll(lambda: self.call(self.b, tok).status == 401, 1.0))
        down = [e for e in self.events(self.b, "redis.down") if "invalidation link" in e["reason"]]
        self.assertEqual(len(down), 1, self.events(self.b, "redis.down"))
        self.assertTrue(down[0]["reason"].startswith("the invalidation link was lost: "), down[0])
        self.assertGreaterEqual(redisfix.metric(self.b, "sb_redis_tracking_lost_total"), 1)
        tok2 = self.b.mint_ok("run-inv2", CAPS)
        self.works(self.b, tok2)
        self.assertEqual(len(self.connections("sandbox-broker:inv")), 1)

    def test_a_stopping_broker_gives_its_leases_back(self):
        tok = self.b.mint_ok("run-stop", CAPS, quotas={"calls": 100000})
        for _ in range(20):
            self.works(self.b, tok)
        # leases of 1, 2, 4, 8 and 16: 31 calls counted for 20 used, until they go back
        self.assertEqual(self.b.stop(), 0)
        self.assertEqual(self.r.cmd("GET", "sb:q:calls:run-stop"), b"20")
        self.assertEqual(self.inflight(self.r, "run-stop"), 0)
        self.assertEqual(self.events(self.b, "redis.quota_update_failed"), [])

    def test_a_token_registered_again_for_another_run_takes_nothing_of_the_old_lease(self):
        tok = self.b.mint_ok("run-old-lease", CAPS, quotas={"calls": 100000})
        for _ in range(100):
            self.works(self.b, tok)
        # leases of 1, 2, 4 ... 64: the worker holds 27 calls of run-old-lease unused
        self.assertEqual(self.b.revoke_token(tok).status, 204)
        r = self.b.mint("run-new-lease", CAPS, token=tok, quotas={"calls": 3})
        self.assertEqual(r.status, 201, r.body)
        answers = [self.call(self.b, tok).status for _ in range(30)]
        self.assertEqual(answers.count(501), 3, answers)
        self.assertEqual(answers.count(429), 27, answers)
        self.calls_settle_at(self.r, "run-new-lease", 3)
        self.calls_settle_at(self.r, "run-old-lease", 100)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-new-lease") == 0, 2.0))
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-old-lease") == 0, 2.0))

    def test_calls_that_miss_the_lease_together_do_not_each_take_a_block(self):
        tok = self.b.mint_ok("run-burst", CAPS, quotas={"calls": 100000, "concurrent": 64})
        for _ in range(511):
            self.works(self.b, tok)  # leases 1 ... 256: the next asks for 256
        out = []
        barrier = threading.Barrier(48)

        def one():
            barrier.wait()
            out.append(self.call(self.b, tok).status)

        threads = [threading.Thread(target=one) for _ in range(48)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(out.count(501), 48, out)
        held = int(self.r.cmd("GET", "sb:q:calls:run-burst")) - 559
        self.assertLessEqual(held, 256)  # one block at a time, and a lease never holds more
        self.calls_settle_at(self.r, "run-burst", 559)

    def test_a_counter_that_is_not_a_number_costs_the_run_nothing(self):
        tok = self.b.mint_ok("run-nan", CAPS, quotas={"calls": 100000, "concurrent": 8})
        for _ in range(100):
            self.works(self.b, tok)
        self.calls_settle_at(self.r, "run-nan", 100)
        self.r.cmd("SET", "sb:q:inflight:run-nan", "x", "KEEPTTL")
        for _ in range(10):
            self.unavailable(self.b, tok)
        self.assertEqual(self.r.cmd("GET", "sb:q:calls:run-nan"), b"100")
        self.r.cmd("SET", "sb:q:inflight:run-nan", "0", "KEEPTTL")
        self.works(self.b, tok)
        self.calls_settle_at(self.r, "run-nan", 101)

    def test_calls_quota_is_exact_with_leases(self):
        tok = self.b.mint_ok("run-exact", CAPS, quotas={"calls": 50})
        granted = 0
        for _ in range(60):
            r = self.call(self.b, tok)
            if r.status == 501:
                granted += 1
            else:
                self.assertError(r, 429, "rate_limited", "run quota exceeded: calls per run")
        self.assertEqual(granted, 50)
        self.calls_settle_at(self.r, "run-exact", 50)


class Quotas(Base):
    """Concurrency slots and fetched bytes through Redis, and updates that fail."""

    def setUp(self):
        super().setUp()
        self.r = self.node()
        self.url = self.upstream()
        self.b = self.broker(self.r.url, config={"egress": EGRESS})

    def slow_call(self, tok, results):
        results.append(self.b.rpc(tok, "http.fetch", {"url": self.url + "/slow"}, timeout=10))

    def start_slow_call(self, tok, results):
        """A fetch that holds its slot for a second; returns once the upstream has the request, so the
        call's own quota checks (the slot, the fetched bytes so far) are behind it."""
        Handler.arrived.clear()
        t = threading.Thread(target=self.slow_call, args=(tok, results))
        t.start()
        self.assertTrue(Handler.arrived.wait(5.0), "the slow request never reached the upstream")
        return t

    def test_concurrency_slot_taken_and_given_back(self):
        tok = self.b.mint_ok("run-conc", CAPS, quotas={"concurrent": 1})
        out = []
        t = self.start_slow_call(tok, out)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-conc") == 1, 2.0))
        self.assertError(self.call(self.b, tok), 429, "rate_limited", "run quota exceeded: concurrent calls per run")
        t.join()
        self.assertEqual(out[0].status, 200, out[0])
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-conc") == 0, 2.0))
        self.works(self.b, tok)
        self.assertEqual(redisfix.metric(self.b, RELEASE_FAILED), 0)

    def test_fetched_bytes(self):
        tok = self.b.mint_ok("run-bytes", CAPS, quotas={"fetchBytes": 150})
        for path in ("/a", "/b"):
            r = self.b.rpc(tok, "http.fetch", {"url": self.url + path})
            self.assertEqual(r.status, 200, r)
        self.assertTrue(poll(lambda: self.r.cmd("GET", "sb:q:bytes:run-bytes") == b"200", 2.0))
        self.assertGreater(self.r.cmd("PTTL", "sb:q:bytes:run-bytes"), 0)
        r = self.b.rpc(tok, "http.fetch", {"url": self.url + "/c"})
        self.assertError(r, 429, "rate_limited", "run quota exceeded: fetched bytes per run")
        # a counter that is not a number: fail closed
        self.r.cmd("SET", "sb:q:bytes:run-bytes", "junk", "KEEPTTL")
        r = self.b.rpc(tok, "http.fetch", {"url": self.url + "/d"})
        self.assertError(r, 503, "unavailable", "the token store is unavailable")
        self.assertEqual(redisfix.metric(self.b, FETCH_ADD_FAILED), 0)

    def test_a_fetched_bytes_update_that_fails_is_logged_and_counted(self):
        tok = self.b.mint_ok("run-addfail", CAPS)
        out = []
        t = self.start_slow_call(tok, out)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-addfail") == 1, 2.0))
        self.r.cmd("SET", "sb:q:bytes:run-addfail", "junk", "PX", "60000")
        t.join()
        self.assertEqual(out[0].status, 200, out[0])
        self.assertTrue(poll(lambda: redisfix.metric(self.b, FETCH_ADD_FAILED) == 1, 2.0))
        ev = self.events(self.b, "redis.quota_update_failed")
        self.assertEqual(len(ev), 1, ev)
        self.assertEqual((ev[0]["update"], ev[0]["runId"]), ("fetch_bytes", "run-addfail"))
        self.assertIn("not an integer", ev[0]["reason"])

    def test_a_release_that_fails_is_logged_and_counted(self):
        tok = self.b.mint_ok("run-relfail", CAPS)
        out = []
        t = self.start_slow_call(tok, out)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-relfail") == 1, 2.0))
        self.r.cmd("SET", "sb:q:inflight:run-relfail", "x", "KEEPTTL")
        t.join()
        # the call's answer did not wait for the release, and is right
        self.assertEqual(out[0].status, 200, out[0])
        self.assertTrue(poll(lambda: redisfix.metric(self.b, RELEASE_FAILED) == 1, 2.0))
        ev = self.events(self.b, "redis.quota_update_failed")
        self.assertEqual([(e["update"], e["runId"], e["reason"]) for e in ev],
                         [("release", "run-relfail", "the in-flight counter is not a number")])
        # the counter the next call cannot count with: unavailable, until it is a number again
        self.unavailable(self.b, tok)
        self.r.cmd("SET", "sb:q:inflight:run-relfail", "0", "KEEPTTL")
        self.works(self.b, tok)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-relfail") == 0, 2.0))
        self.assertEqual(redisfix.metric(self.b, RELEASE_FAILED), 1)
        self.assertNotIn(tok, self.b.log())

    def test_a_release_lost_with_redis_is_logged_and_counted(self):
        tok = self.b.mint_ok("run-lost", CAPS)
        out = []
        t = self.start_slow_call(tok, out)
        self.assertTrue(poll(lambda: self.inflight(self.r, "run-lost") == 1, 2.0))
        self.r.kill()
        t.join()
        self.assertEqual(out[0].status, 200, out[0])
        # the fetched bytes could not be added
        self.assertTrue(poll(lambda: redisfix.metric(self.b, FETCH_ADD_FAILED) == 1, 2.0), self.b.log()[-2000:])
        # the slot went back to the worker's lease, kept for Redis's return: nothing lost yet
        time.sleep(0.3)
        self.assertEqual(redisfix.metric(self.b, RELEASE_FAILED), 0)
        # a worker that stops while Redis is away cannot give its lease back: that is logged
        self.assertEqual(self.b.stop(), 0)
        ev = self.events(self.b, "redis.quota_update_failed")
        self.assertEqual(sorted((e["update"], e["runId"], e["reason"]) for e in ev),
                         [("fetch_bytes", "run-lost", "the token store is unavailable"),
                          ("release", "run-lost", "the worker stopped before it was sent")])


class ScriptCache(Base):
    def test_script_flush_under_traffic_is_invisible(self):
        r = self.node()
        b = self.broker(r.url, threads=2)
        tok = b.mint_ok("run-flush", CAPS, quotas={"calls": 1000000, "concurrent": 64})
        stop = threading.Event()
        answers, lock = [], threading.Lock()

        def load():
            while not stop.is_set():
                resp = self.call(b, tok)
                with lock:
                    answers.append((resp.status, resp.raw[:200]))

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for _ in range(6):
                time.sleep(0.3)
                self.assertEqual(r.cmd("SCRIPT", "FLUSH"), "OK")
            time.sleep(0.3)
        finally:
            stop.set()
            for t in threads:
                t.join()
        bad = [a for a in answers if a[0] != 501]
        self.assertEqual(bad[:3], [], "%d of %d answers were not 501" % (len(bad), len(answers)))
        self.assertGreater(len(answers), 50)
        self.assertGreater(redisfix.metric(b, "sb_redis_script_reloads_total"), 0)
        self.assertTrue(poll(lambda: self.inflight(r, "run-flush") == 0, 2.0), r.cmd("GET", "sb:q:inflight:run-flush"))
        self.calls_settle_at(r, "run-flush", len(answers))
        # every other script too
        r.cmd("SCRIPT", "FLUSH")
        t2 = b.mint_ok("run-flush-2", CAPS)
        self.works(b, t2)
        r.cmd("SCRIPT", "FLUSH")
        self.assertEqual(b.revoke_run("run-flush-2").status, 204)
        self.refused(b, t2)
        self.assertEqual(redisfix.metric(b, RELEASE_FAILED), 0)


class Replicas(Base):
    """A node that is, or becomes, a replica is never used: everything it might say could be stale."""

    def test_a_replica_is_refused_until_promoted(self):
        p = self.node()
        rep = self.node(replicaof=p.port)
        a = self.broker(p.url)
        tok = a.mint_ok("run-rep", CAPS)
        h = "sb:tok:" + token_hash(tok)
        self.assertTrue(poll(lambda: rep.cmd("GET", h) is not None, 5.0), "the replica never got the record")
        b = self.broker(rep.url, wait=False)
        self.assertTrue(poll(lambda: any(e.get("reason") == "the node is not a primary (ROLE: slave)"
                                         for e in self.events(b, "redis.down")), 5.0), b.log()[-2000:])
        self.assertEqual(b.admin("GET", "/readyz").status, 503)
        self.unavailable(b, tok)
        self.assertEqual(rep.cmd("REPLICAOF", "NO", "ONE"), "OK")
        self.assertTrue(poll(lambda: self.call(b, tok).status == 501, 5.0), b.log()[-2000:])

        # the primary A uses turns replica under it: from then on, never a grant
        self.assertEqual(p.cmd("REPLICAOF", "127.0.0.1", str(rep.port)), "OK")
        statuses = [self.call(a, tok).status for _ in range(20)]
        self.assertEqual(set(statuses), {503}, statuses)
        self.assertTrue(poll(lambda: a.admin("GET", "/readyz").status == 503, 3.0))
        reasons = [e.get("reason") for e in self.events(a, "redis.down")]
        self.assertTrue(any(r.startswith("the node answered READONLY") or "no longer a primary" in r for r in reasons), reasons)
        self.assertEqual(p.cmd("REPLICAOF", "NO", "ONE"), "OK")
        self.assertTrue(poll(lambda: self.call(a, tok).status == 501, 5.0), a.log()[-2000:])


class Auth(Base):
    """Passwords and databases: what the log says, and --check-config."""

    def test_wrong_password_one_line_that_says_so(self):
        n = self.node(password="right-password-0123")
        b = self.broker(n.url, threads=2, wait=False, SANDBOX_BROKER_REDIS_PASSWORD="wrong-password-4567")
        time.sleep(1.5)  # several attempts
        down = self.events(b, "redis.down")
        self.assertEqual(len(down), 2, down)  # one per worker connection, not one per attempt
        for e in down:
            self.assertEqual(e["addr"], "127.0.0.1:%d" % n.port)
            self.assertTrue(e["reason"].startswith("AUTH refused: WRONGPASS"), e)
        self.assertNotIn("timed out", b.log())
        self.assertNotIn("wrong-password-4567", b.log())
        self.assertNotIn("right-password-0123", b.log())
        self.assertEqual(b.admin("GET", "/readyz").status, 503)
        # the operator fixes Redis: the broker follows by itself
        self.assertEqual(n.cmd("CONFIG", "SET", "requirepass", "wrong-password-4567"), "OK")
        n.password = "wrong-password-4567"
        self.assertTrue(b.wait_store_up(2, timeout=10), b.log()[-2000:])
        tok = b.mint_ok("run-auth", CAPS)
        self.works(b, tok)

    def test_password_from_a_file_and_a_database(self):
        n = self.node(password="file-password-0123")
        path = redisfix.write_secret(n.dir, "redis-pw", "file-password-0123")
        b = self.broker(n.url + "/5", SANDBOX_BROKER_REDIS_PASSWORD_FILE=path)
        tok = b.mint_ok("run-file", CAPS)
        self.works(b, tok)
        keys = command_in_db(n, 5, "KEYS", "sb:tok:*")
        self.assertEqual(len(keys), 1)
        self.assertEqual(n.cmd("KEYS", "sb:tok:*"), [])  # nothing in database 0

    def test_wrong_database(self):
        n = self.node()
        b = self.broker(n.url + "/99", wait=False)
        self.assertTrue(poll(lambda: any(e.get("reason") == "SELECT refused: ERR DB index is out of range"
                                         for e in self.events(b, "redis.down")), 5.0), b.log()[-2000:])
        self.assertEqual(len(self.events(b, "redis.down")), 1)

    def check(self, url, **env):
        e = {"SANDBOX_BROKER_TOKEN_STORE": url}
        e.update(env)
        return sbtest.run_broker_once(["--check-config"], sbtest.base_env(e))

    def test_check_config_authenticates_and_selects(self):
        n = self.node(password="check-password-0123")
        rc, out, err = self.check(n.url + "/3", SANDBOX_BROKER_REDIS_PASSWORD="check-password-0123")
        self.assertEqual((rc, out.strip()), (0, "configuration OK"), err)
        where = "127.0.0.1:%d" % n.port
        rc, out, err = self.check(n.url, SANDBOX_BROKER_REDIS_PASSWORD="not-the-password")
        self.assertEqual(rc, 4, out)  # credentials refused: the status a wrong database password gets too
        self.assertIn("token store: %s: AUTH refused: WRONGPASS" % where, err)
        self.assertNotIn("not-the-password", err + out)
        rc, out, err = self.check(n.url + "/99", SANDBOX_BROKER_REDIS_PASSWORD="check-password-0123")
        self.assertEqual(rc, 1, out)
        self.assertIn("token store: %s: SELECT refused: ERR DB index is out of range" % where, err)
        rc, out, err = self.check("redis://127.0.0.1:%d" % sbtest.closed_port())
        self.assertEqual(rc, 3, out)  # down now: valid, the broker would start and say so on /readyz
        self.assertIn(": connect failed: Connection refused", err)
        rep = self.node(replicaof=n.port, password="check-password-0123")
        rc, out, err = self.check(rep.url, SANDBOX_BROKER_REDIS_PASSWORD="check-password-0123")
        self.assertEqual(rc, 1, out)
        self.assertIn("127.0.0.1:%d: the node is not a primary (ROLE: slave)" % rep.port, err)

    def test_tracking_refused_by_an_acl_says_so(self):
        """A user that may not turn CLIENT TRACKING on: --check-config and the running broker both name it."""
        n = self.node()
        where = "127.0.0.1:%d" % n.port
        rc, out, err = self.check(n.url)
        self.assertEqual((rc, out.strip()), (0, "configuration OK"), err)
        # nothing of the check stays behind: tracking off, the heartbeat key expiring
        self.assertNotIn("flags=t", n.cmd("CLIENT", "LIST").decode())
        self.assertEqual(n.cmd("ACL", "SETUSER", "default", "-client|tracking"), "OK")
        rc, out, err = self.check(n.url)
        self.assertEqual(rc, 1, out)
        self.assertIn("token store: %s: CLIENT TRACKING refused: NOPERM" % where, err)
        b = self.broker(n.url, wait=False)
        self.assertTrue(poll(lambda: any(e["reason"].startswith("CLIENT TRACKING refused: NOPERM")
                                         for e in self.events(b, "redis.down")), 5.0), b.log()[-2000:])
        self.assertEqual(b.admin("GET", "/readyz").status, 503)
        self.assertEqual(n.cmd("ACL", "SETUSER", "default", "+client|tracking"), "OK")
        self.assertTrue(b.wait_store_up(1), b.log()[-2000:])


def command_in_db(node, db, *args):
    """A command in database `db` (SELECT first) on one connection."""
    import socket
    req = b""
    cmds = ([("AUTH", node.password)] if node.password else []) + [("SELECT", str(db)), args]
    for cmd in cmds:
        req += b"*%d\r\n" % len(cmd)
        for a in cmd:
            a = a if isinstance(a, bytes) else str(a).encode()
            req += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as s:
        s.sendall(req)
        f = s.makefile("rb")
        out = None
        for _ in cmds:
            out = sbtest._resp_read(f)
        return out


if __name__ == "__main__":
    unittest.main(verbosity=2)

#!/usr/bin/python3
"""The redis-sentinel:// store against Debian's redis-sentinel: one primary, one replica, three
sentinels (quorum 2) on loopback, passwords on the data nodes and on the sentinels (both from files),
two brokers under load.

* The primary is killed: calls answer 503 `unavailable` (a revoked token never 200, never 501 here),
  then succeed against the promoted replica; a revocation acknowledged and replicated before the
  failover stays revoked. The time from the promotion (the replica's ROLE turning master) and from
  +switch-master to each broker's first good answer is printed (goal < 2 s), not asserted;
  tests/bench/failover.sh reports it as a benchmark.
* A manual failover (SENTINEL FAILOVER) demotes a live primary: the brokers move on and never grant
  from the demoted node.
* No sentinel answers: after the grace period every call is 503, and the brokers are back when the
  sentinels are.
"""

import os
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redisfix  # noqa: E402
import sbtest  # noqa: E402
from sbtest import poll  # noqa: E402

CAPS = {"services": ["mailer"]}
LOAD_QUOTAS = {"calls": 1000000, "concurrent": 256}
DATA_PW = "data-password-0123456789"
SENTINEL_PW = "sentinel-password-0123456789"
GRANTED = (501, "not_implemented", "services dispatch is not implemented")
UNAVAILABLE = (503, "unavailable", "sandbox token store is unavailable")
REFUSED = (401, "unauthorized", sbtest.MSG_UNAUTHORIZED)


class Load:
    """Threads calling through both brokers, with a live token and a revoked one, every answer kept."""

    def __init__(self, brokers, live, revoked, threads=3):
        self.brokers, self.live, self.revoked = brokers, live, revoked
        self.answers, self.lock, self.stop_ev = [], threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(threads * len(brokers))]

    def _run(self, i):
        b = self.brokers[i % len(self.brokers)]
        n = 0
        while not self.stop_ev.is_set():
            which = "revoked" if n % 4 == 3 else "live"
            n += 1
            sent = time.monotonic()
            try:
                r = b.rpc(self.revoked if which == "revoked" else self.live, "services.mailer.send", {}, timeout=5)
                err = r.body.get("error", {}) if isinstance(r.body, dict) else {}
                ans = (r.status, err.get("code"), err.get("message"))
            except OSError as e:
                ans = ("error", type(e).__name__, str(e))
            with self.lock:
                self.answers.append((i % len(self.brokers), which, sent, time.monotonic(), ans))

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(10)

    def snapshot(self):
        with self.lock:
            return list(self.answers)


class Topology(sbtest.BrokerTestCase):
    def setUp(self):
        self.cleanups = []
        self.dir = tempfile.mkdtemp(prefix="sbsentinel-test-")
        self.primary = self.add(redisfix.Node(password=DATA_PW).start())
        self.replica = self.add(redisfix.Node(password=DATA_PW, replicaof=self.primary.port).start())
        self.sentinels = [self.add(redisfix.Sentinel(self.primary, password=SENTINEL_PW).start()) for _ in range(3)]
        # a failover needs the sentinels to know the replica and each other
        def discovered():
            try:
                return all(len(s.cmd("SENTINEL", "replicas", "sbmaster")) == 1 and
                           len(s.cmd("SENTINEL", "sentinels", "sbmaster")) == 2 for s in self.sentinels)
            except (OSError, RuntimeError):
                return False
        self.assertTrue(poll(discovered, 20.0, interval=0.1), "the sentinels never found each other")
        url = "redis-sentinel://%s/sbmaster" % ",".join(s.addr for s in self.sentinels)
        env = {"SANDBOX_BROKER_TOKEN_STORE": url, "SANDBOX_BROKER_THREADS": "2", "SANDBOX_BROKER_LOG_CALLS": "false",
               "SANDBOX_BROKER_REDIS_PASSWORD_FILE": redisfix.write_secret(self.dir, "data-pw", DATA_PW),
               "SANDBOX_BROKER_REDIS_SENTINEL_PASSWORD_FILE": redisfix.write_secret(self.dir, "sentinel-pw", SENTINEL_PW)}
        self.brokers = []
        for _ in range(2):
            b = sbtest.Broker(env=env).start()
            self.cleanups.append(b.kill)
            self.brokers.append(b)
        for b in self.brokers:
            self.assertTrue(b.wait_store_up(2), b.log()[-3000:])
            self.assertEqual(b.wait_for_event("started").get("tokenStore"), "redis-sentinel")
            up = [e for e in b.events() if e.get("event") == "redis.up"]
            self.assertEqual({e.get("addr") for e in up}, {"127.0.0.1:%d" % self.primary.port}, up)

    def add(self, thing):
        self.cleanups.append(thing.cleanup)
        return thing

    def tearDown(self):
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception:
                pass
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)

    def tokens(self):
        a, b = self.brokers
        live = a.mint_ok("run-live", CAPS, quotas=LOAD_QUOTAS)
        revoked = b.mint_ok("run-revoked", CAPS, quotas=LOAD_QUOTAS)
        for br in self.brokers:
            self.assertError(br.rpc(live, "services.mailer.send", {}), *GRANTED)
            self.assertError(br.rpc(revoked, "services.mailer.send", {}), *GRANTED)
        self.assertEqual(a.revoke_token(revoked).status, 204)
        # acknowledged, and replicated before the failover
        import hashlib
        key = "sb:tok:" + hashlib.sha256(revoked.encode()).hexdigest()
        live_key = "sb:tok:" + hashlib.sha256(live.encode()).hexdigest()
        self.assertTrue(poll(lambda: self.replica.cmd("EXISTS", key) == 0 and self.replica.cmd("EXISTS", live_key) == 1,
                             5.0), "the revocation never reached the replica")
        for br in self.brokers:
            self.assertError(br.rpc(revoked, "services.mailer.send", {}), *REFUSED)
        return live, revoked

    def watch_promotion(self):
        """Stamps the moment the replica's ROLE turns master."""
        out = {}

        def run():
            t_end = time.monotonic() + 30
            while time.monotonic() < t_end and "t" not in out:
                if self.replica.role() == "master":
                    out["t"] = time.monotonic()
                time.sleep(0.005)
        threading.Thread(target=run, daemon=True).start()
        return out

    def check_failover(self, load, t_start, promoted, switch):
        """Waits for each broker's first good answer after the failover; checks every answer."""
        firsts = [None, None]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and None in firsts:
            for bi, which, sent, recv, ans in load.snapshot():
                if which == "live" and ans == GRANTED and sent > switch_or(switch, promoted, t_start) and firsts[bi] is None:
                    firsts[bi] = recv
            time.sleep(0.01)
        load.stop()
        answers = load.snapshot()
        self.assertNotIn(None, firsts, "a broker never answered after the failover:\n%s" %
                         "\n".join(b.log()[-3000:] for b in self.brokers))
        bad_revoked = [a for a in answers if a[1] == "revoked" and a[4] not in (REFUSED, UNAVAILABLE)]
        self.assertEqual(bad_revoked[:3], [], "a revoked token was answered otherwise than 401/503")
        bad_live = [a for a in answers if a[1] == "live" and a[4] not in (GRANTED, UNAVAILABLE)]
        self.assertEqual(bad_live[:3], [], "%d wrong answers for the live token" % len(bad_live))
        return firsts

    def after_failover(self, live, revoked, new_primary):
        a, b = self.brokers
        for br in self.brokers:
            self.assertError(br.rpc(revoked, "services.mailer.send", {}), *REFUSED)
            self.assertError(br.rpc(live, "services.mailer.send", {}), *GRANTED)
            self.assertGreaterEqual(redisfix.metric(br, "sb_redis_primary_switches_total"), 1)
            sw = [e for e in br.events() if e.get("event") == "redis.switch"]
            self.assertTrue(sw and all(e["to"] == "127.0.0.1:%d" % new_primary.port for e in sw), sw)
            self.assertEqual(br.admin("GET", "/readyz").status, 200)
        # writes go to the new primary and are seen by both
        t = b.mint_ok("run-after", CAPS)
        self.assertError(a.rpc(t, "services.mailer.send", {}), *GRANTED)
        self.assertEqual(a.revoke_run("run-after").status, 204)
        self.assertError(b.rpc(t, "services.mailer.send", {}), *REFUSED)
        self.assertEqual(new_primary.role(), "master")


def switch_or(switch, promoted, t_start):
    """The failure is over from the broker's point of view once a sentinel has said so."""
    if switch is not None:
        return min(switch, promoted or switch)
    return promoted or t_start


class Failover(Topology):
    def test_primary_killed_under_load(self):
        live, revoked = self.tokens()
        sub = redisfix.Subscriber(self.sentinels[0].port, "+switch-master", password=SENTINEL_PW)
        self.cleanups.append(sub.close)
        load = Load(self.brokers, live, revoked).start()
        time.sleep(0.5)
        promoted = self.watch_promotion()
        t_kill = time.monotonic()
        self.primary.kill()
        self.assertTrue(poll(lambda: sub.first() is not None and "t" in promoted, 20.0), "no failover")
        t_switch = sub.first()[0]
        firsts = self.check_failover(load, t_kill, promoted["t"], t_switch)
        n503 = sum(1 for a in load.snapshot() if a[4] == UNAVAILABLE)
        self.assertGreater(n503, 0, "the failover was never seen by a call")
        sys.stderr.write("\n  primary killed: promoted %.2f s later, +switch-master %.2f s later" %
                         (promoted["t"] - t_kill, t_switch - t_kill))
        for i, f in enumerate(firsts):
            sys.stderr.write("\n  broker %s: first good answer %.0f ms after the promotion, %.0f ms after +switch-master"
                             % ("AB"[i], (f - promoted["t"]) * 1000, (f - t_switch) * 1000))
        sys.stderr.write("\n  %d answers in all, %d of them 503 unavailable\n" % (len(load.snapshot()), n503))
        self.after_failover(live, revoked, self.replica)

    def test_manual_failover_demotes_a_live_primary(self):
        live, revoked = self.tokens()
        load = Load(self.brokers, live, revoked).start()
        time.sleep(0.3)
        promoted = self.watch_promotion()
        t0 = time.monotonic()
        self.assertEqual(self.sentinels[1].cmd("SENTINEL", "FAILOVER", "sbmaster"), "OK")
        self.assertTrue(poll(lambda: "t" in promoted, 20.0), "no promotion")
        self.assertTrue(poll(lambda: self.primary.role() == "slave", 20.0), "the old primary was never demoted")
        self.check_failover(load, t0, promoted["t"], None)
        self.after_failover(live, revoked, self.replica)
        # the demoted node is not used: a record written behind the brokers' backs on it is never seen
        for br in self.brokers:
            reasons = [e.get("reason", "") for e in br.events() if e.get("event") == "redis.down"]
            self.assertTrue(any("moved to 127.0.0.1:%d" % self.replica.port in r for r in reasons), reasons)


class NoSentinel(Topology):
    def test_no_sentinel_answers(self):
        live, _ = self.tokens()
        for s in self.sentinels:
            s.stop()
        # within the grace period (2 queries + the store timeout) every call turns 503, on both; each worker
        # counts the grace from its own last confirmation, so wait until a run of calls (spread over the
        # workers) are all refused
        for br in self.brokers:
            self.assertTrue(poll(lambda: all(br.rpc(live, "services.mailer.send", {}).status == 503 for _ in range(8)), 10.0),
                            br.log()[-3000:])
            self.assertError(br.rpc(live, "services.mailer.send", {}), *UNAVAILABLE)
            self.assertTrue(poll(lambda: br.admin("GET", "/readyz").status == 503, 3.0))
            down = [e for e in br.events() if e.get("event") == "redis.down"]
            self.assertTrue(any(e.get("reason", "").startswith("no sentinel has confirmed this primary within")
                                for e in down), down)
            sdown = [e for e in br.events() if e.get("event") == "redis.sentinel_down"]
            self.assertTrue(sdown and all(e["addr"] in [s.addr for s in self.sentinels] for e in sdown), sdown)
            self.assertNotIn(SENTINEL_PW, br.log())
            self.assertNotIn(DATA_PW, br.log())
        for s in self.sentinels:
            s.start()
        for br in self.brokers:
            self.assertTrue(poll(lambda: br.rpc(live, "services.mailer.send", {}).status == 501, 10.0), br.log()[-3000:])


class CheckConfig(sbtest.BrokerTestCase):
    def test_check_config_asks_the_sentinels(self):
        d = tempfile.mkdtemp(prefix="sbsentinel-check-")
        p = redisfix.Node(password=DATA_PW).start()
        s = redisfix.Sentinel(p, password=SENTINEL_PW).start()
        dead = "127.0.0.1:%d" % sbtest.closed_port()
        try:
            env = {"SANDBOX_BROKER_TOKEN_STORE": "redis-sentinel://%s,%s/sbmaster" % (dead, s.addr),
                   "SANDBOX_BROKER_REDIS_PASSWORD_FILE": redisfix.write_secret(d, "d", DATA_PW),
                   "SANDBOX_BROKER_REDIS_SENTINEL_PASSWORD_FILE": redisfix.write_secret(d, "s", SENTINEL_PW)}
            rc, out, err = sbtest.run_broker_once(["--check-config"], sbtest.base_env(env))
            self.assertEqual((rc, out.strip()), (0, "configuration OK"), err)
            env["SANDBOX_BROKER_REDIS_SENTINEL_PASSWORD_FILE"] = redisfix.write_secret(d, "s2", "wrong-sentinel-pw")
            rc, out, err = sbtest.run_broker_once(["--check-config"], sbtest.base_env(env))
            self.assertEqual(rc, 4, out)  # a refused password: "credentials refused"
            self.assertIn("sandbox-broker: credentials refused: token store: ", err)
            self.assertIn("no sentinel named the primary: %s (sentinel): connect failed: Connection refused; "
                          "%s (sentinel): AUTH refused: WRONGPASS" % (dead, s.addr), err)
            self.assertNotIn("wrong-sentinel-pw", err)
            env["SANDBOX_BROKER_REDIS_SENTINEL_PASSWORD_FILE"] = redisfix.write_secret(d, "s3", SENTINEL_PW)
            env["SANDBOX_BROKER_REDIS_PASSWORD_FILE"] = redisfix.write_secret(d, "d2", "wrong-data-pw")
            rc, out, err = sbtest.run_broker_once(["--check-config"], sbtest.base_env(env))
            self.assertEqual(rc, 4, out)
            self.assertIn("127.0.0.1:%d: AUTH refused: WRONGPASS" % p.port, err)
            env["SANDBOX_BROKER_TOKEN_STORE"] = "redis-sentinel://%s/othermaster" % s.addr
            env["SANDBOX_BROKER_REDIS_PASSWORD_FILE"] = redisfix.write_secret(d, "d3", DATA_PW)
            rc, out, err = sbtest.run_broker_once(["--check-config"], sbtest.base_env(env))
            self.assertEqual(rc, 1, out)  # the configuration's mistake
            self.assertIn('%s (sentinel): does not know master "othermaster"' % s.addr, err)
        finally:
            s.cleanup()
            p.cleanup()
            import shutil
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)

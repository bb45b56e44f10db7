#!/usr/bin/python3
"""The production shape under operations (issue 6 "Tests and benchmark"): real nginx running
deploy/nginx/sandbox-broker.conf in front of two broker instances sharing one real Redis, all on
loopback, while a keep-alive load generator runs through nginx.

* SIGTERM on instance A under load: every request gets a complete, correct answer (nginx passes
  what A refused before reading it to B); nothing is lost (a 502) or torn; A exits 0. The same
  requirement on one instance, made deterministic: a connection opened while it drains is refused.
* SIGHUP on both instances under load with a configuration change: no call fails, both apply it.
* Per-run call quota through nginx: exactly N calls pass in total, whichever instance serves them.
* Redis stopped and started again on the same port under load: fail closed (503 unavailable, never
  a grant and never a revoked token honoured), then recovery without a restart of the brokers.

Each test builds its own topology (about a second) and runs for a few seconds.
"""

import http.server
import json
import os
import re
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prodfix  # noqa: E402
import sbtest  # noqa: E402

CAPS = {"services": ["billing"], "data": {"globals": {"site": ["read"]}}}
# a load test is not a quota test: lift the run's limits well above what it sends
LOAD_QUOTAS = {"calls": 1000000, "concurrent": 1024}
THREADS = 16
MSG_501 = "services dispatch is not implemented"
MSG_QUOTA = "run quota exceeded: calls per run"


def site_config(value):
    return {"targets": {"app": {"globals": {"site": {"value": {"v": value}}}}}}


@unittest.skipUnless(os.path.exists(prodfix.NGINX), "nginx is not installed")
class Production(sbtest.BrokerTestCase):
    def setUp(self):
        self.cleanups = []

    def tearDown(self):
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception:
                pass

    # --- topology ---

    def topology(self, redis=None, config=None, prefix="sbprod:", threads=2):
        """Redis (given or fresh), brokers A and B on it, nginx in front of both."""
        if redis is None:
            redis = sbtest.RedisServer().start()
            self.cleanups.append(redis.stop)
        env = {"SANDBOX_BROKER_TOKEN_STORE": redis.url, "SANDBOX_BROKER_REDIS_PREFIX": prefix,
               "SANDBOX_BROKER_THREADS": str(threads), "SANDBOX_BROKER_LOG_CALLS": "false"}
        a = sbtest.Broker(env=env, config=config).start()
        self.cleanups.append(a.kill)
        b = sbtest.Broker(env=env, config=config).start()
        self.cleanups.append(b.kill)
        for br in (a, b):
            self.assertTrue(br.wait_store_up(threads), br.log())
        nginx = prodfix.Nginx([a.port, b.port])
        self.cleanups.append(nginx.stop)
        return redis, a, b, nginx

    def through(self, nginx, token, method, args=None):
        return sbtest.http_request(nginx.port, "POST", sbtest.RPC_PATH,
                                   json.dumps({"method": method, "args": args or {}}).encode(),
                                   {"Content-Type": "application/json", sbtest.TOKEN_HEADER: token})

    def load(self, nginx, calls, threads=THREADS):
        ld = prodfix.Load(nginx.port, calls, threads=threads)
        self.cleanups.append(lambda: ld.stop(5))
        return ld.start()

    def assert_exact_501s(self, exchanges, nginx, what):
        bad = [e for e in exchanges
               if e.error is not None or e.status != 501 or e.code != "not_implemented" or e.message != MSG_501
               or e.ctype != "application/json"]
        self.assertEqual(bad[:3], [], "%s: %d of %d answers were not the exact 501 (%r)\nnginx error log (connection "
                         "refusals it retried left out):\n%s"
                         % (what, len(bad), len(exchanges), prodfix.summary(bad), nginx.upstream_failures()[-3000:]))

    # --- SIGTERM ---

    def test_sigterm_on_one_instance_under_load_loses_no_call(self):
        redis, a, b, nginx = self.topology()
        token = a.mint_ok("prod-term", CAPS, quotas=LOAD_QUOTAS)
        self.assertEqual(self.through(nginx, token, "services.billing.charge").status, 501)
        ld = self.load(nginx, [("call", token, "services.billing.charge", None)])
        time.sleep(1.5)
        t_term = ld.now()
        a.proc.send_signal(signal.SIGTERM)
        try:
            rc = a.proc.wait(timeout=15)
        except Exception:
            raise AssertionError("A did not exit within 15 s of SIGTERM:\n" + a.log()[-3000:])
        t_exit = ld.now()
        time.sleep(max(0.0, 3.0 - ld.now()) + 0.3)  # about 3 s of load in all, some of it on B alone
        self.assertTrue(ld.stop(), "a client is still waiting for an answer")
        self.assertEqual(a.stop(), 0, a.log()[-3000:])
        self.assertEqual(rc, 0, a.log()[-3000:])
        names = [e.get("event") for e in a.events()]
        self.assertIn("shutdown", names)
        self.assertNotIn("drain.timeout", names)
        self.assertEqual(names[-1], "stopped", names[-5:])

        ex = ld.all()
        self.assert_exact_501s(ex, nginx, "SIGTERM on A")
        before = [e for e in ex if e.received < t_term]
        during = [e for e in ex if e.sent < t_exit and e.received >= t_term]
        after = [e for e in ex if e.sent >= t_exit]
        self.assertGreater(len(before), 200, "the load barely ran before SIGTERM")
        self.assertGreater(len(after), 100, "B answered little once A was gone")
        sys.stderr.write("\n  SIGTERM: %d answers (%d before SIGTERM, %d while A drained, %d after A exited), "
                         "%d client connections; A exited %.0f ms after SIGTERM\n"
                         % (len(ex), len(before), len(during), len(after), ld.connections, (t_exit - t_term) * 1000))
        # B keeps serving on its own
        self.assertEqual(self.through(nginx, token, "services.billing.charge").status, 501)

    def test_connection_opened_while_draining_is_refused_not_left_unanswered(self):
        """What the SIGTERM test above needs from one instance, made deterministic: while A drains (a
        one-second http.fetch keeps it busy), a new TCP connection to A must be refused, so that nginx
        (or any client) tries elsewhere before sending anything. A connection the kernel accepts on
        A's behalf but nobody serves takes the request and is reset when A exits: through nginx that
        is a 502 for a POST it may not replay."""
        class Slow(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                time.sleep(1.0)
                self.send_response(200)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"slow")

        up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
        up.daemon_threads = True
        threading.Thread(target=up.serve_forever, daemon=True).start()
        self.cleanups.append(up.shutdown)
        a = sbtest.Broker(config={"egress": {"allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False}}).start()
        self.cleanups.append(a.kill)
        token = a.mint_ok("prod-drain", {"services": ["billing"], "net": ["127.0.0.1"]})
        slow = {}
        t = threading.Thread(target=lambda: slow.update(r=a.rpc(token, "http.fetch", {
            "url": "http://127.0.0.1:%d/" % up.server_address[1]}, timeout=10)))
        t.start()
        time.sleep(0.2)
        a.proc.send_signal(signal.SIGTERM)
        self.assertIsNotNone(a.wait_for_event("shutdown"))
        time.sleep(0.1)  # every worker has taken the shutdown; the fetch keeps A draining for ~0.7 s more
        outcome = None
        t0 = time.monotonic()
        try:
            r = a.rpc(token, "services.billing.charge", timeout=5)
            outcome = "answered %d" % r.status
        except ConnectionRefusedError:
            outcome = "refused"
        except OSError as e:
            outcome = "%s after %.2f s" % (type(e).__name__, time.monotonic() - t0)
        t.join(10)
        self.assertEqual(a.stop(), 0, a.log()[-2000:])
        self.assertEqual(slow["r"].status, 200, slow)  # the call in flight was drained
        # a refused connect, or a complete answer; never a connection that swallows the request
        self.assertIn(outcome, ("refused", "answered 501"),
                      "a connection opened during the drain was accepted and left unanswered "
                      "(broker/http/server.c: close_listeners closes each worker's dup() of the listening "
                      "socket, but s->listen_fd stays open in LISTEN state until sb_server_dispose after the "
                      "drain, so the kernel keeps completing handshakes nobody accepts)")

    # --- SIGHUP ---

    def test_sighup_on_both_instances_under_load_fails_no_call(self):
        redis, a, b, nginx = self.topology(config=site_config("before"))
        token = a.mint_ok("prod-hup", CAPS, target="app", quotas=LOAD_QUOTAS)
        self.assertEqual(self.through(nginx, token, "globals.site.get").body, {"ok": True, "value": {"v": "before"}})
        ld = self.load(nginx, [("call", token, "services.billing.charge", None),
                               ("global", token, "globals.site.get", None)])
        time.sleep(1.0)
        for br in (a, b):
            path = os.path.join(br._tmpdir, "config.json")
            with open(path + ".new", "w") as f:
                json.dump(site_config("after"), f)
            os.replace(path + ".new", path)
        t_hup = ld.now()
        for br in (a, b):
            br.proc.send_signal(signal.SIGHUP)
        for br in (a, b):
            self.assertIsNotNone(br.wait_for_event("reload.applied", timeout=10), br.log()[-3000:])
            self.assertIsNone(br.wait_for_event("reload.rejected", timeout=0), br.log()[-3000:])
        t_applied = ld.now()
        time.sleep(1.5)
        self.assertTrue(ld.stop(), "a client is still waiting for an answer")
        ex = ld.all()
        calls = [e for e in ex if e.label == "call"]
        self.assert_exact_501s(calls, nginx, "SIGHUP")
        globs = [e for e in ex if e.label == "global"]
        bad = [e for e in globs if e.error is not None or e.status != 200 or e.value not in ({"v": "before"}, {"v": "after"})]
        self.assertEqual(bad[:10], [], "globals.site.get answers around the reload")
        stale = [e for e in globs if e.sent > t_applied + 0.2 and e.value != {"v": "after"}]
        self.assertEqual(stale[:10], [], "an instance still serves the old configuration after reload.applied")
        self.assertGreater(len([e for e in ex if e.received < t_hup]), 100)
        self.assertGreater(len([e for e in ex if e.sent > t_applied]), 100)
        for br in (a, b):
            self.assertTrue(br.alive())
            self.assertEqual(br.public("GET", "/readyz").status, 200)
        sys.stderr.write("\n  SIGHUP: %d answers, both instances applied the reload in %.0f ms\n"
                         % (len(ex), (t_applied - t_hup) * 1000))

    # --- quotas ---

    def quota_run(self, nginx, tokens, n, threads):
        """Calls from `threads` concurrent clients spread over `tokens` until well past n answers."""
        calls = [("q%d" % i, t, "services.billing.charge", None) for i, t in enumerate(tokens)]
        ld = prodfix.Load(nginx.port, calls, threads=threads)
        self.cleanups.append(lambda: ld.stop(5))
        ld.start()
        time.sleep(0.8)
        self.assertTrue(ld.stop(), "a client is still waiting for an answer")
        return ld.all()

    def test_call_quota_holds_across_instances(self):
        redis, a, b, nginx = self.topology(prefix="sbprodq:")
        n = 40
        # one token minted on A, another for the same run minted on B: the quota is per run
        t1 = a.mint_ok("prod-quota", CAPS, quotas={"calls": n, "concurrent": 64})
        t2 = b.mint_ok("prod-quota", CAPS, quotas={"calls": n, "concurrent": 64})
        ex = self.quota_run(nginx, [t1, t2], n, threads=8)
        self.assertGreaterEqual(len(ex), 3 * n, "too few calls were sent to exhaust the quota")
        passed = [e for e in ex if e.status != 429]
        limited = [e for e in ex if e.status == 429]
        self.assertEqual(len(passed), n, prodfix.summary(ex))
        self.assert_exact_501s(passed, nginx, "calls within the quota")
        self.assertEqual({(e.code, e.message) for e in limited}, {("rate_limited", MSG_QUOTA)})
        # the quota was spent on both instances, and each counted the refusals it answered
        hits = 0
        for br in (a, b):
            m = sbtest.http_request(br.admin_port, "GET", "/metrics").raw.decode()
            self.assertRegex(m, r'sb_calls_total\{kind="services",code="not_implemented",status="501"\} [1-9]')
            self.assertRegex(m, r'sb_calls_total\{kind="[a-z]+",code="rate_limited",status="429"\} [1-9]')
            found = re.search(r'^sb_quota_hits_total\{quota="calls per run"\} (\d+)$', m, re.M)
            self.assertIsNotNone(found, m)
            hits += int(found.group(1))
        self.assertEqual(hits, len(limited))

    def test_sequential_calls_alternate_instances_and_stop_at_the_quota(self):
        redis, a, b, nginx = self.topology(prefix="sbprodq2:")
        n = 15
        token = a.mint_ok("prod-quota-seq", CAPS, quotas={"calls": n})
        got = [self.through(nginx, token, "services.billing.charge") for _ in range(n + 10)]
        self.assertEqual([r.status for r in got], [501] * n + [429] * 10)
        for r in got[n:]:
            self.assertError(r, 429, "rate_limited", MSG_QUOTA)
        # a fresh token of the same run, minted on the other instance, finds the run's quota spent
        again = b.mint_ok("prod-quota-seq", CAPS, quotas={"calls": n})
        self.assertError(self.through(nginx, again, "services.billing.charge"), 429, "rate_limited", MSG_QUOTA)

    # --- Redis restart ---

    def test_redis_restart_under_load_fails_closed_then_recovers(self):
        redis = prodfix.DurableRedis()
        self.cleanups.append(redis.cleanup)
        redis.start()
        _, a, b, nginx = self.topology(redis=redis, prefix="sbprodr:")
        live = a.mint_ok("prod-redis-live", CAPS, quotas=LOAD_QUOTAS)
        revoked = b.mint_ok("prod-redis-revoked", CAPS, quotas=LOAD_QUOTAS)
        self.assertEqual(self.through(nginx, revoked, "services.billing.charge").status, 501)
        self.assertEqual(a.revoke_token(revoked).status, 204)
        ld = self.load(nginx, [("live", live, "services.billing.charge", None),
                               ("revoked", revoked, "services.billing.charge", None)], threads=6)
        time.sleep(1.0)
        t_stop = ld.now()
        redis.stop()
        t_down = ld.now()
        # both instances notice: readiness drops, the admin API refuses to mint or revoke
        for br in (a, b):
            self.assertTrue(sbtest.poll(lambda: br.public("GET", "/readyz").status == 503, 5), br.log()[-2000:])
            self.assertEqual(br.mint("prod-redis-outage", CAPS).status, 503)
            self.assertEqual(br.revoke_run("prod-redis-live").status, 503)
        time.sleep(1.0)
        t_up0 = ld.now()
        redis.start()
        # each worker reconnects by itself (backoff up to 3.2 s)
        for br in (a, b):
            ok = sbtest.poll(lambda: br.rpc(live, "services.billing.charge").status == 501, 10)
            self.assertTrue(ok, "no recovery after Redis came back:\n" + br.log()[-2000:])
        t_rec = ld.now()
        time.sleep(1.0)
        self.assertTrue(ld.stop(), "a client is still waiting for an answer")
        ex = ld.all()
        torn = [e for e in ex if e.error is not None or e.code is None]
        self.assertEqual(torn[:10], [], "answers that are not the broker's (nginx %s)" % nginx.errors()[-2000:])
        # a revoked token is never honoured, not even while the store is away or coming back
        rev = [e for e in ex if e.label == "revoked"]
        self.assertEqual([e for e in rev if (e.status, e.code) not in ((401, "unauthorized"), (503, "unavailable"))][:10],
                         [])
        # no grant without the store: while Redis is down every call answers 503 unavailable
        outage = [e for e in ex if e.sent >= t_down and e.received <= t_up0]
        self.assertGreater(len(outage), 20, "the load barely ran during the outage")
        self.assertEqual([e for e in outage if (e.status, e.code) != (503, "unavailable")][:10], [])
        # the live token answers 501 or 503 throughout, 501 again at the end
        lv = [e for e in ex if e.label == "live"]
        self.assertEqual([e for e in lv if (e.status, e.code) not in ((501, "not_implemented"), (503, "unavailable"))][:10],
                         [])
        tail = [e for e in lv if e.sent > t_rec + 0.2]
        self.assertGreater(len(tail), 20)
        self.assertEqual([e for e in tail if e.status != 501][:10], [], "calls fail after recovery")
        self.assertEqual(self.through(nginx, revoked, "services.billing.charge").status, 401)
        for br in (a, b):
            self.assertEqual(br.public("GET", "/readyz").status, 200)
            self.assertEqual(br.mint("prod-redis-after", CAPS).status, 201)
        n503 = len([e for e in ex if e.status == 503])
        sys.stderr.write("\n  Redis restart: %d answers, %d of them 503; outage %.0f ms (stop took %.0f ms); "
                         "both instances granting again %.0f ms after Redis was started\n"
                         % (len(ex), n503, (t_up0 - t_down) * 1000, (t_down - t_stop) * 1000, (t_rec - t_up0) * 1000))


if __name__ == "__main__":
    sbtest.main()

"""Per-run quotas: calls, concurrent calls and fetched bytes, answered rate_limited (429).

Quotas come from the configuration's defaults or from the mint (quotas: {calls, concurrent,
fetchBytes}); with the Redis store they hold across broker instances. Upstreams are loopback only.
"""

import http.server
import threading
import time
import unittest

import sbtest

CAPS = {"services": ["svc"], "net": ["127.0.0.1"]}
EGRESS = {"allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False}


class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/slow":
            time.sleep(1.0)
        body = b"x" * 100
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def start_upstream():
    srv = Upstream(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class Quotas(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.up = start_upstream()
        cls.url = "http://127.0.0.1:%d" % cls.up.server_address[1]

    @classmethod
    def tearDownClass(cls):
        cls.up.shutdown()

    def exhaust_calls(self, b, token, n):
        for i in range(n):
            r = b.rpc(token, "services.svc.fn", {})
            self.assertError(r, 501, "not_implemented", "services dispatch is not implemented")
        r = b.rpc(token, "services.svc.fn", {})
        self.assertError(r, 429, "rate_limited", "run quota exceeded: calls per run")

    def test_calls_per_run_memory_and_denied_calls_count(self):
        with sbtest.Broker() as b:
            token = b.mint_ok("q-calls", CAPS, quotas={"calls": 3})
            r = b.rpc(token, "services.other.fn", {})
            self.assertError(r, 403, "forbidden", 'service "other" is not granted')
            self.exhaust_calls(b, token, 2)
            # a second token of the same run shares the run's count
            token2 = b.mint_ok("q-calls", CAPS, quotas={"calls": 3})
            self.assertError(b.rpc(token2, "services.svc.fn", {}), 429, "rate_limited", "run quota exceeded: calls per run")
            # another run is unaffected
            other = b.mint_ok("q-other", CAPS, quotas={"calls": 3})
            self.assertError(b.rpc(other, "services.svc.fn", {}), 501, "not_implemented")

    def test_config_default_applies(self):
        with sbtest.Broker(env={"SANDBOX_BROKER_QUOTA_CALLS": "2"}) as b:
            token = b.mint_ok("q-default", CAPS)
            self.exhaust_calls(b, token, 2)
            self.assertError(b.rpc(token, "services.svc.fn", {}), 429, "rate_limited")
            m = b.admin("GET", "/metrics").raw.decode()
            self.assertIn('sb_quota_hits_total{quota="calls per run"} 2\n', m)
            self.assertIn('sb_quota_hits_total{quota="fetched bytes per run"} 0\n', m)

    def test_mint_validation(self):
        with sbtest.Broker() as b:
            for quotas, msg in (({"calls": 0}, "quotas.calls: expected an integer from 1 to 1000000"),
                                ({"concurrent": 2000}, "quotas.concurrent: expected an integer from 1 to 1024"),
                                ({"fetchBytes": "1"}, "quotas.fetchBytes: expected an integer from 1 to 1099511627776"),
                                ({"bogus": 1}, "quotas.bogus: unknown key"),
                                ([], "quotas: expected an object")):
                with self.subTest(quotas=quotas):
                    r = b.mint("q-bad", CAPS, quotas=quotas)
                    self.assertError(r, 400, "bad_args", msg)

    def test_concurrent_calls_per_run(self):
        with sbtest.Broker(config={"egress": EGRESS}) as b:
            token = b.mint_ok("q-conc", CAPS, quotas={"concurrent": 1})
            results = {}

            def slow():
                results["slow"] = b.rpc(token, "http.fetch", {"url": self.url + "/slow"}, timeout=10)

            t = threading.Thread(target=slow)
            t.start()
            time.sleep(0.3)
            r = b.rpc(token, "services.svc.fn", {})
            self.assertError(r, 429, "rate_limited", "run quota exceeded: concurrent calls per run")
            t.join()
            self.assertEqual(results["slow"].status, 200, results["slow"])
            # the slot came back with the answer
            self.assertError(b.rpc(token, "services.svc.fn", {}), 501, "not_implemented")

    def test_fetched_bytes_per_run(self):
        with sbtest.Broker(config={"egress": EGRESS}) as b:
            token = b.mint_ok("q-bytes", CAPS, quotas={"fetchBytes": 150})
            r = b.rpc(token, "http.fetch", {"url": self.url + "/a"})
            self.assertEqual(r.status, 200, r)
            r = b.rpc(token, "http.fetch", {"url": self.url + "/b"})
            self.assertEqual(r.status, 200, r)  # 100 < 150 before it: allowed, now 200 fetched
            r = b.rpc(token, "http.fetch", {"url": self.url + "/c"})
            self.assertError(r, 429, "rate_limited", "run quota exceeded: fetched bytes per run")

    def test_calls_across_instances_on_redis(self):
        redis = sbtest.RedisServer()
        redis.start()
        try:
            env = {"SANDBOX_BROKER_TOKEN_STORE": redis.url}
            with sbtest.Broker(env=env) as a, sbtest.Broker(env=env) as bb:
                a.wait_store_up(2)
                bb.wait_store_up(2)
                token = a.mint_ok("q-shared", CAPS, quotas={"calls": 4})
                for br in (a, bb, a, bb):
                    self.assertError(br.rpc(token, "services.svc.fn", {}), 501, "not_implemented")
                for br in (a, bb):
                    self.assertError(br.rpc(token, "services.svc.fn", {}), 429, "rate_limited",
                                     "run quota exceeded: calls per run")
                # the counters live and die with the run's tokens
                ttl = sbtest.redis_command(redis.port, "PTTL", "sb:q:calls:q-shared")
                self.assertGreater(ttl, 0)
        finally:
            redis.stop()


if __name__ == "__main__":
    sbtest.main()

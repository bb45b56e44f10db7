"""SIGHUP: the configuration is read again and applied without dropping calls in flight;
a bad file is rejected whole and the running configuration stays."""

import http.server
import json
import os
import signal
import threading
import time

import sbtest


class Slow(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay = 1.0

    def log_message(self, *a):
        pass

    def do_GET(self):
        time.sleep(self.delay)
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"slow")


def config(name, extra=None):
    c = {"targets": {"app": {"globals": {"site": {"value": {"name": name}}}}},
         "egress": {"allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False}}
    c.update(extra or {})
    return c


CAPS = {"data": {"globals": {"site": ["read"]}}, "net": ["127.0.0.1"], "services": ["svc"]}


class Slow2(Slow):
    delay = 2.0


class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


class Reload(sbtest.BrokerTestCase):
    def setUp(self):
        self.up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
        self.up.daemon_threads = True
        threading.Thread(target=self.up.serve_forever, daemon=True).start()

    def tearDown(self):
        self.up.shutdown()

    def rewrite(self, b, cfg):
        path = os.path.join(b._tmpdir, "config.json")
        with open(path + ".new", "w") as f:
            json.dump(cfg, f)
        os.replace(path + ".new", path)

    def hup_and_wait(self, b, event):
        before = b.log().count('"event":"%s"' % event)
        b.proc.send_signal(signal.SIGHUP)
        self.assertTrue(sbtest.poll(lambda: b.log().count('"event":"%s"' % event) > before, 10), b.log())

    def test_reload_applies_targets_and_keeps_calls_in_flight(self):
        with sbtest.Broker(config=config("before")) as b:
            token = b.mint_ok("reload-run", CAPS, target="app")
            r = b.rpc(token, "globals.site.get")
            self.assertEqual((r.status, r.body), (200, {"ok": True, "value": {"name": "before"}}))
            # a fetch that takes a second is in flight while the reload happens
            result = {}
            t = threading.Thread(target=lambda: result.update(
                r=b.rpc(token, "http.fetch", {"url": "http://127.0.0.1:%d/" % self.up.server_address[1]}, timeout=10)))
            t.start()
            time.sleep(0.3)
            self.rewrite(b, config("after"))
            self.hup_and_wait(b, "reload.applied")
            t.join()
            self.assertEqual(result["r"].status, 200, result["r"])
            self.assertEqual(result["r"].body["value"]["bodyBase64"], "c2xvdw==")
            r = b.rpc(token, "globals.site.get")
            self.assertEqual(r.body, {"ok": True, "value": {"name": "after"}})
            # the token minted before the reload still works: tokens are not configuration
            self.assertError(b.rpc(token, "services.svc.fn", {}), 501, "not_implemented")
            self.assertEqual(b.stop(), 0)

    def test_many_reloads_while_fetches_are_in_flight(self):
        # a retired egress context lives as long as its last exchange: 30 reloads, 100 ms apart, while
        # 48 fetches (2 s each) are always in flight, lose no answer and leave nothing behind
        up = Upstream(("127.0.0.1", 0), Slow2)
        threading.Thread(target=up.serve_forever, daemon=True).start()
        url = "http://127.0.0.1:%d/" % up.server_address[1]
        try:
            with sbtest.Broker(config=config("r0")) as b:
                # four runs, so the 48 fetches stay within each run's concurrency quota (16)
                tokens = [b.mint_ok("reload-stress-%d" % i, CAPS, target="app") for i in range(4)]
                done = threading.Event()
                lock = threading.Lock()
                answers, bad = [], []

                def fetcher(i):
                    # staggered, so fetches start on every context the reloads install, not in bursts
                    time.sleep(i * 2.0 / 48)
                    while True:
                        try:
                            r = b.rpc(tokens[i % 4], "http.fetch", {"url": url}, timeout=30)
                        except Exception as e:  # the broker went away: the call lost its answer
                            r = e
                        with lock:
                            answers.append(r)
                            if isinstance(r, Exception) or r.status != 200 or r.body["value"]["bodyBase64"] != "c2xvdw==":
                                bad.append(r)
                        if done.is_set() or isinstance(r, Exception):
                            return

                threads = [threading.Thread(target=fetcher, args=(i,)) for i in range(48)]
                for t in threads:
                    t.start()
                try:
                    time.sleep(0.5)
                    for n in range(30):
                        self.rewrite(b, config("r%d" % (n + 1)))
                        b.proc.send_signal(signal.SIGHUP)
                        time.sleep(0.1)
                    # the last file is applied (signals sent while a reload runs merge into one reload)
                    self.assertTrue(sbtest.poll(lambda: b.alive() and b.rpc(tokens[0], "globals.site.get").body
                                                == {"ok": True, "value": {"name": "r30"}}, 10), b.log())
                finally:
                    done.set()
                    for t in threads:
                        t.join(60)
                self.assertFalse(any(t.is_alive() for t in threads))
                self.assertEqual(bad, [])
                self.assertGreaterEqual(len(answers), 48)
                self.assertEqual(b.stop(), 0, b.log())
                self.assertNotIn("Sanitizer", b.log())
                self.assertNotIn("runtime error", b.log())
        finally:
            up.shutdown()

    def test_many_reloads_while_database_calls_are_in_flight(self):
        # the same for database pools: each reload gives every worker a new pool, and the one it
        # replaces lives until its last queued or running statement has answered
        import pgfix
        pg = pgfix.PgServer().start()
        try:
            pg.sql("CREATE TABLE reload_settings (name text PRIMARY KEY, title text);"
                   "INSERT INTO reload_settings VALUES ('site', 'from the database');")

            def dbconfig(n):
                return {"database_url": pg.url, "database_pool_size": 2,
                        "targets": {"app": {"globals": {
                            "site": {"table": "reload_settings", "key": "name", "row": "site", "column": "title"},
                            "n": {"value": n}}}}}

            with sbtest.Broker(config=dbconfig(0)) as b:
                token = b.mint_ok("reload-db", {"data": {"globals": {"site": ["read"], "n": ["read"]}}}, target="app",
                                  quotas={"calls": 1000000})
                self.assertTrue(sbtest.poll(lambda: b.rpc(token, "globals.site.get").status == 200, 10), b.log())
                done = threading.Event()
                lock = threading.Lock()
                ok, gap, bad = [0], [0], []

                def caller():
                    while not done.is_set():
                        try:
                            r = b.rpc(token, "globals.site.get", timeout=30)
                        except Exception as e:
                            with lock:
                                bad.append(e)
                            return
                        with lock:
                            if r.status == 200 and r.body == {"ok": True, "value": "from the database"}:
                                ok[0] += 1
                            elif r.status == 503 and r.body["error"]["message"] == "the database is unavailable":
                                gap[0] += 1  # a new pool that has not learnt the schema yet fails closed
                            else:
                                bad.append(r)
                        time.sleep(0.002)

                threads = [threading.Thread(target=caller) for _ in range(12)]
                for t in threads:
                    t.start()
                try:
                    for n in range(30):
                        self.rewrite(b, dbconfig(n + 1))
                        b.proc.send_signal(signal.SIGHUP)
                        time.sleep(0.1)
                    self.assertTrue(sbtest.poll(lambda: b.alive() and b.rpc(token, "globals.n.get").body
                                                == {"ok": True, "value": 30}, 10), b.log())
                finally:
                    done.set()
                    for t in threads:
                        t.join(60)
                self.assertEqual(bad, [])
                self.assertGreater(ok[0], 0)
                self.assertTrue(sbtest.poll(lambda: b.rpc(token, "globals.site.get").status == 200, 10), b.log())
                self.assertEqual(b.stop(), 0, b.log())
                self.assertNotIn("Sanitizer", b.log())
                self.assertNotIn("runtime error", b.log())
        finally:
            pg.close()

    def test_bad_file_is_rejected_and_the_old_configuration_stays(self):
        with sbtest.Broker(config=config("kept")) as b:
            token = b.mint_ok("reload-bad", CAPS, target="app")
            for bad in ({"targets": {"app": {"globals": {"site": {"valu": 1}}}}},
                        {"egress": {"allow_cidrs": ["10.0.0.1/8"]}},
                        {"nonsense_key": True}):
                with self.subTest(bad=bad):
                    self.rewrite(b, bad)
                    self.hup_and_wait(b, "reload.rejected")
                    r = b.rpc(token, "globals.site.get")
                    self.assertEqual(r.body, {"ok": True, "value": {"name": "kept"}})
            with open(os.path.join(b._tmpdir, "config.json"), "w") as f:
                f.write("{not json")
            self.hup_and_wait(b, "reload.rejected")
            self.assertIn("the running configuration stays", b.log())
            self.assertEqual(b.stop(), 0)

    def test_settings_bound_at_start_are_kept_and_logged(self):
        with sbtest.Broker(config=config("x")) as b:
            port = b.port
            self.rewrite(b, config("x", {"threads": 7, "listen": "127.0.0.1:1"}))
            self.hup_and_wait(b, "reload.applied")
            self.assertIn('"event":"reload.restart_needed"', b.log())
            self.assertEqual(sbtest.http_request(port, "GET", "/healthz").status, 200)

    def test_admin_secret_rotation_without_a_gap(self):
        import tempfile
        d = tempfile.mkdtemp(prefix="sb-secret-")
        secret_file = os.path.join(d, "secret")
        old, new = "first-admin-secret-0123456789", "rotated-admin-secret-0123456789"
        with open(secret_file, "w") as f:
            f.write(old + "\n")
        cfg = config("s", {"admin_secret_file": secret_file})
        b = sbtest.Broker(config=cfg, secret=None).start()
        try:
            self.assertEqual(b.admin("GET", "/admin/v1/nothing", secret=old).status, 404)
            self.assertEqual(b.admin("GET", "/admin/v1/nothing", secret=new).status, 401)
            # the host writes the new secret and sends SIGHUP
            with open(secret_file, "w") as f:
                f.write(new + "\n")
            self.rewrite(b, cfg)
            self.hup_and_wait(b, "reload.applied")
            # both work while the host switches over (the old one for five minutes)
            self.assertEqual(b.admin("GET", "/admin/v1/nothing", secret=new).status, 404)
            self.assertEqual(b.admin("GET", "/admin/v1/nothing", secret=old).status, 404)
            self.assertEqual(b.admin("GET", "/admin/v1/nothing", secret="some-other-secret-0123456").status, 401)
            self.assertEqual(b.stop(), 0)
        finally:
            b.kill()


if __name__ == "__main__":
    sbtest.main()

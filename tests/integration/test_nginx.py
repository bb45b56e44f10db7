"""The production shape: real nginx in front of two broker instances sharing one real Redis.

nginx runs with deploy/nginx/sandbox-broker.conf, rewritten only for its ports,
so what is tested is the file operators deploy. Everything listens on 127.0.0.1.
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import sbtest

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
NGINX_DIR = os.path.join(sbtest.SOURCE_DIR, "deploy", "nginx")
CONF = os.path.join(NGINX_DIR, "sandbox-broker.conf")
SHIM = os.path.join(sbtest.BIN_DIR, "sandbox-shim")
FAKE_GUEST = os.path.join(sbtest.SOURCE_DIR, "tests", "shim", "fake_guest.py")
MSG_NO_INSTANCE = "no sandbox broker instance answered"


class Nginx:
    def __init__(self, upstream_ports):
        self.port = sbtest.free_port()
        self.dir = tempfile.mkdtemp(prefix="sb-nginx-")
        # started as root, nginx's workers run as nobody: they must be able to spool large bodies here
        os.chmod(self.dir, 0o755)
        for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
            os.mkdir(os.path.join(self.dir, sub))
            os.chmod(os.path.join(self.dir, sub), 0o777)
        site = open(CONF).read()
        servers = "".join("    server 127.0.0.1:%d max_fails=0;\n" % p for p in upstream_ports)
        site = re.sub(r"(    server 127\.0\.0\.1:\d+ max_fails=0;\n)+", servers, site, count=1)
        site = site.replace("listen 127.0.0.1:8443;", "listen 127.0.0.1:%d;" % self.port)
        # the answers nginx gives when no instance answers: installed next to the configuration
        for name in ("unavailable.json", "unavailable.msgpack"):
            shutil.copy(os.path.join(NGINX_DIR, name), os.path.join(self.dir, name))
            os.chmod(os.path.join(self.dir, name), 0o644)
        self.has_answer_root = "root /etc/nginx/sandbox-broker;" in site
        site = site.replace("root /etc/nginx/sandbox-broker;", "root %s;" % self.dir)
        with open(os.path.join(self.dir, "nginx.conf"), "w") as f:
            f.write("daemon off;\nworker_processes 1;\npid %s/nginx.pid;\nerror_log %s/error.log warn;\n"
                    "events { worker_connections 256; }\n"
                    "http {\n  access_log %s/access.log;\n  client_body_temp_path %s/body;\n"
                    "  proxy_temp_path %s/proxy;\n  fastcgi_temp_path %s/fcgi;\n  uwsgi_temp_path %s/uwsgi;\n"
                    "  scgi_temp_path %s/scgi;\n%s\n}\n" % ((self.dir,) * 8 + (site,)))
        self.proc = subprocess.Popen([NGINX, "-p", self.dir, "-c", os.path.join(self.dir, "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                sbtest.http_request(self.port, "GET", "/healthz", timeout=1)
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nginx did not start: %s" % open(os.path.join(self.dir, "error.log")).read()[-2000:])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@unittest.skipUnless(os.path.exists(NGINX), "nginx is not installed")
class ThroughNginx(sbtest.BrokerTestCase):
    @classmethod
    def setUpClass(cls):
        cls.redis = sbtest.RedisServer()
        cls.redis.start()
        env = {"SANDBOX_BROKER_TOKEN_STORE": cls.redis.url, "SANDBOX_BROKER_REDIS_PREFIX": "sbnginx:"}
        cls.a = sbtest.Broker(env=env).start()
        cls.b = sbtest.Broker(env=env).start()
        for br in (cls.a, cls.b):
            br.wait_store_up(2)
        cls.nginx = Nginx([cls.a.port, cls.b.port])

    @classmethod
    def tearDownClass(cls):
        cls.nginx.stop()
        for br in (cls.a, cls.b):
            br.stop()
        cls.redis.stop()

    def rpc(self, token, method, args=None, headers=None):
        hdrs = {"Content-Type": "application/json", sbtest.TOKEN_HEADER: token}
        hdrs.update(headers or {})
        return sbtest.http_request(self.nginx.port, "POST", sbtest.RPC_PATH,
                                   sbtest.encode({"method": method, "args": args or {}}, "json"), hdrs)

    def served_by(self, broker, before):
        return broker.log().count('"event":"rpc"') - before

    def test_calls_reach_both_instances_and_revocation_holds_everywhere(self):
        token = self.a.mint_ok("nginx-run", {"services": ["billing"]})
        a0, b0 = self.a.log().count('"event":"rpc"'), self.b.log().count('"event":"rpc"')
        for _ in range(20):
            r = self.rpc(token, "services.billing.charge")
            self.assertError(r, 501, "not_implemented", "services dispatch is not implemented")
        # nginx spreads keep-alive requests over the pool: both instances answered (their log lines are
        # read from stderr by a background thread, so wait for them rather than count at once)
        self.assertTrue(sbtest.poll(lambda: self.served_by(self.a, a0) > 0 and self.served_by(self.b, b0) > 0, 5))
        # revoked through instance A's admin endpoint: refused on every instance, at once
        self.assertEqual(self.a.revoke_run("nginx-run").status, 204)
        a1, b1 = self.a.log().count('"event":"rpc"'), self.b.log().count('"event":"rpc"')
        for _ in range(20):
            r = self.rpc(token, "services.billing.charge")
            self.assertError(r, 401, "unauthorized", sbtest.MSG_UNAUTHORIZED)
        self.assertTrue(sbtest.poll(lambda: self.served_by(self.a, a1) > 0 and self.served_by(self.b, b1) > 0, 5))

    def test_admin_paths_and_metrics_are_not_exposed(self):
        for method, path in (("POST", "/admin/v1/tokens"), ("DELETE", "/admin/v1/runs/x"), ("GET", "/metrics"),
                             ("GET", "/_sb_unavailable"), ("GET", "/unavailable.json"),
                             ("GET", "/api/sandbox/rpc/../../admin/v1/tokens")):
            with self.subTest(path=path):
                r = sbtest.http_request(self.nginx.port, method, path, b"{}" if method == "POST" else None,
                                        {"Authorization": "Bearer " + sbtest.ADMIN_SECRET})
                self.assertEqual(r.status, 404, r)

    def test_readyz_is_the_load_balancer_check(self):
        for path in ("/readyz", "/healthz"):
            with self.subTest(path=path):
                r = sbtest.http_request(self.nginx.port, "GET", path)
                self.assertEqual(r.status, 200, r)
                self.assertIs(r.body["ok"], True, r)
        self.assertEqual(sbtest.http_request(self.nginx.port, "POST", "/readyz", b"{}").status, 403)

    def test_only_post_reaches_the_route(self):
        r = sbtest.http_request(self.nginx.port, "GET", sbtest.RPC_PATH)
        self.assertEqual(r.status, 403, r)

    def test_request_id_is_forwarded_and_echoed(self):
        token = self.a.mint_ok("nginx-rid", {"services": ["billing"]})
        r = self.rpc(token, "services.billing.charge", headers={"X-Request-Id": "rid-123"})
        self.assertEqual(r.headers.get("x-request-id"), "rid-123", r.headers)
        r = self.rpc(token, "services.billing.charge")
        self.assertRegex(r.headers.get("x-request-id", ""), r"^[0-9a-f]{32}$")

    def test_request_id_joins_the_nginx_and_broker_lines(self):
        import http.client
        token = self.a.mint_ok("nginx-rid-join", {"services": ["billing"]})
        body = sbtest.encode({"method": "services.billing.charge", "args": {}}, "json")
        # a safe id from the client, an unsafe one (nginx replaces it with its own), and none
        for sent in ("join-1:a.b_c", 'bad id"', None):
            with self.subTest(sent=sent):
                a0, b0 = len(self.a.events()), len(self.b.events())
                conn = http.client.HTTPConnection("127.0.0.1", self.nginx.port, timeout=10)
                hdrs = {"Content-Type": "application/json", sbtest.TOKEN_HEADER: token}
                if sent is not None:
                    hdrs["X-Request-Id"] = sent
                conn.request("POST", sbtest.RPC_PATH, body=body, headers=hdrs)
                r = conn.getresponse()
                r.read()
                ids = [v for k, v in r.getheaders() if k.lower() == "x-request-id"]
                conn.close()
                self.assertEqual(r.status, 501)
                # exactly once: nginx's add_header, the broker's echo hidden
                self.assertEqual(len(ids), 1, r.getheaders())
                if sent == "join-1:a.b_c":
                    self.assertEqual(ids[0], sent)
                else:
                    self.assertRegex(ids[0], r"^[0-9a-f]{32}$")
                lines = sbtest.poll(lambda: [e for e in self.a.events()[a0:] + self.b.events()[b0:]
                                             if e.get("event") == "rpc"], 5)
                self.assertEqual(len(lines), 1, lines)
                self.assertEqual(lines[0]["requestId"], ids[0])
                self.assertRegex(lines[0]["cid"], r"^[0-9a-f-]{36}$")

    def test_body_cap_matches_the_protocol(self):
        token = self.a.mint_ok("nginx-cap", {"services": ["billing"]})
        # 7,121,580 bytes pass nginx and reach the broker's per-method cap (65,536 for services: 413 bad_args)
        prefix = b'{"method":"services.billing.charge","args":{"p":"'
        body = prefix + b"x" * (7121580 - len(prefix) - 3) + b'"}}'
        self.assertEqual(len(body), 7121580)
        r = sbtest.http_request(self.nginx.port, "POST", sbtest.RPC_PATH, body,
                                {"Content-Type": "application/json", sbtest.TOKEN_HEADER: token}, timeout=30)
        self.assertError(r, 413, "bad_args", sbtest.MSG_TOO_LARGE)
        # one byte more is nginx's own 413
        r = sbtest.http_request(self.nginx.port, "POST", sbtest.RPC_PATH, body + b" ",
                                {"Content-Type": "application/json", sbtest.TOKEN_HEADER: token}, timeout=30)
        self.assertEqual(r.status, 413, r)


@unittest.skipUnless(os.path.exists(NGINX), "nginx is not installed")
class NoLiveUpstream(sbtest.BrokerTestCase):
    """Every instance down: nginx answers the RPC error shape, 503 unavailable, in the request's
    encoding, rather than its HTML 502 page (which a client decoding msgpack cannot read)."""

    @classmethod
    def setUpClass(cls):
        cls.nginx = Nginx([sbtest.closed_port(), sbtest.closed_port()])

    @classmethod
    def tearDownClass(cls):
        cls.nginx.stop()

    def test_the_configuration_names_the_installed_answers(self):
        self.assertTrue(self.nginx.has_answer_root)

    def test_rpc_answers_unavailable_in_the_request_encoding(self):
        for ctype, enc in (("application/json", "json"), ("application/msgpack", "msgpack"),
                           ("application/msgpack; charset=binary", "msgpack"), ("Application/MsgPack", "msgpack"),
                           ("text/plain", "json"), (None, "json"), ("application/msgpackx", "json")):
            with self.subTest(content_type=ctype):
                hdrs = {sbtest.TOKEN_HEADER: "0" * 64, "X-Request-Id": "rid-down"}
                if ctype is not None:
                    hdrs["Content-Type"] = ctype
                r = sbtest.http_request(self.nginx.port, "POST", sbtest.RPC_PATH,
                                        sbtest.encode({"method": "services.a.b"}, enc), hdrs)
                self.assertError(r, 503, "unavailable", MSG_NO_INSTANCE, enc=enc)
                self.assertEqual(r.headers.get("x-request-id"), "rid-down")
                self.assertEqual(r.headers.get("cache-control"), "no-store")
                with open(os.path.join(NGINX_DIR, "unavailable." + enc), "rb") as f:
                    self.assertEqual(r.raw, f.read())

    def test_both_answers_say_the_same(self):
        with open(os.path.join(NGINX_DIR, "unavailable.json"), "rb") as f:
            j = sbtest.decode_body("application/json", f.read())
        with open(os.path.join(NGINX_DIR, "unavailable.msgpack"), "rb") as f:
            m = sbtest.decode_body("application/msgpack", f.read())
        self.assertEqual(j, m)
        self.assertEqual(j, {"ok": False, "error": {"code": "unavailable", "message": MSG_NO_INSTANCE}})

    def test_readyz_and_healthz_answer_503(self):
        for path in ("/readyz", "/healthz"):
            with self.subTest(path=path):
                r = sbtest.http_request(self.nginx.port, "GET", path)
                self.assertError(r, 503, "unavailable", MSG_NO_INSTANCE, enc="json")

    @unittest.skipUnless(os.path.exists(SHIM), "sandbox-shim is not built")
    def test_the_shim_reports_unavailable_not_a_protocol_error(self):
        """The real shim, relaying a guest's call through nginx with no live instance."""
        with tempfile.NamedTemporaryFile("w", suffix=".json") as scen:
            json.dump({"calls": [[1, "services.echo.x"]]}, scen)
            scen.flush()
            os.chmod(scen.name, 0o644)  # the jailed guest runs as a uid of its own
            env = dict(os.environ, SB_TEST_TOKEN="ab" * 32)
            p = subprocess.run([SHIM, "relay", "--broker-url", "http://127.0.0.1:%d%s" % (self.nginx.port, sbtest.RPC_PATH),
                                "--token-env", "SB_TEST_TOKEN", "--on-denial", "reply", "--", "/usr/bin/python3",
                                FAKE_GUEST, scen.name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        outcome = json.loads(p.stdout)
        reply = outcome["output"]["replies"]["1"]
        self.assertEqual(reply["error"], {"code": "unavailable", "message": MSG_NO_INSTANCE}, outcome)


if __name__ == "__main__":
    sbtest.main()

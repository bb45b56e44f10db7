#!/usr/bin/python3
"""The redis token store (issue 2): two broker instances on one real Redis share
tokens and revocations at once; Redis going away makes every RPC answer
`unavailable` (503) while the broker stays up, and it recovers by itself."""

import hashlib
import os
import signal
import sys
import time
import uuid
from urllib.parse import urlparse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from sbtest import MSG_UNAUTHORIZED, poll  # noqa: E402

ENCODINGS = ("json", "msgpack")
CAPS = {"services": ["mailer"]}
GRANTED_MSG = "services dispatch is not implemented"
UNAVAILABLE_MSG = "sandbox token store is unavailable"
ADMIN_UNAVAILABLE_MSG = "the token store is unavailable"


def shared_redis_port():
    """The port of SB_TEST_REDIS_URL when it names a loopback Redis, else None."""
    url = os.environ.get("SB_TEST_REDIS_URL")
    if not url:
        return None
    u = urlparse(url)
    if u.scheme != "redis" or u.hostname not in ("127.0.0.1", "localhost") or u.password or u.path not in ("", "/"):
        return None
    port = u.port or 6379
    return port if sbtest.redis_ping(port) else None


class RedisBase(sbtest.BrokerTestCase):
    def works(self, broker, tok, enc="json"):
        r = broker.rpc(tok, "services.mailer.send", {}, enc=enc)
        self.assertError(r, 501, "not_implemented", GRANTED_MSG, enc=enc)

    def refused(self, broker, tok, enc="json"):
        r = broker.rpc(tok, "services.mailer.send", {}, enc=enc)
        self.assertError(r, 401, "unauthorized", MSG_UNAUTHORIZED, enc=enc)

    def start_broker(self, url, prefix, threads=2, **env):
        e = {"SANDBOX_BROKER_TOKEN_STORE": url, "SANDBOX_BROKER_REDIS_PREFIX": prefix,
             "SANDBOX_BROKER_THREADS": str(threads)}
        e.update(env)
        return sbtest.Broker(env=e).start()

    def stop_broker(self, b):
        rc = b.stop()
        self.assertEqual(rc, 0, b.log()[-4000:])
        log = b.log()
        self.assertIn('"event":"stopped"', log)


class SharedRedis(RedisBase):
    """Two instances, one Redis: tokens and revocations are shared, with no delay."""

    @classmethod
    def setUpClass(cls):
        port = shared_redis_port()
        cls.redis = None
        if port is None:
            cls.redis = sbtest.RedisServer().start()
            port = cls.redis.port
        cls.redis_port = port
        cls.prefix = "sbtest-%s:" % uuid.uuid4().hex[:12]
        url = "redis://127.0.0.1:%d" % port
        env = {"SANDBOX_BROKER_TOKEN_STORE": url, "SANDBOX_BROKER_REDIS_PREFIX": cls.prefix,
               "SANDBOX_BROKER_THREADS": "2"}
        cls.a = sbtest.Broker(env=env).start()
        cls.b = sbtest.Broker(env=env).start()
        # both instances, every worker, must be connected before the first call
        for br in (cls.a, cls.b):
            if not br.wait_store_up(2):
                raise AssertionError("broker never connected to Redis:\n" + br.log())

    @classmethod
    def tearDownClass(cls):
        errors = []
        for br in (cls.a, cls.b):
            rc = br.stop()
            if rc != 0:
                errors.append("broker exited with %s:\n%s" % (rc, br.log()[-4000:]))
        try:
            keys = sbtest.redis_command(cls.redis_port, "KEYS", cls.prefix + "*")
            if keys:
                sbtest.redis_command(cls.redis_port, "DEL", *keys)
        except OSError:
            pass
        if cls.redis is not None:
            cls.redis.stop()
        if errors:
            raise AssertionError("\n".join(errors))

    def test_ready_and_kind(self):
        for br in (self.a, self.b):
            r = br.public("GET", "/readyz")
            self.assertEqual(r.status, 200, r)
            self.assertEqual(r.body, {"ok": True, "tokenStore": "up"})
            self.assertEqual(br.wait_for_event("started").get("tokenStore"), "redis")

    def test_mint_on_a_call_on_b(self):
        tok = self.a.mint_ok("run-ab", CAPS)
        for enc in ENCODINGS:
            self.works(self.b, tok, enc)
            self.works(self.a, tok, enc)
        # the manifest travels with the token: a denial on B has A's manifest's reason
        r = self.b.rpc(tok, "services.other.x", {})
        self.assertError(r, 403, "forbidden", 'service "other" is not granted')

    def test_revoke_on_a_refused_on_b_at_once(self):
        for i in range(5):
            tok = self.a.mint_ok("run-rv-%d" % i, CAPS)
            self.works(self.b, tok)
            self.assertEqual(self.a.revoke_token(tok).status, 204)
            # no sleep: the very next call on the other instance is refused
            for enc in ENCODINGS:
                self.refused(self.b, tok, enc)
                self.refused(self.a, tok, enc)

    def test_revoke_run_on_b_refused_on_a(self):
        r1 = self.a.mint_ok("run-R", CAPS)
        r2 = self.a.mint_ok("run-R", {"services": ["mailer"], "jobs": ["j"]})
        r3 = self.b.mint_ok("run-R", CAPS)
        s1 = self.a.mint_ok("run-S", CAPS)
        for t in (r1, r2, r3, s1):
            self.works(self.a, t)
            self.works(self.b, t)
        self.assertEqual(self.b.revoke_run("run-R").status, 204)
        for t in (r1, r2, r3):
            for enc in ENCODINGS:
                self.refused(self.a, t, enc)
                self.refused(self.b, t, enc)
        self.works(self.a, s1)
        self.works(self.b, s1)
        self.assertEqual(self.a.revoke_run("run-R").status, 204)  # idempotent
        self.assertEqual(self.a.revoke_token(r1).status, 204)

    def test_expiry_is_shared(self):
        r = self.a.mint("run-exp", CAPS, ttlMs=1000)
        self.assertEqual(r.status, 201, r)
        tok, exp = r.body["token"], r.body["expiresAt"]
        self.works(self.b, tok)
        time.sleep(max(0.0, (exp + 200 - time.time() * 1000) / 1000.0))
        self.refused(self.a, tok)
        self.refused(self.b, tok)

    def test_stored_by_hash_with_expiry(self):
        tok = self.a.mint_ok("run-hash", CAPS, ttlMs=60000)
        h = hashlib.sha256(tok.encode()).hexdigest()
        keys = [k.decode() for k in sbtest.redis_command(self.redis_port, "KEYS", self.prefix + "*")]
        self.assertIn(self.prefix + "tok:" + h, keys)
        for k in keys:
            self.assertNotIn(tok, k)
        rec = sbtest.redis_command(self.redis_port, "GET", self.prefix + "tok:" + h)
        self.assertIsNotNone(rec)
        self.assertNotIn(tok.encode(), rec)
        pttl = sbtest.redis_command(self.redis_port, "PTTL", self.prefix + "tok:" + h)
        self.assertGreater(pttl, 55000)
        self.assertLessEqual(pttl, 60000)
        members = sbtest.redis_command(self.redis_port, "SMEMBERS", self.prefix + "run:run-hash")
        self.assertEqual([m.decode() for m in members], [h])
        # deleting the record behind the broker's back is a revocation too (no cache)
        self.works(self.b, tok)
        sbtest.redis_command(self.redis_port, "DEL", self.prefix + "tok:" + h)
        self.refused(self.a, tok)
        self.refused(self.b, tok)

    def test_unreadable_record_fails_closed(self):
        tok = self.a.mint_ok("run-garbage", CAPS)
        h = hashlib.sha256(tok.encode()).hexdigest()
        sbtest.redis_command(self.redis_port, "SET", self.prefix + "tok:" + h, "not json", "PX", "60000")
        for br in (self.a, self.b):
            r = br.rpc(tok, "services.mailer.send", {})
            self.assertError(r, 503, "unavailable", UNAVAILABLE_MSG)

    def test_tokens_not_logged(self):
        tok = self.a.mint_ok("run-log", CAPS)
        self.works(self.b, tok)
        self.assertEqual(self.b.revoke_token(tok).status, 204)
        self.refused(self.a, tok)
        for br in (self.a, self.b):
            self.assertNotIn(tok, br.log())


class RedisOutage(RedisBase):
    """Redis stopped mid-test and restarted on the same port. Never uses a shared Redis."""

    def setUp(self):
        self.redis = sbtest.RedisServer().start()
        self.br = self.start_broker(self.redis.url, "sbtest:")
        self.assertTrue(self.br.wait_store_up(2), self.br.log())

    def tearDown(self):
        try:
            self.br.kill()
        finally:
            self.redis.stop()

    def all_unavailable(self, n=8):
        for i in range(n):
            enc = ENCODINGS[i % 2]
            t0 = time.monotonic()
            r = self.br.rpc(self.tok, "services.mailer.send", {}, enc=enc)
            if time.monotonic() - t0 > 2.5:
                raise AssertionError("an RPC took %.1fs while Redis was down" % (time.monotonic() - t0))
            if r.status != 503:
                return False
            self.assertError(r, 503, "unavailable", UNAVAILABLE_MSG, enc=enc)
        return True

    def test_outage_and_recovery(self):
        self.tok = self.br.mint_ok("run-out", CAPS)
        self.works(self.br, self.tok)

        self.redis.stop()
        t0 = time.monotonic()
        self.assertTrue(poll(self.all_unavailable, 2.0, interval=0.02), self.br.log()[-3000:])
        self.assertLess(time.monotonic() - t0, 2.5)
        # readiness follows, on both listeners; liveness does not
        self.assertTrue(poll(lambda: self.br.admin("GET", "/readyz").status == 503, 2.0))
        r = self.br.admin("GET", "/readyz")
        self.assertEqual(r.body, {"ok": False, "tokenStore": "down"})
        self.assertTrue(poll(lambda: self.br.public("GET", "/readyz").status == 503, 2.0))
        self.assertEqual(self.br.public("GET", "/healthz").status, 200)
        self.assertEqual(self.br.admin("GET", "/healthz").status, 200)
        # every RPC kind is refused the same way, before any grammar or capability check
        for method in ("email.send", "foo", "collections.x.find"):
            for enc in ENCODINGS:
                r = self.br.rpc(self.tok, method, {}, enc=enc)
                self.assertError(r, 503, "unavailable", UNAVAILABLE_MSG, enc=enc)
        # but the cheap checks that need no store still answer as usual
        r = self.br.rpc(None, "services.mailer.send", {})
        self.assertError(r, 401, "unauthorized", MSG_UNAUTHORIZED)
        r = self.br.rpc(self.tok, body=b"[]")
        self.assertError(r, 400, "bad_args", "invalid request body")
        # admin writes fail closed too
        r = self.br.mint("run-while-down", CAPS)
        self.assertError(r, 503, "unavailable", ADMIN_UNAVAILABLE_MSG)
        r = self.br.revoke_token(self.tok)
        self.assertError(r, 503, "unavailable", ADMIN_UNAVAILABLE_MSG)
        r = self.br.revoke_run("run-out")
        self.assertError(r, 503, "unavailable", ADMIN_UNAVAILABLE_MSG)
        m = self.br.admin("GET", "/metrics").raw.decode()
        self.assertIn("sb_token_store_up 0", m)
        self.assertTrue(self.br.alive())

        # Redis returns on the same port (empty: it keeps nothing on disk)
        self.redis.start()
        t0 = time.monotonic()

        def recovered():
            r = self.br.mint("run-back", CAPS)
            if r.status != 201:
                self.assertError(r, 503, "unavailable", ADMIN_UNAVAILABLE_MSG)
                return None
            return r.body["token"]

        tok2 = poll(recovered, 10.0, interval=0.1)
        self.assertTrue(tok2, "no recovery within 10 s:\n" + self.br.log()[-3000:])

        def all_work():
            for i in range(8):
                r = self.br.rpc(tok2, "services.mailer.send", {}, enc=ENCODINGS[i % 2])
                if r.status != 501:
                    return False
            return True

        self.assertTrue(poll(all_work, 10.0, interval=0.1), self.br.log()[-3000:])
        self.assertLess(time.monotonic() - t0, 10.0)
        self.assertTrue(poll(lambda: self.br.admin("GET", "/readyz").status == 200, 5.0))
        # the old token died with Redis's memory: refused, not granted
        self.refused(self.br, self.tok)
        self.stop_broker(self.br)
        events = [e.get("event") for e in self.br.events()]
        self.assertIn("redis.down", events)
        self.assertIn("redis.up", events)

    def test_redis_hangs(self):
        """A Redis that accepts but never answers: calls time out into 503, none hang."""
        self.tok = self.br.mint_ok("run-hang", CAPS)
        self.works(self.br, self.tok)
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        try:
            for i in range(6):
                enc = ENCODINGS[i % 2]
                t0 = time.monotonic()
                r = self.br.rpc(self.tok, "services.mailer.send", {}, enc=enc)
                took = time.monotonic() - t0
                self.assertError(r, 503, "unavailable", UNAVAILABLE_MSG, enc=enc)
                self.assertLess(took, 2.5)
            self.assertTrue(self.br.alive())
        finally:
            os.kill(self.redis.proc.pid, signal.SIGCONT)
        self.assertTrue(poll(lambda: self.br.rpc(self.tok, "services.mailer.send", {}).status == 501 and
                             self.br.rpc(self.tok, "services.mailer.send", {}).status == 501, 10.0, interval=0.1),
                        self.br.log()[-3000:])
        self.stop_broker(self.br)


class RedisAbsentAtStart(RedisBase):
    def test_start_without_redis_then_recover(self):
        redis = sbtest.RedisServer()  # a free port with nothing on it yet
        br = self.start_broker(redis.url, "sbtest:")
        try:
            r = br.admin("GET", "/readyz")
            self.assertEqual(r.status, 503, r)
            self.assertEqual(br.admin("GET", "/healthz").status, 200)
            r = br.mint("run-x", CAPS)
            self.assertError(r, 503, "unavailable", ADMIN_UNAVAILABLE_MSG)
            for enc in ENCODINGS:
                r = br.rpc("ab" * 32, "services.mailer.send", {}, enc=enc)
                self.assertError(r, 503, "unavailable", UNAVAILABLE_MSG, enc=enc)
            redis.start()
            tok = poll(lambda: br.mint("run-x", CAPS).body.get("token"), 10.0, interval=0.1)
            self.assertTrue(tok, br.log()[-3000:])
            self.assertTrue(poll(lambda: all(br.rpc(tok, "services.mailer.send", {}).status == 501 for _ in range(6)),
                                 10.0, interval=0.1))
            self.stop_broker(br)
        finally:
            br.kill()
            redis.stop()


if __name__ == "__main__":
    sbtest.main()

#!/usr/bin/python3
"""http.fetch over kept-alive upstream connections (egress.keepalive_pool_size, on by default), and
what the per-worker resolver reuses (and does not).

One broker with one worker (so every call meets the same pool) and a pool of two parked
connections (two more brokers for the default and for 0); dnsmasq (fetchfix_dns, TTL 0) maps the test names to loopback addresses; the upstreams
(fetchfix_upstream) count every TCP connection they accept and tag each request with its
connection's number. What must hold (PROTOCOL.md section 6a):
  * a later fetch (or redirect hop) of the same run reuses the connection, after its own fresh
    resolution, which is validated as always;
  * never across runs;
  * never when the fresh answers no longer contain the connected address, or fail validation;
  * never after a response that did not end cleanly (Connection: close, HTTP/1.0, a body delimited
    by the close, bytes after the end), nor after the peer closed the idle connection, sent anything
    on it (a TLS record too) or the idle timeout passed; never after a request with a body (an
    upstream that left it unread would read it as the next request); non-idempotent methods always
    connect afresh; no TLS session is resumed; a reload starts an empty pool, and one whose egress
    cannot start turns http.fetch off rather than keep the old settings;
  * the resolver's channels are reused, but every query leaves from a socket of its own (a source
    port of its own), concurrent lookups included, and repeated answers count once (a second broker
    asking a FakeDns directly, which records the source port of every query).
"""

import base64
import json
import os
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
from fetchfix_dns import Dnsmasq, FakeDns  # noqa: E402
from fetchfix_upstream import TestPki, Upstream  # noqa: E402

IDLE_MS = 2000
HOST_RECORDS = ["ka.test,127.0.0.1", "tls.test,127.0.0.1"]
INITIAL_HOSTS = {"move.test": ["127.0.0.1"], "spoil.test": ["127.0.0.1"]}

FAKE_TABLE = {
    ("drop.fake.test", "A"): ("drop", None),  # never answered: every query stays in flight until its timeout
    ("drop.fake.test", "AAAA"): ("drop", None),
    ("dup.fake.test", "A"): ("addrs", ["127.0.0.1", "127.0.0.1"]),
    ("dup.fake.test", "AAAA"): ("addrs", []),
}

DNS = None
FAKE = None
PKI = None
B = None
B2 = None
UP = {}
_TMP = None


def setUpModule():
    global DNS, FAKE, PKI, B, B2, _TMP
    try:
        PKI = TestPki().make()
        DNS = Dnsmasq(HOST_RECORDS, INITIAL_HOSTS).start()
        FAKE = FakeDns(FAKE_TABLE).start()
        UP["a"] = Upstream().start()
        # the same port on 127.0.0.2: where move.test goes once it is rebound
        UP["a2"] = Upstream(host="127.0.0.2", port=UP["a"].port).start()
        UP["tls"] = Upstream(tls=PKI.server_context(PKI.tls_leaf)).start()
        config = {"egress": {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32", "127.0.0.2/32"],
                             "deny_local_interfaces": False, "ca_file": PKI.ca_file, "deadline_ms": 5000,
                             "connect_timeout_ms": 1000, "keepalive_pool_size": 2, "keepalive_idle_ms": IDLE_MS}}
        _TMP = tempfile.mkdtemp(prefix="sbreuse-")
        B = sbtest.Broker(config=config, env={"SANDBOX_BROKER_THREADS": "1", "SANDBOX_BROKER_TOKEN_STORE": "memory"}).start()
        config2 = {"egress": {"dns_servers": ["127.0.0.1:%d" % FAKE.port], "dns_timeout_ms": 500, "dns_tries": 1,
                              "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False}}
        B2 = sbtest.Broker(config=config2, env={"SANDBOX_BROKER_THREADS": "1", "SANDBOX_BROKER_TOKEN_STORE": "memory"}).start()
    except BaseException:
        _cleanup()
        raise


def _stop_broker(b, errors):
    try:
        rc = b.stop()
        log = b.log()
        if rc != 0:
            errors.append("broker exited with %s:\n%s" % (rc, log[-6000:]))
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            if marker in log:
                errors.append("sanitizer report in the broker log:\n%s" % log[-12000:])
                break
    except BaseException as e:
        b.kill()
        errors.append(repr(e))


def _cleanup():
    global B, B2
    errors = []
    for b in (B, B2):
        if b is not None:
            _stop_broker(b, errors)
    B = B2 = None
    for up in UP.values():
        up.stop()
    UP.clear()
    if DNS is not None:
        DNS.stop()
    if FAKE is not None:
        FAKE.stop()
    if PKI is not None:
        PKI.cleanup()
    if _TMP is not None:
        import shutil
        shutil.rmtree(_TMP, ignore_errors=True)
    if errors:
        raise AssertionError("\n".join(errors))


def tearDownModule():
    _cleanup()


def raw_route(data):
    """A route answering with hand-made bytes and then keeping the connection open (the broker must decide)."""
    return lambda h, rec: h.raw(data, close=False)


class ReuseCase(sbtest.BrokerTestCase):
    _n = 0

    def setUp(self):
        for up in UP.values():
            up.reset()

    def run_token(self, host="ka.test"):
        ReuseCase._n += 1
        run = "%s-%d" % (self._testMethodName, ReuseCase._n)
        return B.mint_ok(run, {"net": [host]}), run

    def fetch(self, tok, url, method="GET", body=None):
        args = {"url": url, "method": method}
        if body is not None:
            args["bodyBase64"] = base64.b64encode(body).decode("ascii")
        r = B.rpc(tok, "http.fetch", args, timeout=20.0)
        if r.status != 200:
            self.fail("fetch of %s failed: %r\n%s" % (url, r, B.log()[-3000:]))
        return r.body["value"], base64.b64decode(r.body["value"]["bodyBase64"])

    def url(self, path, host="ka.test", up="a", scheme="http"):
        return "%s://%s:%d%s" % (scheme, host, UP[up].port, path)

    def responses(self, run, count):
        sbtest.poll(lambda: len(self.events(run, "egress.response")) >= count, 5.0)
        evs = self.events(run, "egress.response")
        self.assertEqual(len(evs), count, evs)
        return [(e.get("hop"), e.get("address"), e.get("reused")) for e in evs]

    def events(self, run, name):
        return [e for e in B.events() if e.get("event") == name and e.get("runId") == run]

    def decisions(self, run, count):
        sbtest.poll(lambda: len(self.events(run, "egress.decision")) >= count, 5.0)
        evs = self.events(run, "egress.decision")
        self.assertEqual(len(evs), count, evs)
        return [(e.get("host"), e.get("answers"), e.get("decision")) for e in evs]

    def conn_ids(self, up):
        return [r.conn_id for r in UP[up].snapshot()]

    def assertQueryPairs(self, name, since, pairs):
        q = DNS.settled_queries(name, since, 2 * pairs)
        self.assertEqual(sorted(t for t, _ in q), ["A"] * pairs + ["AAAA"] * pairs, "queries for %s: %r" % (name, q))


class T1Reuse(ReuseCase):
    def test_second_fetch_of_a_run_reuses_the_connection(self):
        tok, run = self.run_token()
        mark = DNS.mark()
        for _ in range(3):
            v, body = self.fetch(tok, self.url("/hello"))
            self.assertEqual((v["status"], body), (200, b"hello"))
        self.assertEqual(UP["a"].connections, 1)
        self.assertEqual(self.conn_ids("a"), [1, 1, 1])
        # the request no longer asks for the close: HTTP/1.1 connections persist by default
        self.assertEqual(UP["a"].snapshot()[0].headers, [("host", "ka.test:%d" % UP["a"].port)])
        # every fetch resolved and validated afresh: reuse skips no step before the connection
        self.assertQueryPairs("ka.test", mark, 3)
        self.assertEqual([d[2] for d in self.decisions(run, 3)], ["allow"] * 3)
        self.assertEqual(self.responses(run, 3), [(0, "127.0.0.1", 0), (0, "127.0.0.1", 1), (0, "127.0.0.1", 1)])

    def test_redirect_hops_of_one_fetch_share_it(self):
        UP["a"].route("/r/first", lambda h, rec: h.reply(302, b"", [("Location", "/r/second")]))
        UP["a"].route("/r/second", lambda h, rec: h.reply(200, b"second"))
        tok, run = self.run_token()
        v, body = self.fetch(tok, self.url("/r/first"))
        self.assertEqual(body, b"second")
        self.assertEqual(self.conn_ids("a"), [1, 1])
        self.assertEqual(self.decisions(run, 2), [("ka.test", "127.0.0.1=allow(operator allow_cidrs)", "allow")] * 2)

    def test_chunked_and_empty_bodies_end_cleanly(self):
        UP["a"].route("/chunked", raw_route(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                            b"3\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n"))
        UP["a"].route("/empty", lambda h, rec: h.reply(204, b"", length=False))
        tok, run = self.run_token()
        self.assertEqual(self.fetch(tok, self.url("/chunked"))[1], b"abc")
        self.assertEqual(self.fetch(tok, self.url("/empty"))[0]["status"], 204)
        self.assertEqual(self.fetch(tok, self.url("/hello"))[1], b"hello")
        self.assertEqual(self.conn_ids("a"), [1, 1, 1])
        v, _ = self.fetch(tok, self.url("/hello"), method="HEAD")
        self.assertEqual(self.conn_ids("a"), [1, 1, 1, 1])

    def test_https_reuses_the_verified_connection(self):
        tok, run = self.run_token("tls.test")
        for _ in range(2):
            self.assertEqual(self.fetch(tok, self.url("/", "tls.test", "tls", "https"))[1], b"hello")
        self.assertEqual(UP["tls"].connections, 1)
        self.assertEqual(UP["tls"].snis, ["tls.test"])  # one handshake
        self.assertEqual([r.conn_id for r in UP["tls"].snapshot()], [1, 1])


class T2NeverAcrossRuns(ReuseCase):
    def test_each_run_has_its_own_connections(self):
        t1, r1 = self.run_token()
        t2, r2 = self.run_token()
        self.fetch(t1, self.url("/"))
        self.fetch(t2, self.url("/"))
        self.assertEqual(UP["a"].connections, 2)
        self.assertEqual(self.responses(r2, 1), [(0, "127.0.0.1", 0)])
        # the first run's connection stayed parked for it, and only for it
        self.fetch(t1, self.url("/"))
        self.fetch(t2, self.url("/"))
        self.assertEqual(self.conn_ids("a"), [1, 2, 1, 2])

    def test_same_run_id_with_another_token_is_another_owner(self):
        # a second token for the same runId: the pool keys on the token, so nothing crosses
        ReuseCase._n += 1
        run = "shared-run-%d" % ReuseCase._n
        t1 = B.mint_ok(run, {"net": ["ka.test"]})
        t2 = B.mint_ok(run, {"net": ["ka.test"]})
        self.fetch(t1, self.url("/"))
        self.fetch(t2, self.url("/"))
        self.assertEqual(self.conn_ids("a"), [1, 2])

    def test_pool_bound_evicts_the_oldest(self):
        toks = [self.run_token() for _ in range(3)]
        for t, _ in toks:
            self.fetch(t, self.url("/"))
        self.assertEqual(UP["a"].connections, 3)
        # a pool of two: the first run's connection was closed to park the third
        self.fetch(toks[0][0], self.url("/"))
        self.fetch(toks[2][0], self.url("/"))
        self.assertEqual(self.conn_ids("a"), [1, 2, 3, 4, 3])


class T3Revalidation(ReuseCase):
    def tearDown(self):
        DNS.rebind(dict(INITIAL_HOSTS))

    def test_not_after_the_name_moves(self):
        tok, run = self.run_token("move.test")
        self.fetch(tok, self.url("/", "move.test"))
        DNS.rebind({"move.test": ["127.0.0.2"], "spoil.test": ["127.0.0.1"]})
        v, body = self.fetch(tok, self.url("/", "move.test"))
        self.assertEqual(body, b"hello")
        # the new answer does not contain the connected address: a fresh connection to the new one
        self.assertEqual(self.conn_ids("a"), [1])
        self.assertEqual(self.conn_ids("a2"), [1])
        self.assertEqual(self.responses(run, 2), [(0, "127.0.0.1", 0), (0, "127.0.0.2", 0)])

    def test_a_blocked_answer_is_refused_with_a_connection_parked(self):
        tok, run = self.run_token("spoil.test")
        self.fetch(tok, self.url("/", "spoil.test"))
        # still contains the connected address, but one answer fails the policy: the name is refused
        DNS.rebind({"move.test": ["127.0.0.1"], "spoil.test": ["127.0.0.1", "10.0.0.5"]})
        r = B.rpc(tok, "http.fetch", {"url": self.url("/", "spoil.test")}, timeout=20.0)
        self.assertError(r, 500, "execution_error")
        sbtest.poll(lambda: self.events(run, "egress.failed"), 5.0)
        self.assertEqual([e.get("reason") for e in self.events(run, "egress.failed")],
                         ['http.fetch host "spoil.test" resolves to a blocked address 10.0.0.5 (private 10.0.0.0/8)'])
        time.sleep(0.2)
        self.assertEqual(len(UP["a"].snapshot()), 1)


class T4NotAfterAnUncleanEnd(ReuseCase):
    CASES = {
        "/close-header": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        "/close-listed": b"HTTP/1.1 200 OK\r\nConnection: x-foo, Close\r\nContent-Length: 2\r\n\r\nok",
        "/http10": b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "/extra-bytes": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        "/chunked-extra": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nX",
    }

    def test_unclean_ends_are_never_parked(self):
        for path, data in self.CASES.items():
            with self.subTest(path=path):
                UP["a"].reset()
                UP["a"].route(path, raw_route(data))
                tok, run = self.run_token()
                self.assertEqual(self.fetch(tok, self.url(path))[1], b"ok")
                self.fetch(tok, self.url("/hello"))
                self.assertEqual(self.conn_ids("a"), [1, 2])

    def test_body_delimited_by_the_close(self):
        UP["a"].route("/to-close", lambda h, rec: h.raw(b"HTTP/1.1 200 OK\r\n\r\nuntil the end"))
        tok, run = self.run_token()
        self.assertEqual(self.fetch(tok, self.url("/to-close"))[1], b"until the end")
        self.fetch(tok, self.url("/hello"))
        self.assertEqual(self.conn_ids("a"), [1, 2])

    def test_a_cut_response_fails_and_is_not_parked(self):
        UP["a"].route("/cut", lambda h, rec: h.raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"))
        tok, run = self.run_token()
        self.fetch(tok, self.url("/hello"))
        r = B.rpc(tok, "http.fetch", {"url": self.url("/cut")}, timeout=20.0)
        self.assertError(r, 500, "execution_error")
        self.fetch(tok, self.url("/hello"))
        self.assertEqual(self.conn_ids("a"), [1, 1, 2])

    def test_peer_closing_an_idle_connection(self):
        def close_after(h, rec):
            h.reply(200, b"bye")
            h.close_connection = True  # closes without having said so

        UP["a"].route("/bye", close_after)
        tok, run = self.run_token()
        self.fetch(tok, self.url("/bye"))
        time.sleep(0.3)
        self.assertEqual(self.fetch(tok, self.url("/hello"))[1], b"hello")
        self.assertEqual(self.conn_ids("a"), [1, 2])

    def test_a_parked_connection_that_dies_unanswered_is_retried_once(self):
        # the upstream closes a kept-alive connection on its second request without answering (the race of
        # a close with a reuse): an idempotent request goes again, once, on a fresh connection
        def flaky(h, rec):
            if [r.conn_id for r in UP["a"].snapshot()].count(rec.conn_id) >= 2:
                h.close_connection = True
                return
            h.reply(200, b"fine")

        UP["a"].route("/flaky", flaky)
        tok, run = self.run_token()
        self.assertEqual(self.fetch(tok, self.url("/flaky"))[1], b"fine")
        self.assertEqual(self.fetch(tok, self.url("/flaky"))[1], b"fine")
        self.assertEqual(self.conn_ids("a"), [1, 1, 2])
        self.assertEqual(self.responses(run, 2), [(0, "127.0.0.1", 0), (0, "127.0.0.1", 0)])

    def test_idle_timeout(self):
        tok, run = self.run_token()
        self.fetch(tok, self.url("/"))
        time.sleep(IDLE_MS / 1000.0 * 2)
        self.fetch(tok, self.url("/"))
        self.assertEqual(self.conn_ids("a"), [1, 2])

    def test_non_idempotent_methods_connect_afresh(self):
        tok, run = self.run_token()
        self.fetch(tok, self.url("/"))
        self.fetch(tok, self.url("/post"), method="POST", body=b"x")
        self.fetch(tok, self.url("/"))
        ids = self.conn_ids("a")
        self.assertEqual(ids[:2], [1, 2])
        self.assertIn(ids[2], (1, 2))  # a GET takes either parked one
        self.assertEqual(UP["a"].snapshot()[1].body, b"x")


class T6Reload(ReuseCase):
    def rewrite(self, cfg):
        path = os.path.join(B._tmpdir, "config.json")
        with open(path + ".new", "w") as f:
            json.dump(cfg, f)
        os.replace(path + ".new", path)

    def hup_and_wait(self, event):
        before = B.log().count('"event":"%s"' % event)
        B.proc.send_signal(signal.SIGHUP)
        self.assertTrue(sbtest.poll(lambda: B.log().count('"event":"%s"' % event) > before, 10), B.log()[-3000:])

    def test_a_reload_whose_egress_cannot_start_turns_fetch_off(self):
        # the new settings deny the upstream's address, and the worker cannot make their resolver (c-ares refuses
        # the server list): http.fetch must stop, never go on with the old settings over the parked connection
        tok, run = self.run_token()
        self.fetch(tok, self.url("/"))
        bad = json.loads(json.dumps(B.config))
        bad["egress"].update({"dns_servers": ["not a server list"], "deny_cidrs": ["127.0.0.1/32"]})
        try:
            self.rewrite(bad)
            self.hup_and_wait("reload.applied")
            self.assertTrue(sbtest.poll(lambda: "egress.disabled" in B.log(), 5.0), B.log()[-3000:])
            time.sleep(0.3)  # the worker switches at its next turn
            r = B.rpc(tok, "http.fetch", {"url": self.url("/")}, timeout=20.0)
            self.assertError(r, 501, "not_implemented")
            time.sleep(0.2)
            self.assertEqual(self.conn_ids("a"), [1])
        finally:
            self.rewrite(B.config)
            self.hup_and_wait("reload.applied")
            time.sleep(0.3)
        # the good settings again: a fresh context, a fresh connection
        self.fetch(tok, self.url("/"))
        self.assertEqual(self.conn_ids("a"), [1, 2])

    def test_a_reload_starts_an_empty_pool(self):
        tok, run = self.run_token()
        self.fetch(tok, self.url("/"))
        self.fetch(tok, self.url("/"))
        before = B.log().count('"event":"reload.applied"')
        B.proc.send_signal(signal.SIGHUP)
        self.assertTrue(sbtest.poll(lambda: B.log().count('"event":"reload.applied"') > before, 10), B.log()[-3000:])
        time.sleep(0.3)  # the worker switches at its next turn
        # the worker's new egress context has a pool of its own: the old one's connections are not taken over
        self.fetch(tok, self.url("/"))
        self.fetch(tok, self.url("/"))
        self.assertEqual(self.conn_ids("a"), [1, 1, 2, 2])


class T7LeftoverBytes(ReuseCase):
    """Nothing a previous exchange left on a connection may reach the next one (request or response)."""

    def test_a_request_body_the_upstream_left_unread_never_meets_the_next_request(self):
        # a buggy upstream answers /unread without reading its body, and would then read the body as the next
        # request on the connection: here the head of a POST whose body is the broker's next request, which
        # /echo would send back to the guest (with whatever headers the broker added to it)
        port = UP["a"].port
        nxt = b"GET /secret HTTP/1.1\r\nhost: ka.test:%d\r\nx-next: 1\r\n\r\n" % port
        prefix = b"POST /echo HTTP/1.1\r\nHost: ka.test\r\nContent-Length: %d\r\n\r\n" % len(nxt)
        UP["a"].unread_body.add("/unread")
        UP["a"].route("/unread", lambda h, rec: h.reply(200, b"unread"))
        UP["a"].route("/echo", lambda h, rec: h.reply(200, rec.body))
        UP["a"].route("/secret", lambda h, rec: h.reply(200, b"secret"))
        try:
            tok, run = self.run_token()
            self.assertEqual(self.fetch(tok, self.url("/unread"), method="PUT", body=prefix)[1], b"unread")
            args = {"url": self.url("/secret"), "headers": {"X-Next": "1"}}
            r = B.rpc(tok, "http.fetch", args, timeout=20.0)
            self.assertEqual(r.status, 200, r)
            self.assertEqual(base64.b64decode(r.body["value"]["bodyBase64"]), b"secret")
        finally:
            UP["a"].unread_body.discard("/unread")
        reqs = UP["a"].snapshot()
        self.assertEqual([(x.target, x.conn_id) for x in reqs], [("/unread", 1), ("/secret", 2)])
        # the request with a body asked for the close: its connection is never parked
        self.assertEqual(reqs[0].header_values("connection"), ["close"])
        self.assertEqual(reqs[1].header_values("connection"), [])
        self.assertEqual(self.responses(run, 2), [(0, "127.0.0.1", 0), (0, "127.0.0.1", 0)])

    def test_a_response_arriving_while_parked_ends_the_connection(self):
        def late(h, rec):
            h.reply(200, b"ok")
            wfile = h.wfile

            def forge():
                time.sleep(0.15)
                try:
                    wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nforge")
                    wfile.flush()
                except OSError:
                    pass
            threading.Thread(target=forge, daemon=True).start()

        UP["a"].route("/late", late)
        tok, run = self.run_token()
        self.assertEqual(self.fetch(tok, self.url("/late"))[1], b"ok")
        time.sleep(0.5)
        self.assertEqual(self.fetch(tok, self.url("/hello"))[1], b"hello")
        self.assertEqual(self.conn_ids("a"), [1, 2])

    def test_a_tls_record_begun_while_parked_ends_the_connection(self):
        # three bytes of a record header, below TLS: h2o holds them back, waiting for the rest; the next exchange
        # on the connection would read its response behind them
        def late(h, rec):
            h.reply(200, b"ok")
            fd = h.connection.fileno()

            def begin_record():
                time.sleep(0.15)
                try:
                    os.write(fd, b"\x17\x03\x03")
                except OSError:
                    pass
            threading.Thread(target=begin_record, daemon=True).start()

        UP["tls"].route("/late", late)
        try:
            tok, run = self.run_token("tls.test")
            self.assertEqual(self.fetch(tok, self.url("/late", "tls.test", "tls", "https"))[1], b"ok")
            time.sleep(0.5)
            self.assertEqual(self.fetch(tok, self.url("/", "tls.test", "tls", "https"))[1], b"hello")
        finally:
            del UP["tls"].routes["/late"]
        self.assertEqual([r.conn_id for r in UP["tls"].snapshot()], [1, 2])
        self.assertEqual(self.responses(run, 2), [(0, "127.0.0.1", 0), (0, "127.0.0.1", 0)])

    def test_tls_sessions_are_never_resumed(self):
        # every TLS connection verifies the certificate in a full handshake: two runs, two handshakes, none resumed
        for _ in range(2):
            tok, run = self.run_token("tls.test")
            self.assertEqual(self.fetch(tok, self.url("/", "tls.test", "tls", "https"))[1], b"hello")
        self.assertEqual(UP["tls"].connections, 2)
        self.assertTrue(sbtest.poll(lambda: len(UP["tls"].resumed) == 2, 5.0), UP["tls"].resumed)
        self.assertEqual(UP["tls"].resumed, [False, False])


class T8Defaults(sbtest.BrokerTestCase):
    """Reuse is on when the configuration does not name it; keepalive_pool_size 0 turns it off."""

    def one_broker(self, extra):
        egress = {"dns_servers": [DNS.server], "allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False}
        egress.update(extra)
        b = sbtest.Broker(config={"egress": egress},
                          env={"SANDBOX_BROKER_THREADS": "1", "SANDBOX_BROKER_TOKEN_STORE": "memory"}).start()
        self.addCleanup(lambda: _stop_broker(b, self.broker_errors))
        return b

    def setUp(self):
        self.broker_errors = []
        UP["a"].reset()
        self.addCleanup(lambda: self.assertEqual(self.broker_errors, []))

    def fetch(self, b, tok):
        r = b.rpc(tok, "http.fetch", {"url": "http://ka.test:%d/" % UP["a"].port}, timeout=20.0)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(base64.b64decode(r.body["value"]["bodyBase64"]), b"hello")

    def reused(self, b, run, count):
        def lines():
            return [e for e in b.events() if e.get("event") == "egress.response" and e.get("runId") == run]

        self.assertTrue(sbtest.poll(lambda: len(lines()) >= count, 5.0), b.log()[-3000:])
        return [e.get("reused") for e in lines()]

    def test_the_default_reuses_within_a_run_and_never_across_runs(self):
        b = self.one_broker({})
        t1 = b.mint_ok("default-1", {"net": ["ka.test"]})
        t2 = b.mint_ok("default-2", {"net": ["ka.test"]})
        self.fetch(b, t1)
        self.fetch(b, t1)
        self.fetch(b, t2)
        self.assertEqual(self.reused(b, "default-1", 2), [0, 1])
        self.assertEqual(self.reused(b, "default-2", 1), [0])
        reqs = UP["a"].snapshot()
        self.assertEqual([r.conn_id for r in reqs], [1, 1, 2])
        self.assertEqual([r.header_values("connection") for r in reqs], [[], [], []])

    def test_a_pool_size_of_zero_turns_reuse_off(self):
        b = self.one_broker({"keepalive_pool_size": 0})
        tok = b.mint_ok("off-1", {"net": ["ka.test"]})
        self.fetch(b, tok)
        self.fetch(b, tok)
        self.assertEqual(self.reused(b, "off-1", 2), [0, 0])
        reqs = UP["a"].snapshot()
        self.assertEqual([r.conn_id for r in reqs], [1, 2])
        self.assertEqual([r.header_values("connection") for r in reqs], [["close"], ["close"]])


class T5Resolver(sbtest.BrokerTestCase):
    def open_fds(self):
        return len(os.listdir("/proc/%d/fd" % B2.proc.pid))

    def test_every_query_has_a_socket_of_its_own(self):
        n = 8
        toks = [B2.mint_ok("ports-%d" % i, {"net": ["drop.fake.test"]}) for i in range(n)]
        fds_before = self.open_fds()
        del FAKE.sources[:]
        results = [None] * n

        def one(i):
            results[i] = B2.rpc(toks[i], "http.fetch", {"url": "http://drop.fake.test/"}, timeout=20.0)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for r in results:
            self.assertError(r, 500, "execution_error")
        reasons = [e.get("reason") for e in B2.events() if e.get("event") == "egress.failed"
                   and str(e.get("runId", "")).startswith("ports-")]
        self.assertEqual(reasons, ['DNS resolution failed for "drop.fake.test": DNS timeout'] * n)
        # 2n queries, all in flight together (none is ever answered), each from its own source port
        ports = [p for p, _ in FAKE.sources]
        self.assertEqual(len(ports), 2 * n, FAKE.sources)
        self.assertEqual(len(set(ports)), 2 * n, "queries shared a source port: %r" % sorted(ports))
        # the channels stay for the next lookups, their sockets do not
        self.assertTrue(sbtest.poll(lambda: self.open_fds() <= fds_before, 5.0),
                        "%d descriptors open after the lookups, %d before" % (self.open_fds(), fds_before))

    def test_repeated_answers_count_once(self):
        up = UP["a"]
        tok = B2.mint_ok("dup-answers", {"net": ["dup.fake.test"]})
        r = B2.rpc(tok, "http.fetch", {"url": "http://dup.fake.test:%d/" % up.port}, timeout=20.0)
        self.assertEqual(r.status, 200, r)
        sbtest.poll(lambda: [e for e in B2.events() if e.get("event") == "egress.decision" and e.get("runId") == "dup-answers"],
                    5.0)
        answers = [e.get("answers") for e in B2.events() if e.get("event") == "egress.decision" and e.get("runId") == "dup-answers"]
        self.assertEqual(answers, ["127.0.0.1=allow(operator allow_cidrs)"])


if __name__ == "__main__":
    sbtest.main()

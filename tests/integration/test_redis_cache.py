#!/usr/bin/python3
"""The Redis store's per-worker token cache and quota leases, with three broker instances (two
workers each) on one real redis-server.

Each worker keeps a data link (CLIENT SETNAME sandbox-broker:data, CLIENT TRACKING ON REDIRECT <inv>
BCAST PREFIX <prefix>tok:) and an invalidation link (sandbox-broker:inv, subscribed to
__redis__:invalidate); losing the invalidation link drops the worker's cache and every call on it
answers 503 until both links are back. Quotas (calls, concurrent) are leased from the run's Redis
counters in blocks, never more in total than the quota, and given back 100 ms after a worker's last
call for the token.

What is checked here, each against answers and Redis counters, never against timing tighter than a
correctness bound (timing belongs to tests/bench):
  * a revoked token or run is refused on every other instance within 1 s (p50/p99 printed), also by
    a worker holding leased calls for it (which serves it without asking Redis: only the
    invalidation stops it);
  * leases start at 1 and grow, never beyond 256 calls nor 1/16 of what the run has left;
  * a run's calls quota is never exceeded across instances and can be used exactly, to the call;
    refused calls are not counted, and leased calls go back (the counters say what was used);
  * a run's concurrency quota is never exceeded across instances and its slots all come back;
  * a worker whose invalidation link is killed never grants a token revoked meanwhile, and recovers;
  * Redis restarted under load: only granted/unavailable answers for a live token, never a grant for
    a revoked one (before the restart or just after it), and recovery.
"""

import http.client
import http.server
import os
import sys
import threading
import time
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redisfix  # noqa: E402
import sbtest  # noqa: E402
from sbtest import MSG_UNAUTHORIZED, poll  # noqa: E402
from test_redis import ADMIN_UNAVAILABLE_MSG, GRANTED_MSG, UNAVAILABLE_MSG, RedisBase  # noqa: E402

CAPS = {"services": ["mailer"], "net": ["127.0.0.1"]}
EGRESS = {"allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False}
PREFIX = "sb:"
THREADS = 2
CALLS_MSG = "run quota exceeded: calls per run"
CONCURRENT_MSG = "run quota exceeded: concurrent calls per run"
DATA_NAME = "sandbox-broker:data"
INV_NAME = "sandbox-broker:inv"
SLOW_S = 1.5  # how long the upstream holds a slow fetch
# Leased calls a worker must hold before a revocation for a stale cache to show: polled every PACE_S
# (under the 100 ms after which an idle lease goes back), they would last LEASED * PACE_S = 1.2 s,
# beyond the 1 s bound. Without a lease, a worker asks Redis (which knows the revocation) anyway.
LEASED = 30
PACE_S = 0.04
BIG = 1000000  # a calls quota that leases can grow under
LEASE_MAX = 256  # the most calls one lease takes, whatever the run has left (PROTOCOL.md section 9)


def outcome(resp):
    """What an answer to services.mailer.send means: "granted", "revoked", "unavailable" (the RPC
    route's answer while the store cannot be trusted, as in test_redis.py), "quota_unavailable" (the
    answer of a quota update that failed, as in test_redis_paths.py), "calls", "concurrent"; None for
    any other answer (not one of those exact bodies)."""
    body = resp.body
    if not isinstance(body, dict) or set(body.keys()) != {"ok", "error"} or body.get("ok") is not False:
        return None
    err = body.get("error")
    if not isinstance(err, dict) or set(err.keys()) != {"code", "message"}:
        return None
    got = (resp.status, err["code"], err["message"])
    if got == (501, "not_implemented", GRANTED_MSG):
        return "granted"
    if got == (401, "unauthorized", MSG_UNAUTHORIZED):
        return "revoked"
    if got == (503, "unavailable", UNAVAILABLE_MSG):
        return "unavailable"
    if got == (503, "unavailable", ADMIN_UNAVAILABLE_MSG):
        return "quota_unavailable"
    if got == (429, "rate_limited", CALLS_MSG):
        return "calls"
    if got == (429, "rate_limited", CONCURRENT_MSG):
        return "concurrent"
    return None


def call(br, tok, timeout=10.0):
    return br.rpc(tok, "services.mailer.send", {}, timeout=timeout)


class KeepAlive:
    """One keep-alive connection to a broker's public listener (http.client)."""

    def __init__(self, br):
        self.br = br
        self.conn = http.client.HTTPConnection("127.0.0.1", br.port, timeout=10)

    def call(self, tok, enc="json"):
        body = sbtest.encode({"method": "services.mailer.send", "args": {}}, enc)
        self.conn.request("POST", sbtest.RPC_PATH, body=body,
                          headers={"Content-Type": sbtest.content_type_of(enc), sbtest.TOKEN_HEADER: tok})
        r = self.conn.getresponse()
        raw = r.read()
        return sbtest.Response(r.status, {k.lower(): v for k, v in r.getheaders()}, raw)

    def close(self):
        self.conn.close()


# --- a slow loopback upstream that counts how many requests of each run it holds at once ---

class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), SlowHandler)
        self.lock = threading.Lock()
        self.now = {}  # tag -> requests held now
        self.peak = {}  # tag -> most requests held at once
        self.seen = {}  # tag -> requests received

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.server_address[1]


class SlowHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        srv = self.server
        tag = self.path.split("?", 1)[1] if "?" in self.path else ""
        with srv.lock:
            srv.now[tag] = srv.now.get(tag, 0) + 1
            srv.seen[tag] = srv.seen.get(tag, 0) + 1
            srv.peak[tag] = max(srv.peak.get(tag, 0), srv.now[tag])
        try:
            if self.path.startswith("/slow"):
                time.sleep(SLOW_S)
            body = b"x" * 100
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        finally:
            with srv.lock:
                srv.now[tag] -= 1


# --- Redis's view of the brokers' connections ---

def client_list(node):
    """CLIENT LIST as a list of dicts (every field a string)."""
    out = []
    for line in node.cmd("CLIENT", "LIST").decode().splitlines():
        fields = {}
        for part in line.split(" "):
            k, _, v = part.partition("=")
            fields[k] = v
        out.append(fields)
    return out


def local_tcp_ports(pid):
    """The local ports of the TCP sockets process `pid` holds (its fds matched to /proc/net/tcp by inode)."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[9] in inodes:
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def links_of(node, br, name):
    """The Redis clients named `name` that belong to broker `br` (by the client's source port)."""
    ports = local_tcp_ports(br.proc.pid)
    return [c for c in client_list(node)
            if c.get("name") == name and int(c["addr"].rsplit(":", 1)[1]) in ports]


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


class CacheBase(RedisBase):
    """Helpers shared by the classes below."""

    def assertOutcome(self, resp, allowed, what=""):
        o = outcome(resp)
        self.assertIn(o, allowed, "%s: unexpected answer %r" % (what, resp))
        return o

    def settled(self, br, tok, want, n=6):
        """n answers in a row (fresh connections, so both workers) are `want`."""
        for _ in range(n):
            if outcome(call(br, tok)) != want:
                return False
        return True

    def warm(self, br, timeout=10.0):
        """Waits until every worker of `br` grants a fresh token (both links up)."""
        tok = br.mint_ok("run-warm", CAPS)
        self.assertTrue(poll(lambda: self.settled(br, tok, "granted", 8), timeout, interval=0.05),
                        "the broker never granted calls:\n" + br.log()[-3000:])

    def counter(self, node, kind, run):
        v = node.cmd("GET", "%sq:%s:%s" % (PREFIX, kind, run))
        return None if v is None else int(v)

    def cache_everywhere(self, tok, brokers, n=6):
        """n granted calls on each broker (fresh connections: both of its workers, in practice)."""
        for br in brokers:
            for _ in range(n):
                self.works(br, tok)

    def lease_up(self, conn, tok, run, want=LEASED, limit=400):
        """Calls `tok` on one keep-alive connection (one worker, the only one calling `run`) until that
        worker holds at least `want` leased calls it has not used (the run's calls counter minus the
        calls granted): from then on a stale cache would grant that many calls without asking Redis.
        Returns the calls granted."""
        granted = 0
        while granted < limit:
            self.assertOutcome(conn.call(tok), ("granted",), "building a lease")
            granted += 1
            if self.counter(self.node, "calls", run) - granted >= want:
                return granted
        self.fail("no lease of %d calls after %d calls: counter %s" % (
            want, limit, self.counter(self.node, "calls", run)))


def start_three(url, config=None):
    env = {"SANDBOX_BROKER_TOKEN_STORE": url, "SANDBOX_BROKER_REDIS_PREFIX": PREFIX,
           "SANDBOX_BROKER_THREADS": str(THREADS)}
    out = []
    try:
        for _ in range(3):
            out.append(sbtest.Broker(env=env, config=config).start())
    except Exception:
        for br in out:
            br.kill()
        raise
    return out


def stop_all(brokers):
    """SIGTERM every broker; returns the problems (an exit status other than 0, no "stopped" line)."""
    errors = []
    for br in brokers:
        try:
            rc = br.stop()
        except AssertionError as e:
            errors.append(str(e))
            continue
        if rc != 0 or '"event":"stopped"' not in br.log():
            errors.append("broker exited with %s:\n%s" % (rc, br.log()[-4000:]))
    return errors


class ThreeInstances(CacheBase):
    """A, B and C on one Redis of their own (CLIENT KILL must not reach another test's brokers)."""

    @classmethod
    def setUpClass(cls):
        cls.node = redisfix.Node().start()
        cls.up = Upstream()
        threading.Thread(target=cls.up.serve_forever, daemon=True).start()
        try:
            cls.a, cls.b, cls.c = start_three(cls.node.url, config={"egress": EGRESS})
        except Exception:
            cls.up.shutdown()
            cls.node.cleanup()
            raise
        cls.all = (cls.a, cls.b, cls.c)

    @classmethod
    def tearDownClass(cls):
        errors = stop_all(cls.all)
        cls.up.shutdown()
        cls.node.cleanup()
        if errors:
            raise AssertionError("\n".join(errors))

    def setUp(self):
        for br in self.all:
            self.assertTrue(br.alive(), br.log()[-3000:])
            self.warm(br)

    # --- 1: revocation reaches every instance ---

    def until_refused(self, pairs, t0, limit=1.0):
        """Polls every (broker, token) until 6 refusals in a row; returns each one's delay from t0 to the
        first refusal of that streak. A grant is allowed only before the streak; anything else fails."""
        delays, streak, started = {}, {}, {}
        deadline = t0 + limit + 1.0  # keep polling past the bound, so a late refusal is measured, not missed
        while len(delays) < len(pairs):
            for i, (br, tok) in enumerate(pairs):
                if i in delays:
                    continue
                r = call(br, tok)
                now = time.monotonic()
                o = self.assertOutcome(r, ("granted", "revoked"), "after the revocation")
                if o == "revoked":
                    if streak.get(i, 0) == 0:
                        started[i] = now
                    streak[i] = streak.get(i, 0) + 1
                    if streak[i] >= 6:
                        delays[i] = started[i] - t0
                else:
                    streak[i] = 0
            if time.monotonic() > deadline:
                late = [i for i in range(len(pairs)) if i not in delays]
                self.fail("still granted %.1f s after the revocation: pairs %s" % (time.monotonic() - t0, late))
        return [delays[i] for i in range(len(pairs))]

    def report(self, what, delays):
        sys.stderr.write("%s: %d delays, p50 %.2f ms, p99 %.2f ms, max %.2f ms\n" % (
            what, len(delays), pct(delays, 50) * 1e3, pct(delays, 99) * 1e3, max(delays) * 1e3))

    def test_1_revoked_token_refused_on_every_instance(self):
        delays = []
        for i in range(30):
            tok = self.a.mint_ok("run-rv-%d" % i, CAPS)
            self.cache_everywhere(tok, (self.b, self.c), n=4)
            r = self.a.revoke_token(tok)
            self.assertEqual(r.status, 204, r)
            t0 = time.monotonic()
            delays += self.until_refused([(self.b, tok), (self.c, tok)], t0)
            self.refused(self.a, tok)
        self.report("token revoked on A, refused on B and C", delays)
        self.assertLessEqual(max(delays), 1.0)

    def test_1_revoked_run_refused_on_every_instance(self):
        delays = []
        for i in range(10):
            run = "run-rr-%d" % i
            t1 = self.a.mint_ok(run, CAPS)
            t2 = self.b.mint_ok(run, CAPS)
            other = self.a.mint_ok(run + "-other", CAPS)
            for tok in (t1, t2, other):
                self.cache_everywhere(tok, (self.a, self.b), n=3)
            r = self.c.revoke_run(run)
            self.assertEqual(r.status, 204, r)
            t0 = time.monotonic()
            delays += self.until_refused([(self.a, t1), (self.a, t2), (self.b, t1), (self.b, t2)], t0)
            # another run's token is untouched
            self.works(self.a, other)
            self.works(self.b, other)
        self.report("run revoked on C, refused on A and B", delays)
        self.assertLessEqual(max(delays), 1.0)

    def test_1_revoked_token_refused_despite_leased_calls(self):
        """A worker holding leased calls for a cached token serves it without Redis: only the
        invalidation can stop it. Polled at a pace that keeps the lease, it must refuse within 1 s
        (a worker that missed the invalidation would grant for LEASED * PACE_S = 1.2 s)."""
        for name, br in (("b", self.b), ("c", self.c)):
            run = "run-leased-" + name
            tok = self.a.mint_ok(run, CAPS, quotas={"calls": BIG})
            conn = KeepAlive(br)
            try:
                granted = self.lease_up(conn, tok, run)
                r = self.a.revoke_token(tok)
                self.assertEqual(r.status, 204, r)
                t0 = time.monotonic()
                while True:
                    o = self.assertOutcome(conn.call(tok), ("granted", "revoked"), "after the revocation")
                    if o == "revoked":
                        break
                    granted += 1
                    self.assertLessEqual(time.monotonic() - t0, 1.0, "%s still granted a revoked token" % name.upper())
                    time.sleep(PACE_S)
                sys.stderr.write("%s, holding %d leased calls: refused %.2f ms after the revocation\n" % (
                    name.upper(), LEASED, (time.monotonic() - t0) * 1e3))
            finally:
                conn.close()
            # the calls it had leased go back: the run's counter is what was used
            self.assertTrue(poll(lambda: self.counter(self.node, "calls", run) == granted, 2.0),
                            (self.counter(self.node, "calls", run), granted))

    # --- 2: the calls quota, exact across instances ---

    def leases(self, conn, tok, run, quota, calls):
        """`calls` calls on one connection (one worker); returns each lease it took as (size, calls left
        in the run before it), read from the run's counter after every call."""
        out, before = [], 0
        for i in range(calls):
            self.assertOutcome(conn.call(tok), ("granted",), "call %d of %d" % (i + 1, calls))
            now = self.counter(self.node, "calls", run)
            if now != before:
                out.append((now - before, quota - before))
                before = now
        return out

    def test_2_lease_sizes(self):
        """Leases start at 1 and grow, never beyond LEASE_MAX calls nor 1/16 of what the run has left
        (so 1 near the limit), and a run can still use its quota to the last call."""
        # 600 calls of a big quota: 1 + 2 + ... + 256 = 511, so the tenth lease would pass the cap
        for quota, calls in ((600, 600), (BIG, 600)):
            run = "run-lease-%d" % quota
            tok = self.a.mint_ok(run, CAPS, quotas={"calls": quota})
            conn = KeepAlive(self.b)
            try:
                got = self.leases(conn, tok, run, quota, calls)
                if calls == quota:
                    self.assertError(conn.call(tok), 429, "rate_limited", CALLS_MSG)
            finally:
                conn.close()
            sys.stderr.write("calls quota %d: leases %s\n" % (quota, [size for size, _ in got]))
            self.assertEqual(got[0][0], 1, got)
            for size, left in got:
                self.assertLessEqual(size, LEASE_MAX, (size, left, got))
                self.assertLessEqual(size, max(1, left // 16), (size, left, got))
            self.assertTrue(poll(lambda: self.counter(self.node, "calls", run) == calls, 2.0),
                            (self.counter(self.node, "calls", run), calls))

    def hammer(self, tok, per_instance=3):
        """Threads on keep-alive connections to A, B and C, each calling until refused by the calls
        quota; returns (granted, refused, answers nobody expected)."""
        counts = {"granted": 0, "calls": 0}
        bad = []
        lock = threading.Lock()
        go = threading.Barrier(per_instance * 3)

        def run(br, k):
            conn = KeepAlive(br)
            try:
                go.wait(10)
                n = 0
                while n < 1000:
                    n += 1
                    r = conn.call(tok, "msgpack" if (n + k) % 2 else "json")
                    o = outcome(r)
                    with lock:
                        if o in counts:
                            counts[o] += 1
                        else:
                            bad.append(r)
                    if o != "granted":
                        return
            except Exception as e:  # a broken connection or a timeout is an answer nobody expected too
                with lock:
                    bad.append(repr(e))
            finally:
                conn.close()

        threads = [threading.Thread(target=run, args=(br, k)) for br in self.all for k in range(per_instance)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return counts["granted"], counts["calls"], bad

    def use_the_rest(self, tok, rounds=12):
        """After a quiet pause (leases given back), calls A, B, C in turn until refused; done when the
        first call after a pause is refused (nothing is leased anywhere then). Returns calls granted."""
        granted = 0
        for _ in range(rounds):
            time.sleep(0.5)
            first = True
            refused = False
            while not refused:
                for br in self.all:
                    o = self.assertOutcome(call(br, tok), ("granted", "calls"), "using the rest of the quota")
                    if o == "granted":
                        granted += 1
                        first = False
                    else:
                        if first:
                            return granted
                        refused = True
                        break
        self.fail("the run was still granting calls after %d quiet pauses" % rounds)

    def test_2_calls_quota_exact_across_instances(self):
        n = 200
        run = "run-calls"
        tok = self.a.mint_ok(run, CAPS, quotas={"calls": n, "concurrent": 64})
        granted, refused, bad = self.hammer(tok)
        self.assertEqual(bad[:3], [], "%d unexpected answers" % len(bad))
        self.assertLessEqual(granted, n)
        self.assertEqual(refused, 9, "every thread ends on one refusal")
        more = self.use_the_rest(tok)
        sys.stderr.write("calls quota %d: %d granted under load, %d more after the leases came back\n" % (
            n, granted, more))
        self.assertEqual(granted + more, n)
        # refused everywhere, on every worker, from now on
        for br in self.all:
            for _ in range(4):
                self.assertError(call(br, tok), 429, "rate_limited", CALLS_MSG)
        self.assertTrue(poll(lambda: self.counter(self.node, "inflight", run) == 0, 2.0),
                        self.counter(self.node, "inflight", run))

    def test_2_refused_calls_not_counted_beyond_the_quota(self):
        """Leases given back and refusals not counted: after a quiet moment the run's counters (and
        its usage on the admin listener) say exactly what was used."""
        n = 20
        run = "run-counted"
        tok = self.b.mint_ok(run, CAPS, quotas={"calls": n})
        self.assertEqual(self.use_the_rest(tok), n)
        for br in self.all:
            for _ in range(5):
                self.assertError(call(br, tok), 429, "rate_limited", CALLS_MSG)
        time.sleep(0.3)

        def counters():
            return self.counter(self.node, "calls", run), self.counter(self.node, "inflight", run)

        self.assertTrue(poll(lambda: counters() == (n, 0), 2.0), counters())
        r = self.c.admin("GET", "/admin/v1/runs/" + quote(run, safe=""))
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.body["usage"], {"calls": n, "inFlight": 0, "fetchedBytes": 0})

    # --- 3: the concurrency quota, exact across instances ---

    def test_3_concurrency_exact_across_instances(self):
        k = 3
        run = "run-conc"
        tok = self.a.mint_ok(run, CAPS, quotas={"concurrent": k, "calls": 1000})
        tag = "conc-%d" % time.monotonic_ns()
        answers, lock = [], threading.Lock()
        per_instance = 3
        go = threading.Barrier(per_instance * 3)

        def slow(br):
            go.wait(10)
            r = br.rpc(tok, "http.fetch", {"url": "%s/slow?%s" % (self.up.url, tag)}, timeout=15)
            with lock:
                answers.append(r)

        threads = [threading.Thread(target=slow, args=(br,)) for br in self.all for _ in range(per_instance)]
        for t in threads:
            t.start()
        seen = []  # the in-flight counter while the calls are held
        while any(t.is_alive() for t in threads):
            seen.append(self.counter(self.node, "inflight", run) or 0)
            time.sleep(0.02)
        for t in threads:
            t.join()
        ok = [r for r in answers if r.status == 200]
        for r in ok:
            self.assertIs(r.body.get("ok"), True, r)
        for r in answers:
            if r.status != 200:
                self.assertError(r, 429, "rate_limited", CONCURRENT_MSG)
        sys.stderr.write("concurrent %d: %d of %d slow calls granted, upstream peak %d, counter peak %d\n" % (
            k, len(ok), len(answers), self.up.peak.get(tag, 0), max(seen)))
        self.assertEqual(len(answers), per_instance * 3)
        self.assertGreaterEqual(len(ok), 1)
        self.assertLessEqual(len(ok), k)
        self.assertLessEqual(self.up.peak.get(tag, 0), k)
        self.assertEqual(self.up.seen.get(tag, 0), len(ok))
        self.assertLessEqual(max(seen), k, seen)
        time.sleep(0.5)
        self.assertTrue(poll(lambda: self.counter(self.node, "inflight", run) == 0, 2.0),
                        self.counter(self.node, "inflight", run))
        # and the slots can all be used again, from anywhere
        for br in self.all:
            self.works(br, tok)

    # --- 4: the invalidation link cut ---

    def test_4_invalidation_link_killed(self):
        tok = self.a.mint_ok("run-inv", CAPS, quotas={"calls": BIG})
        self.cache_everywhere(tok, (self.c,), n=8)
        inv = links_of(self.node, self.b, INV_NAME)
        data = links_of(self.node, self.b, DATA_NAME)
        self.assertEqual(len(inv), THREADS, client_list(self.node))
        self.assertEqual(len(data), THREADS, client_list(self.node))
        inv_ids = {c["id"] for c in inv}
        for c in inv:
            self.assertEqual((c["sub"], "P" in c["flags"]), ("1", True), c)
        # every data link tracks the token keys (BCAST) into one of its own worker's invalidation links
        self.assertEqual({c["redir"] for c in data}, inv_ids, data)
        for c in data:
            self.assertTrue("t" in c["flags"] and "B" in c["flags"], c)

        # one of B's workers holds the token with leased calls (C does not call it meanwhile, so the
        # run's counter is that worker's); the other has it cached too, in practice
        conn = KeepAlive(self.b)
        self.addCleanup(conn.close)
        self.lease_up(conn, tok, "run-inv")
        self.cache_everywhere(tok, (self.b,), n=4)
        for i in inv_ids:
            self.assertEqual(self.node.cmd("CLIENT", "KILL", "ID", i), 1)
        r = self.a.revoke_token(tok)
        self.assertEqual(r.status, 204, r)
        t_rev = time.monotonic()
        # from the moment the revocation returned, B (with its cache and no invalidation link) never grants
        answers = []
        while time.monotonic() - t_rev < 1.5:
            for r in (conn.call(tok), call(self.b, tok)):
                answers.append(self.assertOutcome(r, ("revoked", "unavailable"),
                                                  "B, its invalidation links killed, after the revocation"))
        sys.stderr.write("B after its invalidation links were killed: %d unavailable, %d refused in 1.5 s\n" % (
            answers.count("unavailable"), answers.count("revoked")))
        self.assertTrue(self.settled(self.b, tok, "revoked"), self.b.log()[-3000:])
        # C's links were not touched: the invalidation reached it
        self.assertTrue(self.settled(self.c, tok, "revoked"), self.c.log()[-3000:])

        # B is back: a fresh token works on it, through new invalidation links it tracks into again
        # (test_4_recovery_within_a_second holds B to the 1 s bound)
        fresh = self.a.mint_ok("run-inv-fresh", CAPS)
        self.assertTrue(self.settled(self.b, fresh, "granted", 8), self.b.log()[-3000:])
        back = [c for c in links_of(self.node, self.b, INV_NAME) if c["id"] not in inv_ids]
        self.assertEqual(len(back), THREADS, client_list(self.node))
        self.assertEqual({c["redir"] for c in links_of(self.node, self.b, DATA_NAME)}, {c["id"] for c in back})
        self.assertTrue(self.b.alive())

    def test_4_recovery_within_a_second(self):
        fresh = self.a.mint_ok("run-inv-2", CAPS)
        self.cache_everywhere(fresh, (self.b,), n=8)
        inv_ids = {c["id"] for c in links_of(self.node, self.b, INV_NAME)}
        self.assertEqual(len(inv_ids), THREADS, client_list(self.node))
        t_kill = time.monotonic()
        for i in inv_ids:
            self.assertEqual(self.node.cmd("CLIENT", "KILL", "ID", i), 1)
        seen = []

        def back():
            o = self.assertOutcome(call(self.b, fresh), ("granted", "unavailable"), "B while its links come back")
            seen.append(o)
            return o == "granted" and self.settled(self.b, fresh, "granted", 8)

        self.assertTrue(poll(back, 1.0, interval=0.01), "B still refused %.2f s after the kill (%s):\n%s" % (
            time.monotonic() - t_kill, seen[-5:], self.b.log()[-3000:]))
        sys.stderr.write("B granted again %.0f ms after its invalidation links were killed (%d unavailable first)\n" % (
            (time.monotonic() - t_kill) * 1e3, seen.count("unavailable")))


class RedisRestart(CacheBase):
    """Redis (appendonly, fsync always: tokens survive) killed and restarted under load on A, B, C."""

    def setUp(self):
        self.node = redisfix.Node(persist=True).start()
        self.addCleanup(self.node.cleanup)
        self.brokers = start_three(self.node.url)
        self.addCleanup(self.stop_brokers)
        for br in self.brokers:
            self.warm(br)

    def stop_brokers(self):
        errors = stop_all(self.brokers)
        if errors:
            self.fail("\n".join(errors))

    def test_5_restart_under_load(self):
        a = self.brokers[0]
        live = a.mint_ok("run-live", CAPS, quotas={"calls": 1000000, "concurrent": 64})
        dead = a.mint_ok("run-dead", CAPS)
        late = a.mint_ok("run-late", CAPS)
        for tok in (live, dead, late):
            self.cache_everywhere(tok, self.brokers, n=4)
        self.assertEqual(a.revoke_token(dead).status, 204)
        for br in self.brokers:
            self.assertTrue(poll(lambda: self.settled(br, dead, "revoked"), 1.0))

        answers, lock, stop = [], threading.Lock(), threading.Event()  # (which, sent, received, outcome, resp)

        def load(br):
            i = 0
            while not stop.is_set():
                which, tok = (("live", live), ("dead", dead), ("late", late))[i % 3]
                i += 1
                sent = time.monotonic()
                try:
                    r = call(br, tok, timeout=5)
                    o = outcome(r)
                except OSError as e:
                    r, o = repr(e), None
                with lock:
                    answers.append((which, sent, time.monotonic(), o, r))

        threads = [threading.Thread(target=load, args=(br,), daemon=True) for br in self.brokers for _ in range(2)]
        for t in threads:
            t.start()
        try:
            time.sleep(0.3)
            t_kill = time.monotonic()
            self.node.kill()
            time.sleep(0.2)
            self.node.start()
            # revoke `late` as soon as A can, while B and C may still be reconnecting
            t_rev = None
            deadline = time.monotonic() + 10.0
            while t_rev is None and time.monotonic() < deadline:
                r = a.revoke_token(late)
                if r.status == 204:
                    t_rev = time.monotonic()
                else:
                    self.assertError(r, 503, "unavailable", ADMIN_UNAVAILABLE_MSG)
                    time.sleep(0.01)
            self.assertIsNotNone(t_rev, "A could not revoke within 10 s of Redis coming back:\n" + a.log()[-3000:])

            def recovered():
                return all(self.settled(br, live, "granted") for br in self.brokers)

            self.assertTrue(poll(recovered, 10.0, interval=0.05), "no recovery within 10 s:\n" +
                            "\n".join(br.log()[-1500:] for br in self.brokers))
            sys.stderr.write("Redis restart: revoked again %.0f ms after the kill\n" % ((t_rev - t_kill) * 1e3))
            time.sleep(0.2)
        finally:
            stop.set()
            for t in threads:
                t.join(10)

        # a lease or slot update lost with the connection may answer with the quota path's message
        down = ("unavailable", "quota_unavailable")
        bad = []
        for which, sent, recv, o, r in answers:
            if which == "live":
                ok = ("granted",) + down
            elif which == "dead" or sent >= t_rev:
                ok = ("revoked",) + down
            else:
                ok = ("granted", "revoked") + down
            if o not in ok:
                bad.append((which, round(sent - t_kill, 3), o, r))
        during = [x for x in answers if x[1] >= t_kill]
        last_down = max([x[2] for x in during if x[3] in down] or [t_kill])
        sys.stderr.write("Redis restart: %d answers from the kill on, %d unavailable, the last %.0f ms after it\n" % (
            len(during), sum(1 for x in during if x[3] in down), (last_down - t_kill) * 1e3))
        self.assertEqual(bad[:5], [], "%d wrong answers of %d" % (len(bad), len(answers)))
        self.assertGreater(len([x for x in answers if x[1] >= t_rev]), 0)
        for br in self.brokers:
            self.refused(br, dead)
            self.refused(br, late)
            self.works(br, live)


if __name__ == "__main__":
    sbtest.main()

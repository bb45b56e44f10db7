#!/usr/bin/python3
"""The decider (PROTOCOL.md section 5a), with a real decider server on loopback (decidefix.Decider).

A run's manifest holds files.write (and, for http.fetch, POSTs to one upstream) for
the decider. Each test checks the exact outcome the guest sees, what the decider
was sent, and, through the disk or the upstream, that nothing a rule holds ran
before an allow: the decider allows, denies with and without a reason, answers
slowly (within and past its deadline), never answers, answers garbage (one case
per malformation), is down, and restarts. Also: calls no rule names never reach
it; the run's remaining time caps the wait; held calls take a concurrency slot;
the pending bound answers rate_limited; decision reuse (off by default); no
decider configured; the configuration's validation; metrics, log and audit.
"""

import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decidefix  # noqa: E402
import sbtest  # noqa: E402
from sbtest import poll  # noqa: E402

TIMEOUT_MS = 1000
SECRET = "decider-bearer-secret-0123456789"
CAPS = {"files": {"read": ["**"], "write": ["**"]}, "decide": {"methods": ["files.write"]}}
DENIED = "the decider denied files.write"
NOT_ALLOWED = "the decider did not allow files.write: "


class Upstream:
    """A plain HTTP server for http.fetch that records what reaches it."""

    def __init__(self):
        self.hits = []
        up = self

        class H(BaseHTTPRequestHandler):
            def do_any(self):
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n) if n else b""
                up.hits.append((self.command, self.path, body))
                if self.path == "/redirect":
                    # 307 keeps the method and the body (RFC 9110 section 15.4.8)
                    self.send_response(307)
                    self.send_header("Location", "/v1/charges")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = do_any

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def config(base, decider, audit=None, **extra):
    c = {
        "targets": {"app": {"files": {"root": os.path.join(base, "{tenantId}")}}},
        "quota_calls": 100000,
        "quota_concurrent": 64,
        "egress": {"allow_cidrs": ["127.0.0.1/32"], "deny_local_interfaces": False},
    }
    if decider is not None:
        c["decider"] = decider
    if audit is not None:
        c["audit"] = audit
    c.update(extra)
    return c


class DecideCase(sbtest.BrokerTestCase):
    decider_extra = {}
    threads = "2"

    @classmethod
    def setUpClass(cls):
        cls.base = tempfile.mkdtemp(prefix="sbdecide-")
        os.mkdir(os.path.join(cls.base, "t1"))
        cls.secret_file = os.path.join(cls.base, "decider.secret")
        with open(cls.secret_file, "w") as f:
            f.write(SECRET + "\n")
        cls.audit = os.path.join(cls.base, "audit.log")
        cls.d = decidefix.Decider().start()
        cls.up = Upstream()
        dconf = {"url": cls.d.url, "secret_file": cls.secret_file, "timeout_ms": TIMEOUT_MS}
        dconf.update(cls.decider_extra)
        try:
            cls.b = sbtest.Broker(config=config(cls.base, dconf, audit=cls.audit),
                                  env={"SANDBOX_BROKER_THREADS": cls.threads}).start()
        except Exception:
            cls.d.stop()
            cls.up.close()
            shutil.rmtree(cls.base, ignore_errors=True)
            raise
        cls.n = 0

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        rc = cls.b.stop()
        log = cls.b.log()
        cls.up.close()
        shutil.rmtree(cls.base, ignore_errors=True)
        if rc != 0:
            raise AssertionError("broker exited with %s:\n%s" % (rc, log[-4000:]))

    def setUp(self):
        if self.d.sock is None:
            self.d.start()
        self.d.reset()

    def token(self, caps=CAPS, **fields):
        type(self).n += 1
        self.run_id = "run-%s-%d" % (self._testMethodName[:40], self.n)
        return self.b.mint_ok(self.run_id, caps, target="app", scope={"tenantId": "t1"}, **fields)

    def path(self, name):
        return os.path.join(self.base, "t1", name)

    def write(self, tok, name, data=b"x", timeout=10.0):
        return self.b.rpc(tok, "files.write", {"path": name, "contentBase64": base64.b64encode(data).decode()}, timeout=timeout)

    def assertNotWritten(self, name):
        self.assertFalse(os.path.exists(self.path(name)), name + " must not have been written")

    def assertWritten(self, name, data=b"x"):
        with open(self.path(name), "rb") as f:
            self.assertEqual(f.read(), data)

    def decide_lines(self):
        return [ev for ev in self.b.events() if ev.get("event") == "decide"]


class Outcomes(DecideCase):
    def test_allow(self):
        tok = self.token()
        r = self.write(tok, "allowed.txt", b"hello")
        self.assertEqual(r.status, 200, r)
        self.assertWritten("allowed.txt", b"hello")
        reqs = self.d.wait_requests(1)
        self.assertEqual(len(reqs), 1)
        q = reqs[0]
        self.assertEqual(q["method"], "POST")
        self.assertEqual(q["path"], "/decide")
        self.assertEqual(q["headers"].get("authorization"), "Bearer " + SECRET)
        self.assertEqual(q["headers"].get("content-type"), "application/json")
        body = q["body"]
        self.assertEqual(set(body), {"v", "id", "runId", "target", "method", "deadlineMs", "args"}, body)
        self.assertEqual(body["v"], 1)
        self.assertEqual(body["runId"], self.run_id)
        self.assertEqual(body["target"], "app")
        self.assertEqual(body["method"], "files.write")
        self.assertEqual(body["args"], {"path": "allowed.txt", "bytes": 5})
        self.assertTrue(0 < body["deadlineMs"] <= TIMEOUT_MS, body)
        # never the token, never the content
        self.assertNotIn(tok.encode(), q["raw"])
        self.assertNotIn(base64.b64encode(b"hello"), q["raw"])
        self.assertNotIn(b"hello", q["raw"])

    def test_deny_with_reason(self):
        self.d.reset("deny", reason="writes need a reviewer \u2014 ticket 42")
        tok = self.token()
        r = self.write(tok, "denied.txt")
        self.assertError(r, 403, "forbidden", DENIED + ": writes need a reviewer \u2014 ticket 42")
        self.assertEqual(self.d.count(), 1)
        self.assertNotWritten("denied.txt")

    def test_deny_without_reason(self):
        self.d.reset("deny")
        r = self.write(self.token(), "denied2.txt")
        self.assertError(r, 403, "forbidden", DENIED)
        self.assertNotWritten("denied2.txt")

    def test_slow_within_deadline(self):
        self.d.reset("slow", delay=0.3)
        r = self.write(self.token(), "slow-ok.txt")
        self.assertEqual(r.status, 200, r)
        self.assertWritten("slow-ok.txt")

    def test_slow_past_deadline(self):
        # the decider allows, but after the deadline: refused, and the late allow changes nothing
        self.d.reset("slow", delay=TIMEOUT_MS / 1000.0 + 0.5)
        r = self.write(self.token(), "slow-late.txt")
        self.assertError(r, 403, "forbidden", NOT_ALLOWED + "no answer within %d ms" % TIMEOUT_MS)
        self.assertEqual(self.d.count(), 1)
        time.sleep(0.8)
        self.assertNotWritten("slow-late.txt")

    def test_never_answers(self):
        self.d.reset("never")
        t0 = time.monotonic()
        r = self.write(self.token(), "never.txt")
        self.assertError(r, 403, "forbidden", NOT_ALLOWED + "no answer within %d ms" % TIMEOUT_MS)
        self.assertGreaterEqual(time.monotonic() - t0, TIMEOUT_MS / 1000.0 - 0.05)
        self.assertNotWritten("never.txt")

    def test_garbage(self):
        big = b'{"v":1,"decision":"allow","reason":"' + b"x" * 5000 + b'"}'
        cases = [
            ((200, b"allow"), "malformed answer: the answer is not valid JSON"),
            ((200, b""), "malformed answer: the answer is empty"),
            ((200, b"[]"), "malformed answer: the answer is not a JSON object"),
            ((200, b"{}"), "malformed answer: the answer's \"v\" is not 1"),
            ((200, b'{"v":2,"decision":"allow"}'), "malformed answer: the answer's \"v\" is not 1"),
            ((200, b'{"v":"1","decision":"allow"}'), "malformed answer: the answer's \"v\" is not 1"),
            ((200, b'{"v":1}'), "malformed answer: the answer's \"decision\" is not \"allow\" or \"deny\""),
            ((200, b'{"v":1,"decision":"ALLOW"}'), "malformed answer: the answer's \"decision\" is not \"allow\" or \"deny\""),
            ((200, b'{"v":1,"decision":true}'), "malformed answer: the answer's \"decision\" is not \"allow\" or \"deny\""),
            ((200, b'{"v":1,"decision":"allow","allow":true}'), "malformed answer: the answer has an unknown key"),
            ((200, b'{"v":1,"decision":"deny","decision":"allow"}'), "malformed answer: the answer is not valid JSON"),
            ((200, b'{"v":1,"decision":"allow"} {}'), "malformed answer: the answer is not valid JSON"),
            ((200, b'{"v":1,"decision":"deny","reason":1}'), "malformed answer: the answer's \"reason\" is not a string"),
            ((200, b'{"v":1,"decision":"deny","reason":"' + b"r" * 257 + b'"}'),
             "malformed answer: the answer's \"reason\" is longer than 256 bytes"),
            ((200, b'{"v":1,"decision":"deny","reason":"a\\nb"}'),
             "malformed answer: the answer's \"reason\" has a control character"),
            ((200, b'{"v":1,"decision":"allow","reason":"\xff"}'), "malformed answer: the answer is not valid JSON"),
            ((500, b'{"v":1,"decision":"allow"}'), "the decider answered HTTP 500"),
            ((204, b""), "the decider answered HTTP 204"),
            ((302, b'{"v":1,"decision":"allow"}'), "the decider answered HTTP 302"),
        ]
        tok = self.token()
        for i, ((status, body), why) in enumerate(cases):
            with self.subTest(body=body[:60], status=status):
                self.d.reset(("raw", status, body, {"Content-Type": "application/json"}))
                r = self.write(tok, "garbage-%d.txt" % i)
                self.assertError(r, 403, "forbidden", NOT_ALLOWED + why)
                self.assertNotWritten("garbage-%d.txt" % i)
        # an answer above the body cap, and a content coding nobody asked for
        self.d.reset(("raw", 200, big, {"Content-Type": "application/json"}))
        r = self.write(tok, "garbage-big.txt")
        self.assertEqual(r.status, 403, r)
        self.assertTrue(r.body["error"]["message"].startswith(NOT_ALLOWED + "the exchange with the decider failed ("), r)
        self.assertNotWritten("garbage-big.txt")
        # not HTTP at all, an HTTP/1.1 head cut short, a 101
        for i, data in enumerate([b"NOT HTTP AT ALL\r\n\r\n{\"v\":1,\"decision\":\"allow\"}",
                                  b"HTTP/1.1 200 OK\r\nContent-Length: 26\r\n", b"HTTP/1.1 101 Switching\r\n\r\n"]):
            with self.subTest(data=data):
                self.d.reset(("bytes", data))
                r = self.write(tok, "garbage-bytes-%d.txt" % i)
                self.assertEqual(r.status, 403, r)
                self.assertTrue(r.body["error"]["message"].startswith(NOT_ALLOWED + "the exchange with the decider failed ("), r)
                self.assertNotWritten("garbage-bytes-%d.txt" % i)
        self.d.reset(("raw", 200, b'{"v":1,"decision":"allow"}', {"Content-Encoding": "gzip"}))
        r = self.write(tok, "garbage-gzip.txt")
        self.assertError(r, 403, "forbidden", NOT_ALLOWED + "malformed answer: a Content-Encoding was not asked for")
        self.assertNotWritten("garbage-gzip.txt")

    def test_down_then_restarted(self):
        tok = self.token()
        self.d.stop()
        r = self.write(tok, "down.txt")
        self.assertEqual(r.status, 403, r)
        self.assertEqual(r.body["error"]["code"], "forbidden")
        self.assertTrue(r.body["error"]["message"].startswith(NOT_ALLOWED + "the exchange with the decider failed ("), r)
        self.assertNotWritten("down.txt")
        # the same address comes back: the next call is decided, nothing to reset in the broker
        self.d.start()
        self.d.reset("allow")
        r = self.write(tok, "back.txt")
        self.assertEqual(r.status, 200, r)
        self.assertWritten("back.txt")

    def test_restart_while_held(self):
        # the decider dies with the call held (never answered): refused at once, not at the deadline
        self.d.reset("never")
        tok = self.token()
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", self.write(tok, "held.txt")))
        t.start()
        self.d.wait_requests(1)
        t0 = time.monotonic()
        self.d.stop()
        t.join(10)
        self.assertLess(time.monotonic() - t0, TIMEOUT_MS / 1000.0)
        r = out["r"]
        self.assertEqual(r.status, 403, r)
        self.assertTrue(r.body["error"]["message"].startswith(NOT_ALLOWED + "the exchange with the decider failed ("), r)
        self.assertNotWritten("held.txt")
        self.d.start()
        self.d.reset("allow")
        self.assertEqual(self.write(tok, "held.txt").status, 200)
        self.assertWritten("held.txt")

    def test_no_rule_no_decider(self):
        # files.read matches no rule: the decider never hears of it
        with open(self.path("plain.txt"), "wb") as f:
            f.write(b"p")
        tok = self.token()
        r = self.b.rpc(tok, "files.read", {"path": "plain.txt"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.d.count(), 0)
        # a manifest without decide rules: files.write runs with no decider at all
        r = self.write(self.token({"files": {"write": ["**"]}}), "free.txt")
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.d.count(), 0)

    def test_refused_before_the_decider(self):
        # what the manifest refuses is refused without asking: a rule never widens a grant
        tok = self.token({"files": {"write": ["only/**"]}, "decide": {"methods": ["files.write"]}})
        r = self.write(tok, "outside.txt")
        self.assertError(r, 403, "forbidden", "files.write path is not in the write scope")
        # a malformed call is refused with its own error, not described
        r = self.b.rpc(tok, "files.write", {"path": "only/x.txt", "content": "a", "contentBase64": "YQ=="})
        self.assertError(r, 400, "bad_args")
        self.assertEqual(self.d.count(), 0)

    def test_nothing_runs_before_the_allow(self):
        # held for 0.6 s: the file appears only after the decider allowed it
        self.d.reset("slow", delay=0.6)
        tok = self.token()
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", self.write(tok, "later.txt")))
        t.start()
        self.d.wait_requests(1)
        time.sleep(0.3)
        self.assertNotWritten("later.txt")
        t.join(10)
        self.assertEqual(out["r"].status, 200, out["r"])
        self.assertWritten("later.txt")

    def test_held_call_takes_a_concurrency_slot(self):
        self.d.reset("never")
        tok = self.token(quotas={"concurrent": 1})
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", self.write(tok, "slot1.txt")))
        t.start()
        self.d.wait_requests(1)
        r = self.b.rpc(tok, "files.read", {"path": "x"})
        self.assertError(r, 429, "rate_limited", "run quota exceeded: concurrent calls per run")
        t.join(10)
        self.assertEqual(out["r"].status, 403)

    def test_run_time_caps_the_wait(self):
        self.d.reset("never")
        tok = self.token(ttlMs=1000)
        # spend part of the run's life first
        time.sleep(0.5)
        t0 = time.monotonic()
        r = self.write(tok, "late-run.txt")
        took = time.monotonic() - t0
        self.assertEqual(r.status, 403, r)
        msg = r.body["error"]["message"]
        self.assertTrue(msg.startswith(NOT_ALLOWED + "no answer within "), msg)
        waited = int(msg[len(NOT_ALLOWED + "no answer within "):].split()[0])
        self.assertLess(waited, 600, msg)
        self.assertLess(took, TIMEOUT_MS / 1000.0)
        self.assertLessEqual(self.d.requests[0]["body"]["deadlineMs"], 600)
        self.assertNotWritten("late-run.txt")

    def test_fetch_rule(self):
        url = "http://127.0.0.1:%d/v1/charges?amount=5" % self.up.port
        caps = {"net": ["127.0.0.1:%d" % self.up.port],
                "decide": {"fetch": [{"host": "127.0.0.1:%d" % self.up.port, "methods": ["POST"], "paths": ["/v1/**"]}]}}
        tok = self.token(caps)
        self.d.reset("deny", reason="no payments today")
        hits = len(self.up.hits)
        r = self.b.rpc(tok, "http.fetch", {"url": url, "method": "POST", "body": "charge-body-text",
                                           "headers": {"authorization": "Bearer upstream-credential", "x-trace": "t"}})
        self.assertError(r, 403, "forbidden", "the decider denied http.fetch: no payments today")
        self.assertEqual(len(self.up.hits), hits, "the upstream must not have been contacted")
        q = self.d.requests[0]
        self.assertEqual(q["body"]["args"], {"url": url, "method": "POST", "headers": ["authorization", "x-trace"],
                                             "bodyBytes": 16})
        self.assertNotIn(b"upstream-credential", q["raw"])
        self.assertNotIn(b"charge-body-text", q["raw"])
        # allowed: it runs
        self.d.reset("allow")
        r = self.b.rpc(tok, "http.fetch", {"url": url, "method": "POST", "body": "charge-body-text"})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(len(self.up.hits), hits + 1)
        # a GET is not held
        self.d.reset("deny")
        r = self.b.rpc(tok, "http.fetch", {"url": url})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(self.d.count(), 0)
        # a POST no rule names, redirected (307) to one a rule names: refused, never sent there undecided
        hits = len(self.up.hits)
        r = self.b.rpc(tok, "http.fetch", {"url": "http://127.0.0.1:%d/redirect" % self.up.port, "method": "POST", "body": "b"})
        # decided during the fetch, like a redirect leaving net (PROTOCOL.md section 6a): execution_error, the reason logged
        self.assertError(r, 500, "execution_error", "sandbox binding operation failed")
        cid = r.body["error"]["correlationId"]
        why = "http.fetch redirect to host \"127.0.0.1:%d\" matches a decide rule (redirects are not sent to the decider)" % self.up.port
        ev = poll(lambda: [e for e in self.b.events() if e.get("event") == "egress.failed" and e.get("cid") == cid], 5)
        self.assertEqual([e.get("reason") for e in ev], [why])
        self.assertEqual([h[1] for h in self.up.hits[hits:]], ["/redirect"])
        self.assertEqual(self.d.count(), 0)

    def test_collection_description(self):
        # no database: the call is described (where and field names), then the target answers not_implemented
        tok = self.token({"data": {"collections": {"posts": ["read", "delete", "update"]}},
                          "decide": {"methods": ["collections.*.delete", "collections.posts.update"]}})
        r = self.b.rpc(tok, "collections.posts.delete", {"where": {"id": 7, "or": [{"title": {"like": "a%"}}, {"views": {"gt": 3}}]}})
        self.assertError(r, 501, "not_implemented")
        self.assertEqual(self.d.requests[-1]["body"]["args"],
                         {"collection": "posts", "where": {"id": 7, "or": [{"title": {"like": "a%"}}, {"views": {"gt": 3}}]}})
        r = self.b.rpc(tok, "collections.posts.update", {"where": {"id": 1}, "data": {"title": "secret title", "views": 2}})
        self.assertEqual(self.d.requests[-1]["body"]["args"], {"collection": "posts", "where": {"id": 1}, "fields": ["title", "views"]})
        self.assertNotIn(b"secret title", self.d.requests[-1]["raw"])
        # a where too large to describe is left out, and named
        big = {"title": {"in": ["v" * 200] * 100}}
        r = self.b.rpc(tok, "collections.posts.delete", {"where": big})
        body = self.d.requests[-1]["body"]
        self.assertEqual(body["args"], {"collection": "posts"})
        self.assertEqual(body["omitted"], ["where"])

    def test_observability(self):
        self.d.reset("deny", reason="nope")
        tok = self.token()
        self.write(tok, "obs.txt")
        line = poll(lambda: [ev for ev in self.decide_lines() if ev.get("runId") == self.run_id], 5)
        self.assertTrue(line, self.b.log()[-2000:])
        ev = line[0]
        self.assertEqual((ev["outcome"], ev["method"], ev["reason"]), ("deny", "files.write", "nope"))
        self.assertNotIn(tok, self.b.log())
        self.assertNotIn(SECRET, self.b.log())
        m = self.b.admin("GET", "/metrics").raw.decode()
        self.assertRegex(m, r'sb_decisions_total\{outcome="deny"\} [1-9]')
        self.assertIn("sb_decision_duration_seconds_count", m)
        self.assertIn("sb_decisions_pending 0", m)

        def audited():
            if not os.path.exists(self.audit):
                return None
            with open(self.audit) as f:
                return [json.loads(x) for x in f if self.run_id in x]
        lines = poll(audited, 5)
        self.assertTrue(lines)
        self.assertEqual((lines[0]["decision"], lines[0]["decider"], lines[0]["code"]), ("allow", "deny", "forbidden"))
        self.assertIn("deciderUs", lines[0])


class Pending(DecideCase):
    decider_extra = {"max_pending": 2}

    def test_bound(self):
        self.d.reset("never")
        tok = self.token()
        outs = []
        threads = [threading.Thread(target=lambda i=i: outs.append(self.write(tok, "p%d.txt" % i))) for i in range(2)]
        for t in threads:
            t.start()
        self.d.wait_requests(2)
        r = self.write(tok, "p-over.txt")
        self.assertError(r, 429, "rate_limited", NOT_ALLOWED + "too many calls are waiting for a decision")
        self.assertEqual(self.d.count(), 2, "nothing sent past the bound")
        for t in threads:
            t.join(10)
        self.assertEqual([o.status for o in outs], [403, 403])
        # the bound frees as decisions end
        self.d.reset("allow")
        self.assertEqual(self.write(tok, "p-after.txt").status, 200)
        m = self.b.admin("GET", "/metrics").raw.decode()
        self.assertRegex(m, r'sb_decisions_total\{outcome="overload"\} 1\b')


class Reuse(DecideCase):
    decider_extra = {"reuse_ms": 60000}
    threads = "1"  # answers are kept per worker

    def test_identical_calls_reuse(self):
        tok = self.token()
        self.d.reset("deny", reason="once is enough")
        for _ in range(3):
            self.assertError(self.write(tok, "same.txt"), 403, "forbidden", DENIED + ": once is enough")
        self.assertEqual(self.d.count(), 1)
        # another call (other args), another run: asked again
        self.assertEqual(self.write(tok, "other.txt").status, 403)
        self.assertEqual(self.d.count(), 2)
        self.assertEqual(self.write(self.token(), "same.txt").status, 403)
        self.assertEqual(self.d.count(), 3)
        # a failure is never reused
        self.d.reset(("raw", 500, b"", {}))
        tok2 = self.token()
        self.assertEqual(self.write(tok2, "f.txt").status, 403)
        self.d.reset("allow")
        self.assertEqual(self.write(tok2, "f.txt").status, 200)
        self.assertEqual(self.d.count(), 1)
        m = self.b.admin("GET", "/metrics").raw.decode()
        self.assertRegex(m, r"sb_decisions_reused_total [1-9]")

    def test_a_call_described_in_part_is_never_reused(self):
        """Two calls whose wheres are both too large to describe look alike to the decider: the answer to one is
        never taken for the other (nor for itself again), so that an approval of what the decider did not see
        cannot cover a different call."""
        tok = self.token({"data": {"collections": {"posts": ["read", "delete"]}},
                          "decide": {"methods": ["collections.*.delete"]}})
        self.d.reset("allow")
        for v in ("a", "b", "a"):
            r = self.b.rpc(tok, "collections.posts.delete", {"where": {"title": {"in": [v * 200] * 100}}})
            self.assertError(r, 501, "not_implemented")
            self.assertEqual(self.d.requests[-1]["body"]["omitted"], ["where"])
        self.assertEqual(self.d.count(), 3)
        # a where that fits is still reused
        for _ in range(2):
            self.assertError(self.b.rpc(tok, "collections.posts.delete", {"where": {"id": 1}}), 501, "not_implemented")
        self.assertEqual(self.d.count(), 4)


class NoReuseByDefault(DecideCase):
    threads = "1"
    def test_asked_every_time(self):
        tok = self.token()
        for _ in range(3):
            self.assertEqual(self.write(tok, "again.txt").status, 200)
        self.assertEqual(self.d.count(), 3)


class NoDecider(sbtest.BrokerTestCase):
    def test_refused(self):
        base = tempfile.mkdtemp(prefix="sbdecide-none-")
        os.mkdir(os.path.join(base, "t1"))
        try:
            with sbtest.Broker(config=config(base, None)) as b:
                tok = b.mint_ok("run-nd", CAPS, target="app", scope={"tenantId": "t1"})
                r = b.rpc(tok, "files.write", {"path": "n.txt", "content": "x"})
                self.assertError(r, 403, "forbidden", NOT_ALLOWED + "no decider is configured")
                self.assertFalse(os.path.exists(os.path.join(base, "t1", "n.txt")))
        finally:
            shutil.rmtree(base, ignore_errors=True)


class ExampleDecider(sbtest.BrokerTestCase):
    """deploy/decider/decider.py with deploy/decider/rules.example.json, in front of a real broker."""

    def start_example(self, port, secret_file, rules=None):
        script = os.path.join(sbtest.SOURCE_DIR, "deploy", "decider", "decider.py")
        rules = rules or os.path.join(sbtest.SOURCE_DIR, "deploy", "decider", "rules.example.json")
        p = subprocess.Popen([sys.executable, script, "--listen", "127.0.0.1:%d" % port, "--rules", rules,
                              "--secret-file", secret_file], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = json.loads(p.stdout.readline())
        self.assertEqual(first["event"], "listening")
        return p

    def test_example(self):
        base = tempfile.mkdtemp(prefix="sbdecide-example-")
        os.mkdir(os.path.join(base, "t1"))
        secret_file = os.path.join(base, "secret")
        with open(secret_file, "w") as f:
            f.write(SECRET + "\n")
        wrong_file = os.path.join(base, "wrong")
        with open(wrong_file, "w") as f:
            f.write("another-secret\n")
        port = sbtest.free_port()
        p = self.start_example(port, secret_file)
        try:
            url = "http://127.0.0.1:%d/" % port
            caps = {"files": {"write": ["**"]}, "data": {"collections": {"posts": ["delete"], "notes": ["delete"]}},
                    "decide": {"methods": ["files.write", "collections.*.delete"]}}
            with sbtest.Broker(config=config(base, {"url": url, "secret_file": secret_file})) as b:
                tok = b.mint_ok("run-example", caps, target="app", scope={"tenantId": "t1"})
                r = b.rpc(tok, "files.write", {"path": "e.txt", "content": "x"})
                self.assertError(r, 403, "forbidden", DENIED + ": writes are reviewed by a person")
                self.assertFalse(os.path.exists(os.path.join(base, "t1", "e.txt")))
                r = b.rpc(tok, "collections.posts.delete", {"where": {"id": 1}})
                self.assertError(r, 403, "forbidden", "the decider denied collections.posts.delete: posts are deleted by a person")
                # allowed: the target (no database here) answers not_implemented, so the call went past the decider
                r = b.rpc(tok, "collections.notes.delete", {"where": {"id": 1}})
                self.assertError(r, 501, "not_implemented")
                # what the decider cannot see (a where too large to describe) it does not allow
                r = b.rpc(tok, "collections.notes.delete", {"where": {"title": {"in": ["v" * 200] * 100}}})
                self.assertError(r, 403, "forbidden", "the decider denied collections.notes.delete: no rule allows this call")
            with sbtest.Broker(config=config(base, {"url": url, "secret_file": wrong_file})) as b:
                tok = b.mint_ok("run-example-2", caps, target="app", scope={"tenantId": "t1"})
                r = b.rpc(tok, "collections.notes.delete", {"where": {"id": 1}})
                self.assertError(r, 403, "forbidden",
                                 "the decider did not allow collections.notes.delete: the decider answered HTTP 401")
        finally:
            p.terminate()
            out = p.communicate(timeout=10)[0].decode()
            shutil.rmtree(base, ignore_errors=True)
        lines = [json.loads(x) for x in out.splitlines() if x.strip()]
        decisions = [(x["method"], x["decision"]) for x in lines if x.get("event") == "decision"]
        self.assertEqual(decisions, [("files.write", "deny"), ("collections.posts.delete", "deny"),
                                     ("collections.notes.delete", "allow"), ("collections.notes.delete", "deny")])
        self.assertTrue(any(x.get("event") == "refused" for x in lines), out)
        self.assertNotIn(SECRET, out)


    def test_long_reason_is_cut_between_characters(self):
        """A rule's reason longer than the broker takes (256 bytes) reaches the guest cut at a character
        boundary: the call is denied with the reason, not failed as a malformed answer."""
        base = tempfile.mkdtemp(prefix="sbdecide-example-")
        secret_file = os.path.join(base, "secret")
        with open(secret_file, "w") as f:
            f.write(SECRET + "\n")
        reason = "\u00e9" * 127 + "\u20ac" * 10  # 254 bytes, then 3-byte characters: the 256-byte cut is inside one
        rules = os.path.join(base, "rules.json")
        with open(rules, "w") as f:
            json.dump({"rules": [{"method": "files.write", "decision": "deny", "reason": reason}],
                       "default": {"decision": "deny"}}, f)
        port = sbtest.free_port()
        p = self.start_example(port, secret_file, rules)
        try:
            with sbtest.Broker(config=config(base, {"url": "http://127.0.0.1:%d/" % port,
                                                   "secret_file": secret_file})) as b:
                tok = b.mint_ok("run-example-reason", {"files": {"write": ["**"]}, "decide": {"methods": ["files.write"]}},
                                target="app", scope={"tenantId": "t1"})
                r = b.rpc(tok, "files.write", {"path": "e.txt", "content": "x"})
                self.assertError(r, 403, "forbidden", DENIED + ": " + "\u00e9" * 127)
        finally:
            p.terminate()
            p.communicate(timeout=10)
            shutil.rmtree(base, ignore_errors=True)


class Tls(sbtest.BrokerTestCase):
    """An https:// decider: its certificate checked against ca_file and tls_name."""

    def test_https(self):
        import fetchfix_upstream
        pki = fetchfix_upstream.TestPki().make()
        base = tempfile.mkdtemp(prefix="sbdecide-tls-")
        os.mkdir(os.path.join(base, "t1"))
        good = decidefix.Decider(ssl_context=pki.server_context(pki.tls_leaf)).start()
        rogue = decidefix.Decider(ssl_context=pki.server_context(pki.rogue_leaf)).start()
        try:
            cases = [
                (good, "tls.test", None),
                (good, "other.test", NOT_ALLOWED + "the exchange with the decider failed ("),
                (rogue, "tls.test", NOT_ALLOWED + "the exchange with the decider failed ("),
            ]
            for d, name, refused in cases:
                with self.subTest(port=d.port, name=name):
                    d.reset("allow")
                    conf = config(base, {"url": d.url, "tls_name": name, "ca_file": pki.ca_file})
                    with sbtest.Broker(config=conf) as b:
                        tok = b.mint_ok("run-tls", CAPS, target="app", scope={"tenantId": "t1"})
                        r = b.rpc(tok, "files.write", {"path": "tls.txt", "content": "x"})
                        if refused is None:
                            self.assertEqual(r.status, 200, r)
                            self.assertEqual(d.count(), 1)
                            self.assertEqual(d.requests[0]["body"]["method"], "files.write")
                        else:
                            self.assertEqual(r.status, 403, r)
                            self.assertTrue(r.body["error"]["message"].startswith(refused), r)
                            self.assertEqual(d.count(), 0, "nothing is sent to a decider whose certificate fails")
                    if os.path.exists(os.path.join(base, "t1", "tls.txt")):
                        os.unlink(os.path.join(base, "t1", "tls.txt"))
                        self.assertIsNone(refused)
        finally:
            good.stop()
            rogue.stop()
            pki.cleanup()
            shutil.rmtree(base, ignore_errors=True)


class Reload(sbtest.BrokerTestCase):
    def test_sighup_switches_decider(self):
        """A reload points new decisions at the new decider; one held across it finishes with the old one;
        a bad decider block is rejected whole and the running one stays."""
        base = tempfile.mkdtemp(prefix="sbdecide-reload-")
        os.mkdir(os.path.join(base, "t1"))
        old, new = decidefix.Decider().start(), decidefix.Decider().start()
        try:
            with sbtest.Broker(config=config(base, {"url": old.url, "timeout_ms": 5000})) as b:
                tok = b.mint_ok("run-reload", CAPS, target="app", scope={"tenantId": "t1"})
                old.reset("slow", delay=1.0)
                new.reset("deny", reason="the new decider says no")
                out = {}
                t = threading.Thread(target=lambda: out.setdefault("r", b.rpc(tok, "files.write", {"path": "a.txt", "content": "x"})))
                t.start()
                old.wait_requests(1)

                def hup(cfg, event):
                    path = os.path.join(b._tmpdir, "config.json")
                    with open(path + ".new", "w") as f:
                        json.dump(cfg, f)
                    os.replace(path + ".new", path)
                    before = b.log().count('"event":"%s"' % event)
                    b.proc.send_signal(signal.SIGHUP)
                    self.assertTrue(poll(lambda: b.log().count('"event":"%s"' % event) > before, 10), b.log()[-2000:])

                hup(config(base, {"url": new.url, "timeout_ms": 5000}), "reload.applied")
                t.join(10)
                self.assertEqual(out["r"].status, 200, out["r"])  # the held call: the old decider's late allow
                r = b.rpc(tok, "files.write", {"path": "b.txt", "content": "x"})
                self.assertError(r, 403, "forbidden", DENIED + ": the new decider says no")
                self.assertEqual((old.count(), new.count()), (1, 1))
                hup(config(base, {"url": "http://decider.example/"}), "reload.rejected")
                r = b.rpc(tok, "files.write", {"path": "c.txt", "content": "x"})
                self.assertError(r, 403, "forbidden", DENIED + ": the new decider says no")
                self.assertIn("decider.url: the host must be an IP address or localhost", b.log())
        finally:
            old.stop()
            new.stop()
            shutil.rmtree(base, ignore_errors=True)


class Drain(sbtest.BrokerTestCase):
    def test_sigterm_waits_for_held_calls(self):
        """SIGTERM while a call waits for its decision: the drain lets it finish (the allow runs it), then exits 0."""
        base = tempfile.mkdtemp(prefix="sbdecide-drain-")
        os.mkdir(os.path.join(base, "t1"))
        d = decidefix.Decider().start()
        try:
            b = sbtest.Broker(config=config(base, {"url": d.url, "timeout_ms": 5000})).start()
            tok = b.mint_ok("run-drain", CAPS, target="app", scope={"tenantId": "t1"})
            d.reset("slow", delay=0.8)
            out = {}
            t = threading.Thread(target=lambda: out.setdefault("r", b.rpc(tok, "files.write", {"path": "d.txt", "content": "x"})))
            t.start()
            d.wait_requests(1)
            b.proc.send_signal(signal.SIGTERM)
            t.join(10)
            self.assertEqual(out["r"].status, 200, out["r"])
            self.assertTrue(os.path.exists(os.path.join(base, "t1", "d.txt")))
            self.assertEqual(b.stop(), 0, b.log()[-3000:])
        finally:
            d.stop()
            shutil.rmtree(base, ignore_errors=True)


class Config(unittest.TestCase):
    def check(self, decider, want):
        base = tempfile.mkdtemp(prefix="sbdecide-conf-")
        try:
            path = os.path.join(base, "c.json")
            with open(path, "w") as f:
                json.dump({"decider": decider}, f)
            rc, out, err = sbtest.run_broker_once(["--check-config", "--offline", "--config", path], sbtest.base_env())
            if want is None:
                self.assertEqual(rc, 0, err)
            else:
                self.assertEqual(rc, 1, (out, err))
                self.assertIn(want, err)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def test_validation(self):
        secret = tempfile.NamedTemporaryFile("w", delete=False)
        secret.write("s3cret\n")
        secret.close()
        empty = tempfile.NamedTemporaryFile("w", delete=False)
        empty.close()
        try:
            cases = [
                ({}, None),
                ({"url": "http://127.0.0.1:9/d", "secret_file": secret.name, "timeout_ms": 200, "max_pending": 10,
                  "reuse_ms": 0}, None),
                ({"url": "https://localhost:9/d"}, None),
                ({"url": "https://127.0.0.1:9/d", "tls_name": "decider.internal"}, None),
                ({"url": "http://[::1]:9/d"}, None),
                ([], "decider: expected an object"),
                ({"timeout_ms": 5}, "decider.url: expected the decider's http:// or https:// URL"),
                ({"url": "ftp://127.0.0.1/"}, "decider.url: unsupported scheme"),
                ({"url": "http://decider.example/"}, "decider.url: the host must be an IP address or localhost"),
                ({"url": "https://127.0.0.1/"}, "decider.tls_name: required when an https:// url names an IP address"),
                ({"url": "http://127.0.0.1/", "tls_name": "x"}, "decider.tls_name: only for an https:// url"),
                ({"url": "https://localhost/", "ca_file": "/nonexistent/ca.pem"}, "decider.ca_file: cannot load CA certificates"),
                ({"url": "http://127.0.0.1/", "secret_file": "/nonexistent/s"}, "decider.secret_file: cannot open /nonexistent/s"),
                ({"url": "http://127.0.0.1/", "secret_file": empty.name}, "decider.secret_file: expected 1 to 1024 bytes"),
                ({"url": "http://127.0.0.1/", "timeout_ms": 0}, "decider.timeout_ms: expected an integer from 1 to 600000"),
                ({"url": "http://127.0.0.1/", "max_pending": 4097}, "decider.max_pending: expected an integer from 1 to 4096"),
                ({"url": "http://127.0.0.1/", "reuse_ms": -1}, "decider.reuse_ms: expected an integer from 0 to 3600000"),
                ({"url": "http://127.0.0.1/", "deadline": 1}, "decider.deadline: unknown key"),
            ]
            for decider, want in cases:
                with self.subTest(decider=decider):
                    self.check(decider, want)
        finally:
            os.unlink(secret.name)
            os.unlink(empty.name)


if __name__ == "__main__":
    sbtest.main()

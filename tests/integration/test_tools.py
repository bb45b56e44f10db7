#!/usr/bin/python3
"""tools.list / tools.call through the real broker against the real MCP reference server (issue 5).

The upstream is @modelcontextprotocol/server-everything in Streamable HTTP mode, installed by npm
(see toolsfix_everything.py; the tests skip with the install command when it is missing). The
broker speaks MCP to it: initialize, notifications/initialized, the Mcp-Session-Id header, SSE or
JSON answers. Checked here:

  - tools.list returns exactly the tools the target releases AND the manifest's globs grant
    (printEnv is never listed: the server has it, the target does not release it);
  - tools.call echo and add give the exact MCP results, in JSON and in msgpack;
  - a name the target does not release is forbidden (the handler), a name the manifest does not
    grant is forbidden (the capability check), malformed arguments are bad_args;
  - upstream down, a name we refuse to resolve, a JSON-RPC error and a timeout are execution_error
    with a correlation id whose log line holds the reason;
  - a restarted upstream (sessions lost) is re-initialised transparently;
  - tools.call per run (max_calls, refused calls included, counted across workers) and operations in
    flight per worker (concurrency) answer rate_limited.

What the reference server never does (JSON answers, the spec's 404 for an ended session, pagination,
oversized, malformed and unexpected answers, servers without sessions or without tools) is played
by a scriptable fake (toolsfix_fakemcp.py); those tests run even when npm's package is missing.
"""

import json
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sbtest  # noqa: E402
import toolsfix_everything as ev  # noqa: E402
from toolsfix_fakemcp import FakeMcp, tool  # noqa: E402

ENCODINGS = ("json", "msgpack")
EXEC_MSG = "sandbox binding operation failed"
MSG_BAD_ARGS = "invalid sandbox custom tool arguments"
MSG_TOO_LARGE = "sandbox custom tool arguments are too large"
MSG_LIMIT = "sandbox custom tool limit exceeded"
MSG_NOT_RELEASED = "tools.call name is not released by the target"
TOOL_KEYS = {"name", "title", "description", "inputSchema", "outputSchema", "annotations"}

T = ev.tool_names()
ECHO, ADD, ENV, SLOW = T["echo"], T["add"], T["env"], T["slow"]

MAIN = None     # the upstream most tests share
SECOND = None   # the upstream the restart test restarts
FAKE = None     # the scriptable fake (sessions)
FAKE_SL = None  # the scriptable fake (no sessions)
B = None        # the broker (one worker thread: concurrency is per worker)
DOWN_PORT = None
DOWN_SOCK = None
EVERYTHING_SKIP = None  # why the reference server tests cannot run


def config(threads=1, limited_calls=3):
    targets = {
        "bare": {},
        "fake": {"tools": {"upstream": FAKE.url, "release": ["alpha", "beta", "big"], "timeout_ms": 3000}},
        "fake_sl": {"tools": {"upstream": FAKE_SL.url, "release": ["alpha"], "timeout_ms": 3000}},
        "down": {"tools": {"upstream": "http://127.0.0.1:%d/mcp" % DOWN_PORT, "release": [ECHO], "timeout_ms": 2000}},
        "named": {"tools": {"upstream": "http://tools.example/mcp", "release": [ECHO]}},
    }
    if MAIN is not None:
        targets.update({
            "app": {"tools": {"upstream": MAIN.url, "release": [ECHO, ADD]}},
            "slow": {"tools": {"upstream": MAIN.url, "release": [SLOW, ECHO], "timeout_ms": 1000}},
            "busy": {"tools": {"upstream": MAIN.url, "release": [SLOW, ECHO], "timeout_ms": 10000, "concurrency": 1}},
            "wide": {"tools": {"upstream": MAIN.url, "release": [ECHO, ADD], "concurrency": 16}},
            "limited": {"tools": {"upstream": MAIN.url, "release": [ECHO], "max_calls": limited_calls}},
            "restart": {"tools": {"upstream": SECOND.url, "release": [ECHO]}},
        })
    return {"threads": threads, "targets": targets}


def setUpModule():
    global MAIN, SECOND, FAKE, FAKE_SL, B, DOWN_PORT, EVERYTHING_SKIP
    try:
        FAKE = FakeMcp().start()
        FAKE_SL = FakeMcp().start()
        # a port held bound but not listening: connects are refused, and no other test can take it
        global DOWN_SOCK
        DOWN_SOCK = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        DOWN_SOCK.bind(("127.0.0.1", 0))
        DOWN_PORT = DOWN_SOCK.getsockname()[1]
        try:
            ev.require()
        except unittest.SkipTest as e:
            EVERYTHING_SKIP = str(e)
            sys.stderr.write("reference server tests skipped: %s\n" % e)
        if EVERYTHING_SKIP is None:
            sys.stderr.write("server-everything %s from %s\n" % (ev.installed_version(), ev.PREFIX))
            MAIN = ev.Everything().start()
            SECOND = ev.Everything().start()
        B = sbtest.Broker(config=config()).start()
    except BaseException:
        tearDownModule()
        raise


def stop_clean(broker):
    """Stops a broker with SIGTERM; returns the problems: a non-zero exit, a sanitizer report."""
    errors = []
    try:
        rc = broker.stop()
        log = broker.log()
        if rc != 0:
            errors.append("broker exited with %s:\n%s" % (rc, log[-6000:]))
        for marker in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            if marker in log:
                errors.append("sanitizer report in the broker log:\n%s" % log[-12000:])
                break
    except BaseException as e:  # never leave children behind
        broker.kill()
        errors.append(repr(e))
    return errors


def tearDownModule():
    errors = stop_clean(B) if B is not None else []
    for s in (MAIN, SECOND, FAKE, FAKE_SL):
        if s is not None:
            s.stop()
    if errors:
        raise AssertionError("\n".join(errors))


class ToolsCase(sbtest.BrokerTestCase):
    broker = None
    needs_everything = True

    @classmethod
    def setUpClass(cls):
        if cls.needs_everything and EVERYTHING_SKIP is not None:
            raise unittest.SkipTest(EVERYTHING_SKIP)

    def b(self):
        return self.broker or B

    def token(self, globs=("*",), target="app", run_id=None):
        caps = {} if globs is None else {"tools": list(globs)}
        fields = {} if target is None else {"target": target}
        return self.b().mint_ok(run_id or "run-%s-%f" % (self.id(), time.monotonic()), caps, **fields)

    def call(self, tok, name, arguments=sbtest.MISSING, enc="json", extra=None, timeout=15.0):
        args = {"name": name}
        if arguments is not sbtest.MISSING:
            args["arguments"] = arguments
        args.update(extra or {})
        return self.b().rpc(tok, "tools.call", args, enc=enc, timeout=timeout)

    def assertOk(self, r, enc=None):
        self.assertEqual(r.status, 200, r)
        self.assertIs(r.body.get("ok"), True, r)
        if enc is not None:
            self.assertEqual(r.headers.get("content-type"), sbtest.content_type_of(enc), r)
        return r.body["value"]

    def reason_of(self, r):
        """The reason the broker logged for an execution_error reply (found by its correlation id)."""
        self.assertError(r, 500, "execution_error", EXEC_MSG)
        cid = r.body["error"]["correlationId"]
        line = sbtest.poll(lambda: [e for e in self.b().events() if e.get("event") == "rpc" and e.get("cid") == cid], 5)
        self.assertTrue(line, "no rpc log line for correlation id %s:\n%s" % (cid, self.b().log()[-3000:]))
        return line[0].get("reason", "")


class ListTests(ToolsCase):
    def test_released_and_granted(self):
        tok = self.token(["*"])
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v = self.assertOk(self.b().rpc(tok, "tools.list", {}, enc=enc), enc)
                self.assertEqual(set(v.keys()), {"tools"})
                self.assertEqual([t["name"] for t in v["tools"]], [ECHO, ADD])
                for t in v["tools"]:
                    self.assertLessEqual(set(t.keys()), TOOL_KEYS, t)
                    self.assertIsInstance(t["inputSchema"], dict)
                    self.assertEqual(t["inputSchema"].get("type"), "object")
                    self.assertIsInstance(t.get("description"), str)
                echo = v["tools"][0]
                self.assertIn("message", echo["inputSchema"]["properties"])

    def test_json_and_msgpack_agree(self):
        tok = self.token(["*"])
        j = self.assertOk(self.b().rpc(tok, "tools.list", {}, enc="json"))
        m = self.assertOk(self.b().rpc(tok, "tools.list", {}, enc="msgpack"))
        self.assertEqual(j, m)

    def test_intersection_with_globs(self):
        cases = [
            (["ech*"], [ECHO]),
            ([ADD], [ADD]),
            ([ENV, "e?ho"], [ECHO]),      # ENV is granted but never released
            (["*Env*", "*env*"], []),     # granted, not released: nothing at all
            (["nothing-matches"], []),
            (["*", "echo"], [ECHO, ADD]),
        ]
        for globs, want in cases:
            with self.subTest(globs=globs):
                v = self.assertOk(self.b().rpc(self.token(globs), "tools.list", {}))
                self.assertEqual([t["name"] for t in v["tools"]], want)

    def test_env_tool_never_listed(self):
        # the upstream really has it: it is the target's release list that hides it
        v = self.assertOk(self.b().rpc(self.token(["*"], target="app"), "tools.list"))
        self.assertNotIn(ENV, [t["name"] for t in v["tools"]])

    def test_args(self):
        tok = self.token(["*"])
        self.assertOk(self.b().rpc(tok, "tools.list"))  # absent
        self.assertOk(self.b().rpc(tok, "tools.list", {}))
        for enc in ENCODINGS:
            for args in ({"cursor": "x"}, {"x": 1}, [], None, "", 0):
                with self.subTest(enc=enc, args=args):
                    self.assertError(self.b().rpc(tok, "tools.list", args, enc=enc), 400, "bad_args", MSG_BAD_ARGS, enc=enc)

    def test_not_granted(self):
        self.assertError(self.b().rpc(self.token(None), "tools.list", {}), 403, "forbidden", "tools are not granted")
        self.assertError(self.b().rpc(self.token([]), "tools.list", {}), 403, "forbidden", "tools are not granted")

    def test_target_without_tools(self):
        self.assertError(self.b().rpc(self.token(["*"], target="bare"), "tools.list", {}), 501, "not_implemented",
                         "tools.list has no host handler")
        self.assertError(self.b().rpc(self.token(["*"], target=None), "tools.call", {"name": ECHO}), 501,
                         "not_implemented", "tools.call has no host handler")


class CallTests(ToolsCase):
    def test_echo(self):
        tok = self.token(["*"])
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v = self.assertOk(self.call(tok, ECHO, {"message": "hello"}, enc=enc), enc)
                self.assertEqual(v, {"content": [{"type": "text", "text": "Echo: hello"}]})

    def test_echo_unicode_and_nul(self):
        tok = self.token(["echo"])
        msg = "a\u0000b \u00e9 \U0001F600 \"quoted\" \\"
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v = self.assertOk(self.call(tok, ECHO, {"message": msg}, enc=enc))
                self.assertEqual(v, {"content": [{"type": "text", "text": "Echo: " + msg}]})

    def test_add(self):
        tok = self.token(["*"])
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                v = self.assertOk(self.call(tok, ADD, {"a": 2, "b": 40}, enc=enc), enc)
                self.assertEqual(v, {"content": [{"type": "text", "text": "The sum of 2 and 40 is 42."}]})
                v = self.assertOk(self.call(tok, ADD, {"a": -1.5, "b": 0.25}, enc=enc))
                self.assertEqual(v, {"content": [{"type": "text", "text": "The sum of -1.5 and 0.25 is -1.25."}]})

    def test_not_released(self):
        # granted by the manifest ("*"), present upstream, but the target does not release it
        tok = self.token(["*"])
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                self.assertError(self.call(tok, ENV, enc=enc), 403, "forbidden", MSG_NOT_RELEASED, enc=enc)
                self.assertError(self.call(tok, "nonexistent", {}, enc=enc), 403, "forbidden", MSG_NOT_RELEASED)

    def test_not_granted(self):
        tok = self.token([ECHO])
        self.assertError(self.call(tok, ADD, {"a": 1, "b": 2}), 403, "forbidden", "tools.call name is not granted")
        self.assertError(self.b().rpc(tok, "tools.call", {"arguments": {}}), 403, "forbidden",
                         "tools.call name is missing or invalid")

    def test_bad_args(self):
        tok = self.token(["*"])
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                for extra in ({"envelope": {}}, {"x": None}):
                    self.assertError(self.call(tok, ECHO, {"message": "m"}, enc=enc, extra=extra), 400, "bad_args",
                                     MSG_BAD_ARGS)
                for arguments in ("text", [1, 2], 5, None, True):
                    self.assertError(self.call(tok, ECHO, arguments, enc=enc), 400, "bad_args", MSG_BAD_ARGS)

    def test_arguments_too_large(self):
        tok = self.token(["*"])
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                # 63 KiB packed is the cap; the request itself stays under the 68,608-byte tools.call cap
                self.assertError(self.call(tok, ECHO, {"message": "x" * 64600}, enc=enc), 400, "bad_args", MSG_TOO_LARGE)
                v = self.assertOk(self.call(tok, ECHO, {"message": "y" * 60000}, enc=enc))
                self.assertEqual(v["content"][0]["text"], "Echo: " + "y" * 60000)

    def test_upstream_rejects_arguments(self):
        # echo without its required argument: the server answers a JSON-RPC error (older releases) or an
        # isError result (newer ones); either way nothing of its text reaches the guest but a result
        r = self.call(self.token(["*"]), ECHO)
        if r.status == 200:
            self.assertIs(self.assertOk(r).get("isError"), True, r)
        else:
            self.assertIn("JSON-RPC error", self.reason_of(r))

    def test_token_survives_revocation_mid_call(self):
        # revoking a run does not free the token record a call in flight holds (ASan would catch it)
        tok = self.token(["*"], target="busy", run_id="revoke-mid-call")
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("r", self.call(tok, SLOW, {"duration": 0.6, "steps": 1})))
        th.start()
        time.sleep(0.2)
        self.assertEqual(self.b().revoke_run("revoke-mid-call").status, 204)
        th.join(10)
        self.assertOk(out["r"])
        self.assertError(self.call(tok, ECHO, {"message": "m"}), 401, "unauthorized")


class UnreachableTests(ToolsCase):
    needs_everything = False

    def test_upstream_down(self):
        tok = self.token(["*"], target="down")
        for enc in ENCODINGS:
            with self.subTest(enc=enc):
                r = self.call(tok, ECHO, {"message": "m"}, enc=enc)
                self.assertEqual(r.headers.get("content-type"), sbtest.content_type_of(enc))
                reason = self.reason_of(r)
                self.assertIn("tools upstream http://127.0.0.1:%d/mcp" % DOWN_PORT, reason)
                self.assertIn("initialize", reason)
                self.assertRegex(reason, "connect|refused")
                reason = self.reason_of(self.b().rpc(tok, "tools.list", {}, enc=enc))
                self.assertIn("initialize", reason)

    def test_named_upstream_is_refused(self):
        r = self.call(self.token(["*"], target="named"), ECHO, {"message": "m"})
        reason = self.reason_of(r)
        self.assertIn("http://tools.example/mcp", reason)
        self.assertIn("no name is resolved", reason)


class UpstreamFailureTests(ToolsCase):
    def test_timeout(self):
        tok = self.token(["*"], target="slow")
        t0 = time.monotonic()
        r = self.call(tok, SLOW, {"duration": 4, "steps": 1})
        took = time.monotonic() - t0
        reason = self.reason_of(r)
        self.assertRegex(reason, "no (answer|result) within 1000 ms")
        self.assertGreater(took, 0.9)
        self.assertLess(took, 3.0)
        # the session is still good for the next call
        v = self.assertOk(self.call(tok, ECHO, {"message": "after"}))
        self.assertEqual(v["content"][0]["text"], "Echo: after")

    def test_restarted_upstream_reinitialises(self):
        tok = self.token(["*"], target="restart")
        self.assertOk(self.call(tok, ECHO, {"message": "one"}))
        n_sessions = len(self._sessions())
        self.assertGreaterEqual(n_sessions, 1)
        SECOND.restart()
        v = self.assertOk(self.call(tok, ECHO, {"message": "two"}))
        self.assertEqual(v["content"][0]["text"], "Echo: two")
        expired = [e for e in self.b().events() if e.get("event") == "tools.session_expired" and e.get("upstream") == SECOND.url]
        self.assertTrue(expired, self.b().log()[-3000:])
        self.assertEqual(len(self._sessions()), n_sessions + 1)
        # and it stays up
        self.assertOk(self.b().rpc(tok, "tools.list", {}))
        self.assertEqual(len(self._sessions()), n_sessions + 1)

    def _sessions(self):
        return [e for e in self.b().events() if e.get("event") == "tools.session" and e.get("upstream") == SECOND.url]


class LimitTests(ToolsCase):
    def test_max_calls_counts_refusals(self):
        tok = self.token(["*"], target="limited")
        self.assertError(self.call(tok, ENV), 403, "forbidden", MSG_NOT_RELEASED)      # 1 (refused, counted)
        self.assertError(self.call(tok, ECHO, "bad"), 400, "bad_args", MSG_BAD_ARGS)  # 2 (refused, counted)
        self.assertOk(self.call(tok, ECHO, {"message": "3"}))                           # 3
        for enc in ENCODINGS:
            self.assertError(self.call(tok, ECHO, {"message": "4"}, enc=enc), 429, "rate_limited", MSG_LIMIT, enc=enc)
        # tools.list is not a call
        self.assertOk(self.b().rpc(tok, "tools.list", {}))
        # another run has its own count
        self.assertOk(self.call(self.token(["*"], target="limited"), ECHO, {"message": "fresh"}))

    def test_concurrency(self):
        tok = self.token(["*"], target="busy")
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("r", self.call(tok, SLOW, {"duration": 1.5, "steps": 1})))
        th.start()
        time.sleep(0.5)
        try:
            self.assertError(self.call(tok, ECHO, {"message": "m"}), 429, "rate_limited", MSG_LIMIT)
            self.assertError(self.b().rpc(tok, "tools.list", {}), 429, "rate_limited", MSG_LIMIT)
        finally:
            th.join(15)
        v = self.assertOk(out["r"])
        self.assertTrue(v["content"][0]["text"].startswith("Long running operation completed"), v)
        self.assertOk(self.call(tok, ECHO, {"message": "free again"}))


class MultiWorkerLimitTests(ToolsCase):
    """max_calls is per run, not per worker: two worker threads share one count."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.broker = sbtest.Broker(config=config(threads=2, limited_calls=4)).start()

    @classmethod
    def tearDownClass(cls):
        errors = stop_clean(cls.broker)
        if errors:
            raise AssertionError("\n".join(errors))

    def test_count_is_process_wide(self):
        tok = self.token(["*"], target="limited")
        codes = []
        for i in range(10):
            r = self.call(tok, ECHO, {"message": str(i)})
            codes.append(r.status)
        self.assertEqual(codes, [200] * 4 + [429] * 6)

    def test_parallel_calls(self):
        # many runs at once over both workers (within the target's concurrency): every answer is exact
        results = []
        lock = threading.Lock()

        def one(i):
            tok = self.token(["*"], target="wide", run_id="par-%d" % i)
            r = self.call(tok, ADD, {"a": i, "b": 1000})
            with lock:
                results.append((i, r))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        self.assertEqual(len(results), 12)
        for i, r in results:
            v = self.assertOk(r)
            self.assertEqual(v["content"][0]["text"], "The sum of %d and 1000 is %d." % (i, i + 1000))


def text_result(text):
    return {"content": [{"type": "text", "text": text}]}


class FakeUpstreamTests(ToolsCase):
    """The transport and protocol edges, against the scriptable fake."""

    needs_everything = False

    def setUp(self):
        FAKE.reset()
        FAKE.b.tools = [tool("alpha"), tool("secret"), tool("beta")]
        FAKE.b.call = lambda name, args: ("result", text_result("%s:%s" % (name, json.dumps(args, sort_keys=True))))
        self.tok = self.token(["*"], target="fake")

    def test_initialize_and_headers(self):
        self.assertOk(self.call(self.tok, "alpha", {}))  # a session exists
        FAKE.forget_sessions()
        FAKE.requests = []
        for fmt in ("json", "sse"):
            with self.subTest(format=fmt):
                FAKE.b.format = fmt
                v = self.assertOk(self.call(self.tok, "alpha", {"x": 1}))
                self.assertEqual(v, text_result('alpha:{"x": 1}'))
        self.assertEqual(FAKE.methods(), ["tools/call", "initialize", "notifications/initialized", "tools/call", "tools/call"])
        reqs = FAKE.requests
        self.assertIn("mcp-session-id", reqs[0]["headers"])  # the ended session, answered 404
        init = reqs[1]
        self.assertEqual(init["body"]["params"], {"protocolVersion": "2025-06-18", "capabilities": {},
                                                  "clientInfo": {"name": "sandbox-broker", "version": "0.1.0"}})
        self.assertEqual(init["body"]["jsonrpc"], "2.0")
        self.assertNotIn("mcp-session-id", init["headers"])
        self.assertNotIn("mcp-protocol-version", init["headers"])
        sid = None
        for r in reqs[1:]:
            h = r["headers"]
            self.assertEqual(r["path"], "/mcp")
            self.assertEqual(h.get("content-type"), "application/json")
            accept = [a.strip() for a in h.get("accept", "").split(",")]
            self.assertIn("application/json", accept)
            self.assertIn("text/event-stream", accept)
            if r is not init:
                self.assertEqual(h.get("mcp-protocol-version"), "2025-06-18")
                sid = sid or h.get("mcp-session-id")
                self.assertEqual(h.get("mcp-session-id"), sid)
                self.assertIn(sid, FAKE.sessions)
        self.assertNotIn("id", reqs[2]["body"])  # a notification
        call = reqs[3]["body"]
        self.assertEqual(call["method"], "tools/call")
        self.assertEqual(call["params"], {"name": "alpha", "arguments": {"x": 1}})
        self.assertIsInstance(call["id"], int)
        self.assertNotEqual(call["id"], reqs[4]["body"]["id"])
        expired = [e for e in self.b().events() if e.get("event") == "tools.session_expired" and e.get("upstream") == FAKE.url]
        self.assertTrue(any(e.get("reason") == "HTTP 404 to the session id" for e in expired), expired)

    def test_sse_noise_and_crlf(self):
        for fmt in ("sse", "sse-crlf"):
            with self.subTest(format=fmt):
                FAKE.b.format = fmt
                FAKE.b.noise = True
                v = self.assertOk(self.call(self.tok, "beta", {}))
                self.assertEqual(v, text_result("beta:{}"))
                v = self.assertOk(self.b().rpc(self.tok, "tools.list", {}))
                self.assertEqual([t["name"] for t in v["tools"]], ["alpha", "beta"])

    def test_arguments_absent(self):
        self.assertOk(self.call(self.tok, "alpha"))
        self.assertEqual(FAKE.requests[-1]["body"]["params"], {"name": "alpha"})

    def test_bin_arguments_become_base64(self):
        self.assertOk(self.call(self.tok, "alpha", {"blob": b"\x00\xff"}, enc="msgpack"))
        self.assertEqual(FAKE.requests[-1]["body"]["params"]["arguments"], {"blob": "AP8="})

    def test_pagination(self):
        FAKE.b.tools = [tool("t%d" % i) for i in range(5)] + [tool("beta")] + [tool("t%d" % i) for i in range(5, 9)] + [tool("alpha")]
        FAKE.b.page_size = 3
        v = self.assertOk(self.b().rpc(self.tok, "tools.list", {}))
        self.assertEqual([t["name"] for t in v["tools"]], ["beta", "alpha"])
        cursors = [(r["body"].get("params") or {}).get("cursor") for r in FAKE.requests if r["body"]["method"] == "tools/list"]
        self.assertEqual(cursors, [None, "3", "6", "9"])

    def test_too_many_pages(self):
        FAKE.b.page_size = 1
        FAKE.b.endless_pages = True
        self.assertIn("beyond 16 pages", self.reason_of(self.b().rpc(self.tok, "tools.list", {})))

    def test_too_many_tools(self):
        FAKE.b.tools = [tool("t%d" % i) for i in range(257)]
        FAKE.b.page_size = 100
        self.assertIn("more than 256 tools", self.reason_of(self.b().rpc(self.tok, "tools.list", {})))
        FAKE.b.tools = [tool("t%d" % i) for i in range(254)] + [tool("alpha"), tool("beta")]
        v = self.assertOk(self.b().rpc(self.tok, "tools.list", {}))
        self.assertEqual([t["name"] for t in v["tools"]], ["alpha", "beta"])

    def test_tool_fields(self):
        full = tool("alpha", title="Alpha", outputSchema={"type": "object"}, annotations={"readOnlyHint": True},
                    _meta={"x": 1}, icons=[{"src": "data:"}], execution={"taskSupport": "never"})
        FAKE.b.tools = [full, tool("alpha", description="a duplicate"), tool("secret", inputSchema="not an object")]
        for enc in ENCODINGS:
            v = self.assertOk(self.b().rpc(self.tok, "tools.list", {}, enc=enc))
            self.assertEqual(v["tools"], [{"name": "alpha", "title": "Alpha", "description": "the alpha tool",
                                           "inputSchema": {"type": "object"}, "outputSchema": {"type": "object"},
                                           "annotations": {"readOnlyHint": True}}])

    def test_malformed_tools(self):
        cases = [
            ([{"name": "alpha"}], 'tool "alpha" has a malformed inputSchema'),
            ([tool("alpha", title=5)], 'tool "alpha" has a malformed title'),
            ([tool("alpha", annotations=[])], 'tool "alpha" has a malformed annotations'),
            ([{"description": "no name", "inputSchema": {}}], "a tool without a valid name"),
            (["just a string"], "a tool without a valid name"),
        ]
        for tools, want in cases:
            with self.subTest(want=want):
                FAKE.b.tools = tools
                self.assertIn(want, self.reason_of(self.b().rpc(self.tok, "tools.list", {})))

    def test_call_result_fields(self):
        FAKE.b.call = lambda n, a: ("result", {"content": [{"type": "text", "text": "t"}], "structuredContent": {"a": [1, 2]},
                                              "isError": True, "_meta": {"m": 1}, "extra": "dropped"})
        for enc in ENCODINGS:
            v = self.assertOk(self.call(self.tok, "alpha", {}, enc=enc))
            self.assertEqual(v, {"content": [{"type": "text", "text": "t"}], "structuredContent": {"a": [1, 2]}, "isError": True})

    def test_call_failures(self):
        big = "x" * (800 * 1024)
        cases = [
            (("error", -32001, "boom\nline two"), "JSON-RPC error -32001: boom?line two"),
            (("result", {"content": "text"}), "the result has no content array"),
            (("result", {"content": [], "isError": "yes"}), "isError is not a boolean"),
            (("result", {"content": [], "structuredContent": [1]}), "structuredContent is not an object"),
            (("result", text_result(big)), "exceeds"),
            (("raw", 200, "application/json", b"{not json"), "not valid JSON"),
            (("raw", 200, "text/html", b"<html>"), "neither application/json nor text/event-stream"),
            (("raw", 200, "text/event-stream", b'data: {"jsonrpc":"2.0","method":"x"}\n\n'), "no JSON-RPC response"),
            (("raw", 200, "text/event-stream", b'data: {"jsonrpc":"2.0","id":1,"result":{}}'), "no JSON-RPC response"),
            (("raw", 500, "application/json", b'{"jsonrpc":"2.0","error":{"code":-32603,"message":"Internal"}}'),
             "upstream answered HTTP 500 (JSON-RPC error -32603: Internal)"),
            (("raw", 503, "text/plain", b"down"), "upstream answered HTTP 503"),
            (("raw", 200, "application/json", b"[]" + b" " * (2 * 1024 * 1024)), "response body exceeds the cap"),
        ]
        for out, want in cases:
            for fmt in ("json", "sse"):
                with self.subTest(want=want, format=fmt):
                    FAKE.b.format = fmt
                    FAKE.b.call = lambda n, a, out=out: out
                    reason = self.reason_of(self.call(self.tok, "alpha", {}))
                    self.assertIn(want, reason)
                    self.assertIn("tools upstream %s" % FAKE.url, reason)
        # the session is still fine
        FAKE.b.call = lambda n, a: ("result", text_result("ok"))
        self.assertEqual(self.assertOk(self.call(self.tok, "alpha", {})), text_result("ok"))

    def test_initialize_failures(self):
        cases = [
            ("capabilities", {}, "does not offer the tools capability"),
            ("session_id", "has space", "Mcp-Session-Id"),
            ("session_id", "x" * 300, "Mcp-Session-Id"),
            ("protocol_version", "2024-11-05", "protocol version 2024-11-05"),
            ("protocol_version", "2099-01-01", "protocol version 2099-01-01"),
        ]
        for attr, value, want in cases:
            with self.subTest(attr=attr, value=value[:20] if isinstance(value, str) else value):
                FAKE.reset()
                FAKE.forget_sessions()
                setattr(FAKE.b, attr, value)
                self.assertIn(want, self.reason_of(self.call(self.tok, "alpha", {})))
                self.assertIn(want, self.reason_of(self.b().rpc(self.tok, "tools.list", {})))
        # the next call starts a good session
        FAKE.reset()
        FAKE.b.call = lambda n, a: ("result", text_result("ok"))
        self.assertEqual(self.assertOk(self.call(self.tok, "alpha", {})), text_result("ok"))

    def test_other_protocol_versions(self):
        for version in ("2025-03-26", "2025-11-25"):
            with self.subTest(version=version):
                FAKE.forget_sessions()
                FAKE.b.protocol_version = version
                self.assertOk(self.call(self.tok, "alpha", {}))
                self.assertEqual(FAKE.requests[-1]["headers"].get("mcp-protocol-version"), version)


class StatelessFakeTests(ToolsCase):
    """A server that assigns no session id: no Mcp-Session-Id is sent, and a 404 is not an ended session."""

    needs_everything = False

    def test_stateless(self):
        FAKE_SL.reset()
        FAKE_SL.b.stateless = True
        FAKE_SL.b.format = "json"
        FAKE_SL.b.tools = [tool("alpha")]
        FAKE_SL.b.call = lambda n, a: ("result", text_result("sl"))
        tok = self.token(["*"], target="fake_sl")
        self.assertEqual(self.assertOk(self.call(tok, "alpha", {})), text_result("sl"))
        self.assertOk(self.b().rpc(tok, "tools.list", {}))
        for r in FAKE_SL.requests:
            self.assertNotIn("mcp-session-id", r["headers"])
        self.assertEqual(FAKE_SL.methods(), ["initialize", "notifications/initialized", "tools/call", "tools/list"])
        FAKE_SL.b.call = lambda n, a: ("raw", 404, "text/plain", b"gone")
        self.assertIn("upstream answered HTTP 404", self.reason_of(self.call(tok, "alpha", {})))
        self.assertEqual(FAKE_SL.methods().count("initialize"), 1)


def shared_redis_port():
    """The port of SB_TEST_REDIS_URL when it names a loopback Redis without a password, else None."""
    from urllib.parse import urlparse
    url = os.environ.get("SB_TEST_REDIS_URL")
    if not url:
        return None
    u = urlparse(url)
    if u.scheme != "redis" or u.hostname not in ("127.0.0.1", "localhost") or u.password or u.path not in ("", "/"):
        return None
    port = u.port or 6379
    return port if sbtest.redis_ping(port) else None


class SharedRedisLimitTests(ToolsCase):
    """max_calls is per run, not per instance: two brokers on one Redis count one limit."""

    needs_everything = False

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.redis = None
        cls.up = FakeMcp().start()
        cls.up.b.tools = [tool("alpha")]
        cls.up.b.call = lambda name, args: ("result", text_result("ok"))
        port = shared_redis_port()
        if port is None:
            cls.redis = sbtest.RedisServer().start()
            port = cls.redis.port
        cls.redis_port = port
        cls.prefix = "sbtest-tools-%d-%d:" % (os.getpid(), int(time.monotonic() * 1000))
        env = {"SANDBOX_BROKER_TOKEN_STORE": "redis://127.0.0.1:%d" % port, "SANDBOX_BROKER_REDIS_PREFIX": cls.prefix}
        cfg = {"threads": 2, "targets": {"limited": {"tools": {"upstream": cls.up.url, "release": ["alpha"], "max_calls": 3}}}}
        cls.one = sbtest.Broker(env=env, config=cfg).start()
        cls.two = sbtest.Broker(env=env, config=cfg).start()
        for br in (cls.one, cls.two):
            if not br.wait_store_up(2):
                raise AssertionError("broker never connected to Redis:\n" + br.log())

    @classmethod
    def tearDownClass(cls):
        errors = stop_clean(cls.one) + stop_clean(cls.two)
        try:
            keys = sbtest.redis_command(cls.redis_port, "KEYS", cls.prefix + "*")
            if keys:
                sbtest.redis_command(cls.redis_port, "DEL", *keys)
        except OSError:
            pass
        if cls.redis is not None:
            cls.redis.stop()
        cls.up.stop()
        if errors:
            raise AssertionError("\n".join(errors))

    def test_one_limit_across_instances(self):
        run = "shared-limit-%f" % time.monotonic()
        tok = self.one.mint_ok(run, {"tools": ["*"]}, target="limited")
        self.assertOk(self.call(tok, "alpha", {}))                  # 1, on one
        self.assertOk(self.two_call(tok))                           # 2, on two
        self.assertOk(self.call(tok, "alpha", {}))                  # 3, on one
        for enc in ENCODINGS:                                        # 4 and 5, refused on both
            self.assertError(self.two_call(tok, enc), 429, "rate_limited", MSG_LIMIT, enc=enc)
            self.assertError(self.call(tok, "alpha", {}, enc=enc), 429, "rate_limited", MSG_LIMIT, enc=enc)
        self.assertEqual(self.up.methods().count("tools/call"), 3)
        # the count lives next to the run's other counters and expires with them
        key = self.prefix + "q:tools:" + run
        self.assertEqual(sbtest.redis_command(self.redis_port, "GET", key), b"7")
        self.assertGreater(sbtest.redis_command(self.redis_port, "PTTL", key), 0)
        # another run has its own count
        other = self.two.mint_ok(run + "-other", {"tools": ["*"]}, target="limited")
        self.assertOk(self.call(other, "alpha", {}))

    def b(self):
        return self.one

    def two_call(self, tok, enc="json"):
        return self.two.rpc(tok, "tools.call", {"name": "alpha", "arguments": {}}, enc=enc)


class ShutdownTests(ToolsCase):
    """SIGTERM with a tools call still in flight after the drain: the call is answered once, and the
    worker frees everything (the sanitizer build would report a leak or a use after free)."""

    def test_shutdown_with_call_in_flight(self):
        cfg = config()
        cfg["drain_timeout_ms"] = 300
        self.broker = sbtest.Broker(config=cfg).start()
        try:
            tok = self.token(["*"], target="busy")
            self.assertOk(self.call(tok, ECHO, {"message": "session up"}))
            out = {}

            def slow():
                try:
                    out["r"] = self.call(tok, SLOW, {"duration": 3, "steps": 1})
                except OSError as e:  # the connection may close before the answer leaves
                    out["r"] = e

            th = threading.Thread(target=slow)
            th.start()
            time.sleep(0.5)
            t0 = time.monotonic()
            errors = stop_clean(self.broker)
            took = time.monotonic() - t0
            th.join(10)
            self.assertEqual(errors, [])
            self.assertLess(took, 2.5)
            r = out.get("r")
            if isinstance(r, sbtest.Response):
                self.assertError(r, 500, "execution_error", EXEC_MSG)
        finally:
            self.broker.kill()


if __name__ == "__main__":
    sbtest.main()

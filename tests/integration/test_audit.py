"""The audit stream: one line per RPC to a file, with the capability decision and sizes."""

import json
import os
import tempfile
import time

import sbtest


class Audit(sbtest.BrokerTestCase):
    def test_one_line_per_call_without_the_token(self):
        d = tempfile.mkdtemp(prefix="sb-audit-")
        path = os.path.join(d, "audit.log")
        with sbtest.Broker(env={"SANDBOX_BROKER_AUDIT": path, "SANDBOX_BROKER_LOG_CALLS": "false"}) as b:
            token = b.mint_ok("audit-run", {"services": ["svc"]})
            self.assertEqual(b.rpc(token, "services.svc.fn", {"a": 1}).status, 501)
            self.assertEqual(b.rpc(token, "services.other.fn", {}).status, 403)
            self.assertEqual(b.rpc("0" * 64, "services.svc.fn", {}).status, 401)
            # log_calls=false: the per-call log lines are gone, the audit lines are not
            self.assertNotIn('"event":"rpc"', b.log())
            # SIGTERM flushes the audit buffer before the broker exits
            self.assertEqual(b.stop(), 0)
        with open(path) as f:
            records = [json.loads(l) for l in f.read().splitlines()]
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        # the chain around the calls: a genesis first, the shutdown checkpoint last (test_audit_chain.py has the rest)
        self.assertEqual([r["event"] for r in records],
                         ["audit.genesis", "audit", "audit", "audit", "audit.checkpoint"])
        self.assertEqual([r["seq"] for r in records], list(range(5)))
        self.assertEqual(records[-1]["reason"], "shutdown")
        lines = [r for r in records if r["event"] == "audit"]
        granted, denied, unknown = lines
        self.assertEqual((granted["decision"], granted["code"], granted["status"]), ("allow", "not_implemented", 501))
        self.assertEqual(granted["runId"], "audit-run")
        self.assertEqual(granted["method"], "services.svc.fn")
        self.assertEqual(len(granted["token"]), 12)
        with open(path) as f:
            self.assertNotIn(token, f.read())
        self.assertGreater(granted["bytesIn"], 0)
        self.assertGreater(granted["bytesOut"], 0)
        self.assertRegex(granted["cid"], r"^[0-9a-f-]{36}$")
        self.assertEqual((denied["decision"], denied["code"], denied["reason"]),
                         ("deny", "forbidden", 'service "other" is not granted'))
        self.assertEqual((unknown["decision"], unknown["code"]), ("deny", "unauthorized"))
        self.assertNotIn("runId", unknown)

    def test_egress_refusal_reason_is_audited_under_the_call_id(self):
        """An http.fetch the address policy refuses during the fetch: execution_error on the wire, the reason in the
        egress.failed line and the audit line, both under the call's correlation id (PROTOCOL.md section 6a)."""
        d = tempfile.mkdtemp(prefix="sb-audit-")
        path = os.path.join(d, "audit.log")
        port = sbtest.free_port()
        reason = "http.fetch address 127.0.0.2 is blocked (loopback 127.0.0.0/8)"
        with sbtest.Broker(env={"SANDBOX_BROKER_AUDIT": path}) as b:
            token = b.mint_ok("audit-egress", {"net": ["127.0.0.2:%d" % port]})
            r = b.rpc(token, "http.fetch", {"url": "http://127.0.0.2:%d/" % port})
            self.assertError(r, 500, "execution_error", "sandbox binding operation failed")
            cid = r.body["error"]["correlationId"]
            self.assertNotIn(b"127.0.0.2", r.raw)
            failed = sbtest.poll(lambda: [e for e in b.events() if e.get("event") == "egress.failed"], 5.0)
            self.assertEqual([(e.get("cid"), e.get("reason")) for e in failed], [(cid, reason)])
            rpc = sbtest.poll(lambda: [e for e in b.events() if e.get("event") == "rpc"], 5.0)
            self.assertEqual(b.stop(), 0)
        with open(path) as f:
            lines = [r for r in map(json.loads, f.read().splitlines()) if r["event"] == "audit"]
        self.assertEqual(len(lines), 1, lines)
        # the call is described once: the log line and the audit line say the same, to the microsecond
        self.assertEqual(len(rpc), 1, rpc)
        shared = ("cid", "runId", "method", "code", "status", "reason", "us", "bytesIn", "bytesOut", "token")
        self.assertEqual({k: rpc[0].get(k) for k in shared}, {k: lines[0].get(k) for k in shared})
        self.assertTrue(all(lines[0].get(k) is not None for k in shared), lines[0])
        self.assertEqual((lines[0]["cid"], lines[0]["decision"], lines[0]["code"], lines[0]["status"], lines[0]["reason"]),
                         (cid, "allow", "execution_error", 500, reason))

    def test_dropped_lines_are_counted(self):
        with sbtest.Broker(env={"SANDBOX_BROKER_AUDIT": "/dev/full"}) as b:
            token = b.mint_ok("audit-full", {"services": ["svc"]})
            for _ in range(5):
                b.rpc(token, "services.svc.fn", {})
            # /dev/full fails every write: the lines are lost (and counted), the calls are not
            dropped = sbtest.poll(lambda: [int(l.split()[1]) for l in b.admin("GET", "/metrics").raw.decode().splitlines()
                                           if l.startswith("sb_audit_dropped_total ") and int(l.split()[1]) >= 5], 5.0)
            self.assertEqual(dropped, [5])

    def test_unwritable_audit_file_refuses_to_start(self):
        rc, out, err = sbtest.run_broker_once([], sbtest.base_env({"SANDBOX_BROKER_AUDIT": "/nonexistent/dir/audit.log"}))
        self.assertEqual(rc, 1, err)
        self.assertIn("audit: cannot open /nonexistent/dir/audit.log: No such file or directory", err)


if __name__ == "__main__":
    sbtest.main()

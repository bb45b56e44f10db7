"""Call log lines written in batches by several worker threads at once (broker/obs/log.c): to a log
file a worker's batch goes in one write(), to a pipe in pieces of at most PIPE_BUF bytes; either way
every line lands whole, none is lost and none is written twice. Long lines (a 240-byte method)
and sixteen concurrent clients on two workers give batches of several lines, which can exceed PIPE_BUF."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest

import sbtest

CLIENTS = 16
CALLS = 100
# a method of 240 bytes (within the 256-byte cap, refused by the manifest or the grammar: logged either way)
LONG = "services." + "s" * 228 + ".fn"


def check_lines(test, raw, sent):
    """raw: the bytes written; every line one JSON object, and the rpc lines exactly the calls sent"""
    test.assertTrue(raw.endswith(b"\n"), raw[-200:])
    rpc = []
    for line in raw.split(b"\n")[:-1]:
        try:
            ev = json.loads(line)
        except ValueError:
            test.fail("a line that is not one JSON object (cut or interleaved): %r" % line[:300])
        if ev.get("event") == "rpc":
            rpc.append(ev)
    test.assertEqual(len(rpc), sent, "every call logged once")
    test.assertEqual(len({e["cid"] for e in rpc}), sent, "no line twice")
    test.assertEqual({e["method"] for e in rpc}, {LONG})


class LogBatches(sbtest.BrokerTestCase):
    def load(self, port, token):
        errors = []

        def client():
            try:
                for _ in range(CALLS):
                    r = sbtest.http_request(port, "POST", sbtest.RPC_PATH, json.dumps({"method": LONG, "args": {}}).encode(),
                                            {sbtest.TOKEN_HEADER: token, "Content-Type": "application/json"})
                    if r.status not in (400, 403):
                        errors.append(r.status)
            except Exception as e:  # a failed client fails the test below
                errors.append(repr(e))

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])

    def test_to_a_pipe(self):
        b = sbtest.Broker(env={"SANDBOX_BROKER_THREADS": "2", "SANDBOX_BROKER_QUOTA_CALLS": "100000",
                               "SANDBOX_BROKER_QUOTA_CONCURRENT": "64"}).start()
        try:
            token = b.mint_ok("batch-run", {"services": ["svc"]})
            self.load(b.port, token)
        finally:
            self.assertEqual(b.stop(), 0)
        check_lines(self, "".join(b.lines).encode(), CLIENTS * CALLS)

    def test_to_a_file(self):
        d = tempfile.mkdtemp(prefix="sb-logbatch-")
        self.addCleanup(shutil.rmtree, d, True)
        path = os.path.join(d, "broker.log")
        env = sbtest.base_env({"SANDBOX_BROKER_THREADS": "2", "SANDBOX_BROKER_LOG_FILE": path,
                               "SANDBOX_BROKER_QUOTA_CALLS": "100000", "SANDBOX_BROKER_QUOTA_CONCURRENT": "64"})
        proc = subprocess.Popen([sbtest.BROKER_BIN], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        ports = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not ("public" in ports and "admin" in ports):
            self.assertIsNone(proc.poll())
            if os.path.exists(path):
                with open(path, "rb") as f:
                    for line in f.read().split(b"\n"):
                        if line.startswith(b"{") and b'"event":"listening"' in line:
                            ev = json.loads(line)
                            ports[ev["listener"]] = ev["port"]
            time.sleep(0.05)
        self.assertIn("public", ports)
        b = sbtest.Broker()
        b.port, b.admin_port = ports["public"], ports["admin"]
        token = b.mint_ok("batch-run", {"services": ["svc"]})
        self.load(b.port, token)
        proc.terminate()
        self.assertEqual(proc.wait(30), 0)
        with open(path, "rb") as f:
            check_lines(self, f.read(), CLIENTS * CALLS)


if __name__ == "__main__":
    sbtest.main()

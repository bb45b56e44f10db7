#!/usr/bin/python3
"""Redis goes away under load and comes back, for a short and a long outage: every answer meanwhile
is the granted call's 501 or 503 `unavailable` (never another answer), and the broker answers
normally again without a restart. Redis keeps its data (appendonly, fsync always), so the token
stays valid across the restart and a 401 would be a wrong answer too.

The time from Redis accepting connections again to the broker's first good answer is printed (the
goal is under a second, whatever the outage length); it is not a pass/fail threshold here. The test
fails if the broker never recovers within 10 s. tests/bench/failover.sh reports the same time.
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import redisfix  # noqa: E402
import sbtest  # noqa: E402

CAPS = {"services": ["mailer"]}
GRANTED = (501, "not_implemented", "services dispatch is not implemented")
UNAVAILABLE = (503, "unavailable", "sandbox token store is unavailable")
OUTAGES = (0.5, 4.0)  # the long one outlasts the old backoff (0.1 s doubling to 3.2 s)


class Load:
    """Threads calling one token as fast as the broker answers; every answer is kept."""

    def __init__(self, broker, token, threads=4):
        self.broker, self.token = broker, token
        self.answers, self.lock, self.stop_ev = [], threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self):
        while not self.stop_ev.is_set():
            sent = time.monotonic()
            try:
                r = self.broker.rpc(self.token, "services.mailer.send", {}, timeout=5)
                err = r.body.get("error", {}) if isinstance(r.body, dict) else {}
                ans = (r.status, err.get("code"), err.get("message"))
            except OSError as e:
                ans = ("error", type(e).__name__, str(e))
            with self.lock:
                self.answers.append((sent, time.monotonic(), ans))

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(10)

    def since(self, t):
        with self.lock:
            return [a for a in self.answers if a[1] >= t]


def recover(test, node, broker, load, outage):
    """Kills Redis, waits `outage` seconds, restarts it; returns (503s seen, seconds from accept to the first 501)."""
    t_kill = time.monotonic()
    node.kill()
    time.sleep(outage)
    node.start()
    t_accept = time.monotonic()  # node.start() returns once PING answers
    deadline = t_accept + 10.0
    first_good = None
    while time.monotonic() < deadline and first_good is None:
        for sent, recv, ans in load.since(t_accept):
            if ans == GRANTED and sent >= t_kill:
                first_good = recv
                break
        time.sleep(0.005)
    test.assertIsNotNone(first_good, "no good answer within 10 s of Redis coming back:\n" + broker.log()[-3000:])
    unavailable = [a for a in load.since(t_kill) if a[2] == UNAVAILABLE]
    return len(unavailable), max(0.0, first_good - t_accept)


class Recovery(sbtest.BrokerTestCase):
    def test_outages_short_and_long(self):
        node = redisfix.Node(persist=True).start()
        broker = sbtest.Broker(env={"SANDBOX_BROKER_TOKEN_STORE": node.url, "SANDBOX_BROKER_THREADS": "2",
                                    "SANDBOX_BROKER_LOG_CALLS": "false"}).start()
        load = None
        try:
            self.assertTrue(broker.wait_store_up(2), broker.log())
            token = broker.mint_ok("run-recover", CAPS, quotas={"calls": 1000000, "concurrent": 64})
            load = Load(broker, token).start()
            time.sleep(0.5)
            times = []
            for outage in OUTAGES:
                n503, took = recover(self, node, broker, load, outage)
                self.assertGreater(n503, 0, "the outage was never seen")
                times.append((outage, took, n503))
                time.sleep(0.5)  # answering normally again
            load.stop()
            wrong = [a for a in load.answers if a[2] not in (GRANTED, UNAVAILABLE)]
            self.assertEqual(wrong[:5], [], "%d wrong answers" % len(wrong))
            tail = [a[2] for a in load.answers[-20:]]
            self.assertEqual(set(tail), {GRANTED}, tail)
            for outage, took, n503 in times:
                sys.stderr.write("\n  Redis away %.1f s: first good answer %.0f ms after it accepted connections "
                                 "(%d answers 503 meanwhile)" % (outage, took * 1000, n503))
            sys.stderr.write("\n")
            self.assertEqual(broker.stop(), 0, broker.log()[-3000:])
        finally:
            if load is not None:
                load.stop()
            broker.kill()
            node.cleanup()


if __name__ == "__main__":
    unittest.main(verbosity=2)

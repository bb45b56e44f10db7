#!/usr/bin/python3
"""How fast the Redis store answers normally again (see tests/bench/README.md, "Failover").

1. Plain Redis (redis://), killed under load and restarted on the same port after outages of
   several lengths: the time from redis-server accepting connections again to the broker's first
   good answer (goal < 1 s for any outage length). The floor in the same run is the time this
   script's own fresh connection needs for a PING once the server accepts (next to nothing).
2. Sentinel (redis-sentinel://), one primary, one replica, three sentinels, two brokers, the
   primary killed under load, BENCH_ROUNDS times on a fresh topology: the time from the promotion
   (the replica's ROLE turning master) to each broker's first good answer (goal < 2 s), and from
   the +switch-master message (what the brokers wait for).

Every answer during the outages is checked: only the granted call's 501 or 503 `unavailable` (and
401 for the revoked token) are allowed; anything else makes the run fail (exit 1).
"""

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import redisfix  # noqa: E402
import sbtest  # noqa: E402
import test_redis_recovery as rec  # noqa: E402
import test_redis_sentinel as sen  # noqa: E402

OUTAGES = [float(x) for x in os.environ.get("BENCH_OUTAGES", "0.5 2 5 10").split()]
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))


def spread(xs):
    return "median %.0f ms (min %.0f, max %.0f, n=%d)" % (statistics.median(xs), min(xs), max(xs), len(xs))


def plain():
    node = redisfix.Node(persist=True).start()
    broker = sbtest.Broker(env={"SANDBOX_BROKER_TOKEN_STORE": node.url, "SANDBOX_BROKER_THREADS": "2",
                                "SANDBOX_BROKER_LOG_CALLS": "false"}).start()
    load = None
    try:
        if not broker.wait_store_up(2):
            raise SystemExit("failover.py: the broker never connected:\n" + broker.log()[-2000:])
        token = broker.mint_ok("bench-recover", {"services": ["mailer"]}, quotas={"calls": 1000000, "concurrent": 64})
        load = rec.Load(broker, token).start()
        time.sleep(0.5)
        print("plain Redis, killed and restarted on the same port under load (broker: 2 workers, 4 client threads)")
        for outage in OUTAGES:
            node.kill()
            time.sleep(outage)
            t0 = time.monotonic()
            node.start()
            floor = time.monotonic() - t0  # start() returns once this script's fresh connection got PONG
            t_kill = t0 - outage
            t_accept = time.monotonic()
            first = None
            while first is None and time.monotonic() < t_accept + 10:
                for sent, recv, ans in load.since(t_accept):
                    if ans == rec.GRANTED and sent >= t_kill:
                        first = recv
                        break
                time.sleep(0.002)
            if first is None:
                raise SystemExit("failover.py: no good answer within 10 s of Redis coming back")
            print("  RECOVERY outage_s=%.1f first_good_ms=%.0f (goal < 1000; this script's own PING after start: %.0f ms)"
                  % (outage, max(0.0, first - t_accept) * 1000, floor * 1000))
            time.sleep(0.5)
        load.stop()
        wrong = [a for a in load.answers if a[2] not in (rec.GRANTED, rec.UNAVAILABLE)]
        if wrong:
            raise SystemExit("failover.py: %d wrong answers, e.g. %r" % (len(wrong), wrong[:3]))
        print("  every answer was 501 or 503 unavailable (%d answers)" % len(load.answers))
    finally:
        if load is not None:
            load.stop()
        broker.kill()
        node.cleanup()


def sentinel():
    print("\nSentinel: primary killed under load (1 replica, 3 sentinels, down-after 400 ms, 2 brokers x 2 workers)")
    after_promotion, after_switch, promotions = [], [], []
    for rnd in range(ROUNDS):
        t = sen.Failover("test_primary_killed_under_load")
        t.setUp()
        try:
            live, revoked = t.tokens()
            sub = redisfix.Subscriber(t.sentinels[0].port, "+switch-master", password=sen.SENTINEL_PW)
            t.cleanups.append(sub.close)
            load = sen.Load(t.brokers, live, revoked).start()
            time.sleep(0.5)
            promoted = t.watch_promotion()
            t_kill = time.monotonic()
            t.primary.kill()
            if not sbtest.poll(lambda: sub.first() is not None and "t" in promoted, 20.0):
                raise SystemExit("failover.py: no failover in round %d" % (rnd + 1))
            t_switch = sub.first()[0]
            firsts = t.check_failover(load, t_kill, promoted["t"], t_switch)
            promotions.append((promoted["t"] - t_kill) * 1000)
            for f in firsts:
                after_promotion.append((f - promoted["t"]) * 1000)
                after_switch.append((f - t_switch) * 1000)
            print("  round %d: promoted %.0f ms after the kill; first good answer A %.0f ms, B %.0f ms after the "
                  "promotion (%.0f / %.0f ms after +switch-master)" %
                  (rnd + 1, promotions[-1], (firsts[0] - promoted["t"]) * 1000, (firsts[1] - promoted["t"]) * 1000,
                   (firsts[0] - t_switch) * 1000, (firsts[1] - t_switch) * 1000))
        finally:
            t.tearDown()
    print("  PROMOTION_TO_FIRST_GOOD %s (goal < 2000)" % spread(after_promotion))
    print("  SWITCH_MASTER_TO_FIRST_GOOD %s" % spread(after_switch))
    print("  KILL_TO_PROMOTION %s (Sentinel's own detection and election)" % spread(promotions))


if __name__ == "__main__":
    which = sys.argv[1:] or ["plain", "sentinel"]
    if "plain" in which:
        plain()
    if "sentinel" in which:
        sentinel()

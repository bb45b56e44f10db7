#!/usr/bin/python3
"""Revoke-to-refusal delay across broker instances (driven by tests/bench/revoke.sh).

For each of N tokens: mint on instance A (admin), confirm that calls on instance B work (501 for
a granted services call), send the revocation to A, and meanwhile call B back to back on a
keep-alive connection. One thread and non-blocking sockets: the DELETE to A and the calls to B are
multiplexed with select(), so the moment A's 204 arrives and the moment B's first 401 arrives are
both taken from the same clock with no thread switch in between.

    delay = (arrival of B's first 401) - (arrival of A's 204)

A negative delay means B already refused the token before the host had the 204 in hand; it counts
as 0 in the percentiles (the host cannot observe anything earlier than its own 204).

Output: one line per 100 tokens on stderr, then a summary on stdout ending with a line
    RESULT tokens=N p50_ms=.. p99_ms=.. max_ms=.. ...
Exit status: 0 when every token was minted, worked on B, was revoked (204) and then refused on B
(401) within the per-token deadline; 1 otherwise; 2 on usage errors.
"""

import argparse
import json
import os
import select
import socket
import sys
import time

TOKEN_HEADER = "x-questpie-sandbox-token"
CAPS = {"services": ["billing"]}


class Conn:
    """One keep-alive HTTP/1.1 connection with a minimal response parser (Content-Length bodies)."""

    def __init__(self, port):
        self.port = port
        self.sock = None
        self.buf = b""
        self.connect()

    def connect(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.buf = b""

    def send(self, method, path, headers, body=b""):
        lines = ["%s %s HTTP/1.1" % (method, path), "Host: 127.0.0.1", "Content-Length: %d" % len(body)]
        lines += ["%s: %s" % kv for kv in headers.items()]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        self.sock.setblocking(True)
        try:
            self.sock.sendall(data)
        finally:
            self.sock.setblocking(False)

    def poll_response(self):
        """Reads what is available; returns (status, headers, body) once a whole response is buffered, else None."""
        try:
            chunk = self.sock.recv(65536)
            if chunk == b"":
                raise ConnectionError("connection closed by the broker")
            self.buf += chunk
        except BlockingIOError:
            pass
        return self.parse()

    def parse(self):
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buf[:end].decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        headers = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        n = int(headers.get("content-length", "0"))
        if len(self.buf) < end + 4 + n:
            return None
        body = self.buf[end + 4:end + 4 + n]
        self.buf = self.buf[end + 4 + n:]
        if headers.get("connection", "").lower() == "close":
            self.connect()
        return status, headers, body

    def wait_response(self, timeout=5.0):
        deadline = time.perf_counter() + timeout
        r = self.parse()
        while r is None:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError("no response within %.1f s" % timeout)
            select.select([self.sock], [], [], left)
            r = self.poll_response()
        return r

    def request(self, method, path, headers, body=b"", timeout=5.0):
        self.send(method, path, headers, body)
        return self.wait_response(timeout)


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a-admin", type=int, required=True, help="instance A's admin port")
    ap.add_argument("--b-public", type=int, required=True, help="instance B's public port")
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--mode", choices=("token", "run", "both"), default="both",
                    help="revoke by token, by run, or alternate (default)")
    ap.add_argument("--deadline-ms", type=float, default=2000.0, help="per token: give up on B's 401 after this")
    ap.add_argument("--rpc-path", default="/api/sandbox/rpc")
    args = ap.parse_args()
    secret = os.environ.get("SANDBOX_BROKER_ADMIN_SECRET")
    if not secret:
        sys.stderr.write("revoke_probe: SANDBOX_BROKER_ADMIN_SECRET is not set\n")
        return 2

    admin = Conn(args.a_admin)
    pub = Conn(args.b_public)
    auth = {"Authorization": "Bearer " + secret, "Content-Type": "application/json"}
    call_body = json.dumps({"method": "services.billing.charge", "args": {}}).encode()
    tag = "%d-%d" % (os.getpid(), int(time.time()))

    delays = {"token": [], "run": []}
    revoke_rtt = []
    probes_per_token = []
    early = 0
    failures = []
    t_start = time.perf_counter()
    for i in range(args.tokens):
        mode = args.mode if args.mode != "both" else ("token" if i % 2 == 0 else "run")
        run_id = "revoke-bench-%s-%d" % (tag, i)
        st, _, body = admin.request("POST", "/admin/v1/tokens", auth,
                                    json.dumps({"runId": run_id, "capabilities": CAPS, "ttlMs": 600000}).encode())
        if st != 201:
            failures.append("token %d: mint answered %d %r" % (i, st, body[:200]))
            continue
        token = json.loads(body)["token"]
        hdrs = {TOKEN_HEADER: token, "Content-Type": "application/json"}
        # three calls: B then answers from the record it keeps while Redis tracks it (and its leased quota),
        # so what is measured is the invalidation reaching B, not B asking Redis
        for _ in range(3):
            st, _, body = pub.request("POST", args.rpc_path, hdrs, call_body)
            if st != 501:
                break
        if st != 501:
            failures.append("token %d: the call on B before the revocation answered %d %r" % (i, st, body[:200]))
            continue

        path = "/admin/v1/tokens/" + token if mode == "token" else "/admin/v1/runs/" + run_id
        t_del = time.perf_counter()
        admin.send("DELETE", path, {"Authorization": "Bearer " + secret})
        pub.send("POST", args.rpc_path, hdrs, call_body)
        probes = 1
        t204 = t401 = None
        deadline = t_del + args.deadline_ms / 1000.0
        problem = None
        while (t204 is None or t401 is None) and problem is None:
            left = deadline - time.perf_counter()
            if left <= 0:
                problem = "no %s within %.0f ms" % ("204 from A" if t204 is None else "401 from B", args.deadline_ms)
                break
            waiting = ([admin.sock] if t204 is None else []) + ([pub.sock] if t401 is None else [])
            ready, _, _ = select.select(waiting, [], [], left)
            now = time.perf_counter()
            if admin.sock in ready and t204 is None:
                r = admin.poll_response()
                if r is not None:
                    if r[0] != 204:
                        problem = "revocation answered %d %r" % (r[0], r[2][:200])
                    t204 = now
            if pub.sock in ready and t401 is None:
                r = pub.poll_response()
                if r is not None:
                    if r[0] == 401:
                        t401 = now
                    elif r[0] == 501:
                        pub.send("POST", args.rpc_path, hdrs, call_body)
                        probes += 1
                    else:
                        problem = "a call on B during the revocation answered %d %r" % (r[0], r[2][:200])
        if problem is not None:
            failures.append("token %d (%s): %s" % (i, mode, problem))
            # resynchronise both connections for the next token
            admin.connect()
            pub.connect()
            continue
        d = (t401 - t204) * 1000.0
        if d < 0:
            early += 1
        delays[mode].append(max(0.0, d))
        revoke_rtt.append((t204 - t_del) * 1000.0)
        probes_per_token.append(probes)
        if (i + 1) % 100 == 0:
            sys.stderr.write("  %d tokens, %d failures, %.1f s\n" % (i + 1, len(failures), time.perf_counter() - t_start))

    allv = sorted(delays["token"] + delays["run"])
    print("revoke-to-refusal delay on instance B, measured from A's 204 (ms; refusals that arrived before the 204 "
          "count as 0):")
    print("  %-10s %7s %8s %8s %8s %8s" % ("revoked by", "tokens", "p50", "p90", "p99", "max"))
    for name, v in (("token", sorted(delays["token"])), ("run", sorted(delays["run"])), ("all", allv)):
        if v:
            print("  %-10s %7d %8.3f %8.3f %8.3f %8.3f" % (name, len(v), percentile(v, 50), percentile(v, 90),
                                                        percentile(v, 99), v[-1]))
    rr = sorted(revoke_rtt)
    if rr:
        print("  revocation round trip on A (DELETE sent -> 204): p50 %.3f ms, p99 %.3f ms" %
              (percentile(rr, 50), percentile(rr, 99)))
        print("  B refused before the host had the 204: %d of %d; calls on B per revocation: max %d" %
              (early, len(allv), max(probes_per_token)))
    for f in failures[:20]:
        print("  FAILURE " + f)
    if allv:
        p99 = percentile(allv, 99)
        print("target p99 <= 10 ms: %s (p99 %.3f ms)" % ("met" if p99 <= 10.0 else "NOT met", p99))
        print("RESULT tokens=%d p50_ms=%.3f p99_ms=%.3f max_ms=%.3f early=%d failures=%d" %
              (len(allv), percentile(allv, 50), p99, allv[-1], early, len(failures)))
    else:
        print("RESULT tokens=0 failures=%d" % len(failures))
    return 1 if failures or not allv else 0


if __name__ == "__main__":
    sys.exit(main())

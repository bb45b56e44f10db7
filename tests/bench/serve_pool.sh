#!/usr/bin/env bash
# Warm starts: run latency and throughput of `sandbox-shim serve` (its pool of pre-started guests,
# the jail on, as shipped) against a baseline measured in the same invocation: a small Deno
# supervisor that does per run what the upstream QuestPie supervisor does
# (tests/bench/upstream_supervisor.ts: Deno.serve, one `deno run` per run with
# --v8-flags=--max-old-space-size, an empty environment, cwd /, the guest as a data: module,
# Worker nulled, SharedArrayBuffer and Atomics deleted). Serve with --pool-size 0 (every run cold,
# through the same launcher) is measured too.
#
# For each server: BENCH_SEQ runs one after another (p50 and p90 latency, from the request's first
# byte to the last of its answer), then BENCH_N runs from 4 clients at once (runs per second;
# BENCH_N is many times the pool, so the pool's refill is what is measured, not its first guests).
# Every answer is checked (ok:true, output 42); a failed run fails the script. Loopback only.
# Targets (issue "warm starts"): sequential p50 at most 0.3x the baseline's, throughput with 4
# clients at least 2x.
#
# Environment (all optional): SHIM, DENO_BIN / SB_DENO / SB_NODE_PREFIX, BENCH_SEQ (default 30),
# BENCH_N (default 120), BENCH_POOL (serve's --pool-size, default 2).
# Output: a line per server and measurement, then the ratios. Informational: exit 0 whenever every
# run succeeded.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHIM=${SHIM:-$ROOT/build/bin/sandbox-shim}
DENO=${DENO_BIN:-${SB_DENO:-}}
if [ -z "$DENO" ] && [ -n "${SB_NODE_PREFIX:-}" ] && [ -x "$SB_NODE_PREFIX/node_modules/.bin/deno" ]; then
    DENO=$SB_NODE_PREFIX/node_modules/.bin/deno
fi
DENO=${DENO:-$(command -v deno || true)}
SEQ=${BENCH_SEQ:-30}
N=${BENCH_N:-120}
POOL=${BENCH_POOL:-2}

die() { printf 'serve_pool.sh: %s\n' "$*" >&2; exit 1; }
[ -x "$SHIM" ] || die "no shim binary at $SHIM (cmake -S . -B build && cmake --build build -j2)"
[ -n "$DENO" ] && [ -x "$DENO" ] || die "no deno (set DENO_BIN, SB_DENO or SB_NODE_PREFIX)"
case "$SEQ$N$POOL" in *[!0-9]*) die "BENCH_SEQ, BENCH_N and BENCH_POOL must be numbers" ;; esac
[ "$SEQ" -ge 4 ] && [ "$N" -ge 8 ] && [ "$N" -le 10000 ] || die "BENCH_SEQ >= 4, BENCH_N 8..10000"
DENO=$(readlink -f "$DENO")

WORK=$(mktemp -d /tmp/sb-bench-pool.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
chmod 0711 "$WORK"
printf 'load average: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
printf 'deno %s; %s sequential runs, %s runs from 4 clients; serve --pool-size %s\n' \
    "$("$DENO" --version | head -n1 | cut -d' ' -f2)" "$SEQ" "$N" "$POOL"

exec /usr/bin/python3 - "$SHIM" "$DENO" "$SEQ" "$N" "$POOL" "$WORK" "$ROOT/tests/bench/upstream_supervisor.ts" <<'PY'
import http.client, json, os, statistics, subprocess, sys, threading, time

shim, deno, seq, n, pool, work, upstream_ts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
SECRET = "serve-bench-admission-secret-0123456789abcdef"
BODY = json.dumps({"mode": "host", "source": "export default (i) => i.n * 2", "input": {"n": 21},
                   "capabilities": {"net": [], "import": [], "timeoutMs": 10000, "memoryMb": 128}})
HEADERS = {"content-type": "application/json", "x-questpie-sandbox-host-admission": SECRET}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


class Server:
    def __init__(self, name, argv, env, ready):
        self.name = name
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.port = ready(self.p)
        threading.Thread(target=lambda: [None for _ in self.p.stderr], daemon=True).start()
        threading.Thread(target=lambda: [None for _ in self.p.stdout], daemon=True).start()

    def one(self, state):
        c = state.get("c")
        if c is None:
            c = state["c"] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", "/run", BODY, HEADERS)
        r = c.getresponse()
        o = json.loads(r.read())
        if r.status != 200 or o.get("ok") is not True or o.get("output") != 42:
            raise SystemExit("%s: run failed: %d %r" % (self.name, r.status, o))

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()


def serve_ready(p):
    for raw in p.stderr:
        ev = json.loads(raw)
        if ev.get("event") == "listening":
            return ev["port"]
    raise SystemExit("serve did not start")


def upstream_ready(p):
    line = p.stdout.readline().decode()
    if not line.startswith("listening "):
        raise SystemExit("the baseline did not start: %r" % line)
    return int(line.split()[1])


def measure(s):
    state = {}
    for _ in range(3):
        s.one(state)  # warm-up: connections, the pool's first guests, Deno's page cache
    time.sleep(1.0)   # the pool refilled
    lat = []
    for _ in range(seq):
        t0 = time.monotonic()
        s.one(state)
        lat.append((time.monotonic() - t0) * 1000)
        time.sleep(0.05)
    left, lock = [n], threading.Lock()

    def worker():
        st = {}
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            s.one(st)

    ts = [threading.Thread(target=worker) for _ in range(4)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    rps = n / (time.monotonic() - t0)
    print("%-22s p50 %7.1f ms  p90 %7.1f ms  4 clients %6.1f runs/s" % (s.name, pct(lat, 50), pct(lat, 90), rps), flush=True)
    return pct(lat, 50), rps


env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
env["SANDBOX_HOST_ADMISSION_SECRET"] = SECRET
env["TMPDIR"] = work
results = {}
for name, argv, ready in (
        ("baseline (upstream)", [deno, "run", "--no-prompt", "--allow-net=127.0.0.1", "--allow-run=" + deno, upstream_ts, deno],
         upstream_ready),
        ("serve, pool", [shim, "serve", "--listen", "127.0.0.1:0", "--deno", deno, "--max-runs", "8", "--pool-size", pool],
         serve_ready),
        ("serve, no pool", [shim, "serve", "--listen", "127.0.0.1:0", "--deno", deno, "--max-runs", "8", "--pool-size", "0"],
         serve_ready)):
    s = Server(name, argv, env, ready)
    try:
        results[name] = measure(s)
    finally:
        s.stop()
base = results["baseline (upstream)"]
for name in ("serve, pool", "serve, no pool"):
    p50, rps = results[name]
    print("%-22s p50 %.2fx the baseline's (target <= 0.3 with the pool)  throughput %.2fx (target >= 2)"
          % (name, p50 / base[0], rps / base[1]))
PY

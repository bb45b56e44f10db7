#!/usr/bin/env bash
# Runs per second and p50 run latency of a trivial guest through `sandbox-shim serve`, with the
# kernel jail around every guest (the default) against --jail=off measured in the same
# invocation, as ratios.
#
# What runs (loopback only, everything in a temporary directory, every process stopped at exit):
#   - `sandbox-shim serve` on a free port, started once per side and round, with --jail=off and
#     with --jail=on alternating (which goes first alternates too); a client (Python,
#     BENCH_CONCURRENCY threads, one kept-alive connection each) posts BENCH_N runs of
#     `export default (i) => i.n + 1` the way the upstream adapter does, and times each from the
#     request's first byte to the last of its answer.
#   - the jail's cost is the on/off ratio of runs per second and of p50 latency (budget: the p50
#     ratio below 1.10).
# Every answer is checked (ok:true, output 42, and from the jailed side a guest that is pid 1 of
# its own namespace); a failed run fails the script.
# Most of a run is Deno starting (about 100 ms on the VM this was written on); what the jail adds
# (a clone into new namespaces, the id maps, the filter) is small next to it.
#
# Environment (all optional):
#   SHIM                 the binary (default: build/bin/sandbox-shim)
#   DENO_BIN / SB_DENO   the Deno binary (default: SB_NODE_PREFIX/node_modules/.bin/deno, then deno)
#   BENCH_N              timed runs per measurement (default 40)
#   BENCH_WARMUP         untimed runs first (default 4)
#   BENCH_CONCURRENCY    runs at once (default: online CPUs)
#   BENCH_ROUNDS         alternating rounds (default 2)
# Output: per round and per side runs/s and p50/p90 (ms), then the median ratios. Informational:
# the exit status is 0 whenever every run succeeded, whatever the numbers.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHIM=${SHIM:-$ROOT/build/bin/sandbox-shim}
DENO=${DENO_BIN:-${SB_DENO:-}}
if [ -z "$DENO" ] && [ -n "${SB_NODE_PREFIX:-}" ] && [ -x "$SB_NODE_PREFIX/node_modules/.bin/deno" ]; then
    DENO=$SB_NODE_PREFIX/node_modules/.bin/deno
fi
DENO=${DENO:-$(command -v deno || true)}
N=${BENCH_N:-40}
WARMUP=${BENCH_WARMUP:-4}
CONC=${BENCH_CONCURRENCY:-$(nproc)}
ROUNDS=${BENCH_ROUNDS:-2}

die() { printf 'serve.sh: %s\n' "$*" >&2; exit 1; }
[ -x "$SHIM" ] || die "no shim binary at $SHIM (cmake -S . -B build && cmake --build build -j2)"
[ -n "$DENO" ] && [ -x "$DENO" ] || die "no deno (set DENO_BIN, SB_DENO or SB_NODE_PREFIX)"
case "$N$WARMUP$CONC$ROUNDS" in *[!0-9]*) die "BENCH_N, BENCH_WARMUP, BENCH_CONCURRENCY, BENCH_ROUNDS must be numbers" ;; esac
[ "$N" -ge 4 ] && [ "$N" -le 10000 ] || die "BENCH_N must be 4..10000"
[ "$CONC" -ge 1 ] && [ "$CONC" -le 64 ] || die "BENCH_CONCURRENCY must be 1..64"

WORK=$(mktemp -d /tmp/sb-bench-serve.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
chmod 0711 "$WORK" # jailed guests run as other uids and reach their homes below it
printf 'load average: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
printf 'deno %s, %s runs per measurement, %s at once, %s rounds, jail off and on\n' \
    "$("$DENO" --version | head -n1 | cut -d' ' -f2)" "$N" "$CONC" "$ROUNDS"

exec /usr/bin/python3 - "$SHIM" "$DENO" "$N" "$WARMUP" "$CONC" "$ROUNDS" "$WORK" <<'PY'
import http.client, json, os, signal, statistics, subprocess, sys, threading, time

shim, deno, n, warmup, conc, rounds, work = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7]), sys.argv[7]
SECRET = "serve-bench-admission-secret-0123456789abcdef"
SRC = "export default (i) => [i.n + 1, Deno.pid]"
BODY = json.dumps({"mode": "host", "source": SRC, "input": {"n": 41},
                   "capabilities": {"net": [], "import": [], "timeoutMs": 10000, "memoryMb": 128}, "secrets": {}})


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def fan_out(count, one):
    """Runs `one` count times over conc threads; returns (wall seconds, latencies in ms)."""
    lat, lock, left = [], threading.Lock(), [count]

    def worker():
        state = {}
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            t0 = time.monotonic()
            one(state)
            dt = (time.monotonic() - t0) * 1000
            with lock:
                lat.append(dt)

    ts = [threading.Thread(target=worker) for _ in range(conc)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.monotonic() - t0, lat


class Serve:
    def __init__(self, extra, jailed):
        self.jailed = jailed
        env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
        env["SANDBOX_HOST_ADMISSION_SECRET"] = SECRET
        env["TMPDIR"] = work
        self.p = subprocess.Popen([shim, "serve", "--listen", "127.0.0.1:0", "--deno", deno, "--max-runs", str(conc)] + extra,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ev = json.loads(self.p.stderr.readline())
        assert ev["event"] == "listening", ev
        self.port = ev["port"]
        threading.Thread(target=lambda: [None for _ in self.p.stderr], daemon=True).start()

    def one(self, state):
        c = state.get("c")
        if c is None:
            c = state["c"] = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("POST", "/run", BODY, {"content-type": "application/json", "x-questpie-sandbox-host-admission": SECRET})
        r = c.getresponse()
        o = json.loads(r.read())
        out = o.get("output") or [None, None]
        if r.status != 200 or o.get("ok") is not True or out[0] != 42 or (out[1] == 1) != self.jailed:
            raise SystemExit("serve run failed: %d %r" % (r.status, o))

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait(60)


def measure(name, one):
    fan_out(warmup, one)
    wall, lat = fan_out(n, one)
    r = {"rps": n / wall, "p50": pct(lat, 50), "p90": pct(lat, 90)}
    print("  %-12s %7.1f runs/s   p50 %7.1f ms   p90 %7.1f ms" % (name, r["rps"], r["p50"], r["p90"]), flush=True)
    return r


def side(jailed):
    s = Serve(["--jail=on" if jailed else "--jail=off"], jailed)
    try:
        return measure("jail on" if jailed else "jail off", s.one)
    finally:
        s.stop()


ratios = {"rps": [], "p50": []}
for rnd in range(1, rounds + 1):
    print("round %d" % rnd, flush=True)
    first_on = rnd % 2 == 0
    r = {}
    for jailed in (first_on, not first_on):
        r[jailed] = side(jailed)
    ratios["rps"].append(r[True]["rps"] / r[False]["rps"])
    ratios["p50"].append(r[True]["p50"] / r[False]["p50"])
print("median ratios (jail on / jail off): runs/s %.2f, p50 latency %.2f" % (statistics.median(ratios["rps"]),
                                                                            statistics.median(ratios["p50"])))
print("jail cost on p50: %s (budget: < 10 %%)" % ("met" if statistics.median(ratios["p50"]) < 1.10 else "NOT met"))
PY

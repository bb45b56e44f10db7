#!/usr/bin/env bash
# Relay round-trip latency: guest -> sandbox-shim -> broker -> sandbox-shim -> guest, against the
# same call made directly from a C client to the same broker, in one run, as a ratio.
#
# What runs (all on loopback, everything in a temporary directory, every process stopped at exit):
#   - the real broker (build/bin/sandbox-broker), memory token store, call logging off (so the
#     broker's own cost is small and the ratio shows the relay's overhead at its most visible);
#     a token minted through POST /admin/v1/tokens for {"services":["svc"]}, with a calls quota
#     that covers the whole run (the default quota of 1,024 calls per run would answer 429).
#   - direct: tests/bench/relay_direct.c, one kept-alive HTTP/1.1 connection, WARMUP + N
#     sequential POSTs byte-for-byte like the shim's (msgpack {method:"services.svc.fn", args:{}}).
#   - relay:  `sandbox-shim relay --on-denial reply -- relay_guest N WARMUP`; the guest
#     (tests/bench/relay_guest.c) writes one call frame, waits for its reply frame, and repeats.
#     The granted call answers not_implemented (HTTP 501), which --on-denial reply hands back.
#   - relay, jail off: the same, with --jail=off; the "jail on/off" line is the median per-round
#     ratio of the two relay rows (the jail's cost per call: the seccomp filter on the guest's
#     system calls).
#   - trivial runs: whole invocations, spawn to outcome, timed by bash ($EPOCHREALTIME, no fork),
#     jail off and on alternating: `relay -- relay_guest 1 0` (a C guest making one call) and, when
#     Deno is found, `run` of `export default () => 1;`. The jail's cost per run (clone into the
#     namespaces, id maps, uid lock, filter load) shows here; the target is < 1.10x, informational.
#     Measured on the 2-core VM (40 runs each): per call 1.07x; a Deno run 64.0 -> 64.7 ms (1.01x);
#     the C guest's run 6.9 -> 8.3 ms (1.21x). That 1.4 ms is the jail's fixed cost per run, about
#     0.6 ms of it the kernel creating and tearing down the network namespace, 0.25 ms compiling
#     the filter with libseccomp (once per process: a service pays it once, `run` every time).
#   Each sample is one round trip timed by the client itself (CLOCK_MONOTONIC, before the write to
#   after the whole answer is read); the warm-up calls are not counted. Both clients check every
#   answer is the broker's not_implemented error. Direct, relay (jailed, the default) and relay
#   with --jail=off alternate for ROUNDS rounds.
#
# Output: per round p50/p99 (microseconds) for both paths and the p50 ratio relay/direct; then the
# median over the rounds of the per-round ratios (p50 and p99). The target, relay p50 <= 1.5x
# direct p50, is informational: it is printed as met or not and never fails the script.
#
# Reading it: the relay adds two pipe hops and two process wake-ups (guest <-> shim) to the
# direct path's loopback TCP hop, plus the shim's frame decode, request build and reply encode.
# At these latencies (tens of microseconds) where the scheduler places the processes matters
# more than any of that: on the 2-core VM this was written on, a wake-up across cores cost about
# 15 us and one on the same core about 2 us, so unpinned runs swung between 1.2x and 2.1x from
# one invocation to the next. The default therefore pins every process (broker, direct client,
# shim, guest) to core 0 (BENCH_PIN=one): each hop is then a same-core wake-up, and the ratio
# measures the work and the extra hops the relay adds, not the scheduler's luck. BENCH_PIN=split
# puts the broker on core 1 and the client side on core 0 (every broker hop crosses cores);
# BENCH_PIN=none leaves placement to the kernel. Other load on the machine skews all of them;
# the load average is printed first. A perf profile of the shim in this benchmark showed its own
# code (frame decode, HTTP head parse, msgpack) at a few percent of its samples: the rest is the
# kernel switching tasks. Per call the shim makes 6 system calls (2 poll, read and write on the
# guest's pipes, send and recv on the broker connection), and on one core a round trip is 4 task
# switches instead of the direct path's 2, so about 1.7x on one core is the architecture's floor
# while the broker answers in a few microseconds; the further away and the busier the broker,
# the closer the ratio gets to 1. The guest writes each frame with a single write(), as the Deno
# runtime does (a separate 4-byte header write costs the shim an extra wake-up per call).
#
# Environment (all optional):
#   BROKER / SHIM        binaries (default: build/bin/sandbox-broker, build/bin/sandbox-shim)
#   BENCH_N              timed round trips per run (default 10000)
#   BENCH_WARMUP         untimed round trips before them (default 1000)
#   BENCH_ROUNDS         alternating direct/relay rounds (default 3)
#   BENCH_THREADS        broker worker threads (default 1)
#   BENCH_PIN            one (default), split or none, as described above (taskset)
#   BENCH_BUILD_DIR      where the two clients are built (default: build/bench)
#   BENCH_KEEP=1         keep the work directory (broker log, raw results)
#   BENCH_TRIVIAL_RUNS   trivial runs of each kind, jail off and on (default 30)
#   SB_DENO / SB_NODE_PREFIX  Deno for the trivial `run` rows (left out without it)
# Needs gcc, pkg-config, libmsgpack-dev and curl. Takes a few seconds with the defaults; the runs
# share a 45-second budget (each runs under `timeout` with what is left), so even a hung process
# cannot keep the script past a minute.
# Exit status: 0 when every run completed with only the expected answers; 1 otherwise.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
SHIM=${SHIM:-$ROOT/build/bin/sandbox-shim}
N=${BENCH_N:-10000}
WARMUP=${BENCH_WARMUP:-1000}
ROUNDS=${BENCH_ROUNDS:-3}
THREADS=${BENCH_THREADS:-1}
BUILD_DIR=${BENCH_BUILD_DIR:-$ROOT/build/bench}
TRIVIAL_RUNS=${BENCH_TRIVIAL_RUNS:-30}
# Deno for the trivial `run` rows: SB_DENO, else SB_NODE_PREFIX/node_modules/.bin/deno; without it those rows are left out
DENO=${SB_DENO:-}
if [ -z "$DENO" ] && [ -n "${SB_NODE_PREFIX:-}" ] && [ -x "$SB_NODE_PREFIX/node_modules/.bin/deno" ]; then
    DENO=$SB_NODE_PREFIX/node_modules/.bin/deno
fi
SECRET="relay-bench-secret-$$-0123456789abcdef"

say() { printf '%s\n' "$*" >&2; }
die() { say "relay.sh: $*"; exit 1; }

for tool in gcc pkg-config curl timeout; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y gcc pkg-config curl coreutils)"
done
pkg-config --exists msgpack || die "msgpack-c not found (apt-get install -y libmsgpack-dev)"
[ -x "$BROKER" ] || die "no broker binary at $BROKER (cmake -S . -B build && cmake --build build -j2)"
[ -x "$SHIM" ] || die "no shim binary at $SHIM (cmake -S . -B build && cmake --build build -j2)"
case "$N$WARMUP$ROUNDS$TRIVIAL_RUNS" in *[!0-9]*) die "BENCH_N, BENCH_WARMUP, BENCH_ROUNDS and BENCH_TRIVIAL_RUNS must be numbers" ;; esac
[ "$TRIVIAL_RUNS" -ge 1 ] && [ "$TRIVIAL_RUNS" -le 500 ] || die "BENCH_TRIVIAL_RUNS must be 1..500"
[ "$N" -ge 100 ] && [ "$N" -le 100000 ] || die "BENCH_N must be 100..100000"
[ "$WARMUP" -le 100000 ] || die "BENCH_WARMUP must be 0..100000"
[ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 10 ] || die "BENCH_ROUNDS must be 1..10"

PIN=${BENCH_PIN:-one}
SRV_PIN=() CLI_PIN=()
case "$PIN" in
none) ;;
one)
    command -v taskset >/dev/null || die "BENCH_PIN=one needs taskset (util-linux); BENCH_PIN=none runs unpinned"
    SRV_PIN=(taskset -c 0) CLI_PIN=(taskset -c 0) ;;
split)
    command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ] || die "BENCH_PIN=split needs taskset and 2+ cores"
    SRV_PIN=(taskset -c 1) CLI_PIN=(taskset -c 0) ;;
*) die "BENCH_PIN must be one, split or none" ;;
esac

WORK=$(mktemp -d /tmp/sb-relay-bench.XXXXXX)
BROKER_PID=
cleanup() {
    if [ -n "$BROKER_PID" ]; then
        kill -TERM "$BROKER_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$BROKER_PID" 2>/dev/null
        wait "$BROKER_PID" 2>/dev/null
    fi
    if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the two clients ---
mkdir -p "$BUILD_DIR" || die "cannot create $BUILD_DIR"
for prog in relay_guest relay_direct; do
    src=$ROOT/tests/bench/$prog.c
    if [ ! -x "$BUILD_DIR/$prog" ] || [ "$src" -nt "$BUILD_DIR/$prog" ] ||
        [ "$ROOT/tests/bench/relay_common.h" -nt "$BUILD_DIR/$prog" ]; then
        # shellcheck disable=SC2046
        gcc -std=c11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Werror -o "$BUILD_DIR/$prog" "$src" \
            $(pkg-config --cflags --libs msgpack) || die "$prog build failed"
    fi
done

# --- the broker ---
LOG=$WORK/broker.log
SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
    SANDBOX_BROKER_THREADS=$THREADS SANDBOX_BROKER_TOKEN_STORE=memory SANDBOX_BROKER_LOG_CALLS=false \
    "${SRV_PIN[@]}" "$BROKER" 2>"$LOG" >/dev/null </dev/null &
BROKER_PID=$!
for _ in $(seq 100); do
    grep -q '"event":"started"' "$LOG" 2>/dev/null && break
    kill -0 "$BROKER_PID" 2>/dev/null || die "broker exited: $(cat "$LOG")"
    sleep 0.05
done
grep -q '"event":"started"' "$LOG" || die "broker did not start: $(cat "$LOG")"
PORT=$(sed -n 's/.*"event":"listening".*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$LOG" | head -1)
ADMIN=$(sed -n 's/.*"event":"listening".*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$LOG" | head -1)
[ -n "$PORT" ] && [ -n "$ADMIN" ] || die "no ports in the broker log: $(cat "$LOG")"
# every call counts against the run's quota (default 1,024): allow all of this run's calls
QUOTA=$((ROUNDS * 3 * (N + WARMUP) + 2 * TRIVIAL_RUNS + 100))
body=$(curl -s --max-time 5 -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
    -d "{\"runId\":\"bench\",\"capabilities\":{\"services\":[\"svc\"]},\"quotas\":{\"calls\":$QUOTA}}" \
    "http://127.0.0.1:$ADMIN/admin/v1/tokens") ||
    die "mint failed"
SB_BENCH_TOKEN=$(printf '%s' "$body" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
[ -n "$SB_BENCH_TOKEN" ] || die "mint answered: $body"
export SB_BENCH_TOKEN

BUDGET_END=$((SECONDS + 45))
# seconds left of the budget for the next run; fails the run when it is spent
budget() {
    local left=$((BUDGET_END - SECONDS))
    [ "$left" -ge 1 ] || { say "relay.sh: the 45-second budget is spent; skipping the rest"; return 1; }
    echo "$left"
}

RESULTS=$WORK/results.txt
: >"$RESULTS"
FAILED=0

run_direct() { # ROUND
    local line left
    left=$(budget) || { FAILED=1; return; }
    line=$(timeout "$left" "${CLI_PIN[@]}" "$BUILD_DIR/relay_direct" "$PORT" "$N" "$WARMUP" 2>"$WORK/direct.err" | grep '^BENCH ')
    if [ -z "$line" ]; then
        say "round $1 direct: failed: $(cat "$WORK/direct.err")"; FAILED=1; return
    fi
    echo "direct $1 ${line#BENCH }" >>"$RESULTS"
}

run_relay() { # ROUND JAIL(on|off)
    local out field v left line="" name=relay
    [ "$2" = off ] && name=relayoff
    left=$(budget) || { FAILED=1; return; }
    # the token reaches the shim through --token-env only; the shim scrubs it before spawning the guest
    out=$(timeout "$left" "${CLI_PIN[@]}" "$SHIM" relay --jail="$2" --broker-url "http://127.0.0.1:$PORT/api/sandbox/rpc" \
        --token-env SB_BENCH_TOKEN --on-denial reply --max-calls $((N + WARMUP)) \
        --timeout-ms $((left * 1000)) -- "$BUILD_DIR/relay_guest" "$N" "$WARMUP" 2>"$WORK/relay.err")
    case "$out" in
    '{"ok":true,"output":{'*) ;;
    *) say "round $1 relay: failed: $out $(cat "$WORK/relay.err")"; FAILED=1; return ;;
    esac
    for field in n min_ns p50_ns p90_ns p99_ns max_ns mean_ns; do
        v=$(printf '%s' "$out" | sed -n "s/.*\"$field\":\([0-9]*\).*/\1/p")
        [ -n "$v" ] || { say "round $1 relay: no $field in $out"; FAILED=1; return; }
        line="$line $field=$v"
    done
    echo "$name $1${line}" >>"$RESULTS"
}

# One whole run, start to outcome, as the host sees it: spawn (and jail), init, the guest's work,
# result, exit. KIND relay: relay_guest making 1 call; KIND deno: `run` of a module returning a
# constant. Jail off and on alternate, TRIVIAL_RUNS of each; prints "KIND off_p50_us on_p50_us".
trivial_runs() { # KIND
    local i mode t0 t1 out left
    : >"$WORK/trivial-off" && : >"$WORK/trivial-on"
    for i in $(seq "$TRIVIAL_RUNS"); do
        for mode in off on; do
            left=$(budget) || return 1
            t0=$EPOCHREALTIME
            if [ "$1" = relay ]; then
                out=$(timeout "$left" "${CLI_PIN[@]}" "$SHIM" relay --jail="$mode" \
                    --broker-url "http://127.0.0.1:$PORT/api/sandbox/rpc" --token-env SB_BENCH_TOKEN --on-denial reply \
                    -- "$BUILD_DIR/relay_guest" 1 0 2>"$WORK/trivial.err")
            else
                out=$(timeout "$left" "${CLI_PIN[@]}" "$SHIM" run --jail="$mode" \
                    --broker-url "http://127.0.0.1:$PORT/api/sandbox/rpc" --token-env SB_BENCH_TOKEN \
                    --source "$WORK/trivial.js" --deno "$DENO" 2>"$WORK/trivial.err")
            fi
            t1=$EPOCHREALTIME
            case "$out" in
            '{"ok":true'*) ;;
            *) say "trivial $1 run (jail $mode) failed: $out $(cat "$WORK/trivial.err")"; return 1 ;;
            esac
            echo $(( (${t1/./} - ${t0/./}) )) >>"$WORK/trivial-$mode"
        done
    done
    echo "$1 $(sort -n "$WORK/trivial-off" | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}') \
$(sort -n "$WORK/trivial-on" | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')" >>"$WORK/trivial.txt"
}

echo "relay latency benchmark: $(nproc) cores, broker threads=$THREADS, pin=$PIN, N=$N (+$WARMUP warm-up) x $ROUNDS rounds"
echo "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
    run_direct "$r"
    run_relay "$r" on
    run_relay "$r" off
done
: >"$WORK/trivial.txt"
trivial_runs relay || FAILED=1
if [ -n "$DENO" ]; then
    echo 'export default () => 1;' >"$WORK/trivial.js"
    trivial_runs deno || FAILED=1
fi
kill -0 "$BROKER_PID" 2>/dev/null || { say "the broker died: $(tail -5 "$LOG")"; exit 1; }

awk -v rounds="$ROUNDS" '
function val(k,   i, a) { for (i = 3; i <= NF; ++i) { split($i, a, "="); if (a[1] == k) return a[2] } return -1 }
function median(v, m,   i, j, t) {
    for (i = 2; i <= m; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
}
{ p50[$1, $2] = val("p50_ns"); p99[$1, $2] = val("p99_ns"); mean[$1, $2] = val("mean_ns"); n[$1, $2] = val("n") }
END {
    jm = 0
    for (r = 1; r <= rounds; ++r)
        if ((("relay", r) in p50) && (("relayoff", r) in p50)) {
            j50[++jm] = p50["relay", r] / p50["relayoff", r]; j99[jm] = p99["relay", r] / p99["relayoff", r]
        }
    printf "\n%-6s %6s %12s %12s %12s %12s %12s %12s %9s %9s\n", "round", "n", "direct p50", "direct p99", "direct mean",
        "relay p50", "relay p99", "relay mean", "p50 x", "p99 x"
    m = 0
    for (r = 1; r <= rounds; ++r) {
        if (!(("direct", r) in p50) || !(("relay", r) in p50)) continue
        r50 = p50["relay", r] / p50["direct", r]; r99 = p99["relay", r] / p99["direct", r]
        x50[++m] = r50; x99[m] = r99
        d50[m] = p50["direct", r]; d99[m] = p99["direct", r]; l50[m] = p50["relay", r]; l99[m] = p99["relay", r]
        printf "%-6d %6d %10.1fus %10.1fus %10.1fus %10.1fus %10.1fus %10.1fus %8.2fx %8.2fx\n", r, n["relay", r],
            p50["direct", r] / 1000, p99["direct", r] / 1000, mean["direct", r] / 1000,
            p50["relay", r] / 1000, p99["relay", r] / 1000, mean["relay", r] / 1000, r50, r99
    }
    if (m == 0) { print "no complete round"; exit 1 }
    md50 = median(d50, m); md99 = median(d99, m); ml50 = median(l50, m); ml99 = median(l99, m)
    g50 = median(x50, m); g99 = median(x99, m)
    printf "\nmedian over %d round(s): direct p50 %.1fus p99 %.1fus | relay p50 %.1fus p99 %.1fus\n", m,
        md50 / 1000, md99 / 1000, ml50 / 1000, ml99 / 1000
    printf "relay/direct ratio: p50 %.2fx, p99 %.2fx (median of the per-round ratios)\n", g50, g99
    printf "target relay p50 <= 1.5x direct (informational): %s\n", (g50 <= 1.5 ? "met" : "not met")
    if (jm > 0)
        printf "per call, jail on/off (relay rows above are jailed): p50 %.3fx, p99 %.3fx (median of per-round ratios)\n",
            median(j50, jm), median(j99, jm)
}' "$RESULTS" || FAILED=1
if [ -s "$WORK/trivial.txt" ]; then
    printf '\n%-22s %14s %14s %9s\n' "trivial run ($TRIVIAL_RUNS each)" "jail off p50" "jail on p50" "on/off"
    while read -r kind off on; do
        awk -v k="$kind" -v off="$off" -v on="$on" 'BEGIN {
            printf "%-22s %12.2fms %12.2fms %8.3fx   target < 1.10x (informational): %s\n",
                (k == "relay" ? "relay, C guest, 1 call" : "run, Deno, no call"), off / 1000, on / 1000, on / off,
                (on / off < 1.10 ? "met" : "not met") }'
    done <"$WORK/trivial.txt"
fi
[ "$FAILED" = 0 ] || say "relay.sh: some runs failed; see above"
exit "$FAILED"

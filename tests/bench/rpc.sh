#!/usr/bin/env bash
# RPC throughput benchmark: wrk against a raw h2o fixed-reply baseline and
# against the broker's RPC route (granted call -> 501, denied call -> 403),
# with the memory and the Redis token store, with per-call logging on (the
# default) and off, alternating the cases round by round in one run. The
# *-decide cases make the same granted call under a manifest with a decide
# axis whose rules do not name it (PROTOCOL.md section 5a): what a call that
# matches no rule pays, against the same case without the axis.
# See tests/bench/README.md for what it measures and how to read it.
#
# Environment (all optional):
#   BROKER          broker binary           (default: build/bin/sandbox-broker)
#   BENCH_SECONDS   seconds per measurement (default: 5)
#   BENCH_ROUNDS    alternating rounds      (default: 3)
#   BENCH_WARMUP    warm-up seconds per case, once (default: 1)
#   BENCH_CONNS     wrk connections         (default: 32)
#   BENCH_THREADS   server worker threads, same for baseline and broker (default: 1)
#   BENCH_SERVER_CPUS / BENCH_WRK_CPUS  taskset lists (default with >= 2 cores: 1 / 0)
#   BENCH_CASES     space-separated subset of the case names below (default: all)
#   BENCH_BUILD_DIR where the baseline binary is built (default: build/bench)
#   BENCH_KEEP=1    keep the work directory (logs, lua scripts, raw results)
# Exit status: 0 when every case ran and every response had the expected
# status (the target lines are informational); 1 otherwise.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
WARMUP=${BENCH_WARMUP:-1}
CONNS=${BENCH_CONNS:-32}
THREADS=${BENCH_THREADS:-1}
BUILD_DIR=${BENCH_BUILD_DIR:-$ROOT/build/bench}
SECRET="bench-admin-secret-$$-0123456789abcdef"
ALL_CASES="baseline mem-granted mem-denied mem-granted-nolog mem-denied-nolog redis-granted redis-denied redis-granted-nolog redis-denied-nolog mem-granted-decide mem-granted-nolog-decide"
CASES=${BENCH_CASES:-$ALL_CASES}

say() { printf '%s\n' "$*" >&2; }
die() { say "rpc.sh: $*"; exit 1; }

for tool in wrk curl redis-server taskset gcc pkg-config; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y wrk curl redis-server util-linux gcc pkg-config)"
done
[ -x "$BROKER" ] || die "no broker binary at $BROKER (build it: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j2)"

if [ "$(nproc)" -ge 2 ]; then
    SRV_CPUS=${BENCH_SERVER_CPUS:-1}
    WRK_CPUS=${BENCH_WRK_CPUS:-0}
    SRV_PIN=(taskset -c "$SRV_CPUS")
    WRK_PIN=(taskset -c "$WRK_CPUS")
else
    SRV_CPUS=any WRK_CPUS=any
    SRV_PIN=() WRK_PIN=()
fi

WORK=$(mktemp -d /tmp/sb-bench.XXXXXX)
PIDS=()
REDIS_PIDFILE=$WORK/redis.pid
WRK_PID=
cleanup() {
    local p
    [ -n "$WRK_PID" ] && kill -TERM "$WRK_PID" 2>/dev/null
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null
    done
    if [ -s "$REDIS_PIDFILE" ]; then
        kill -TERM "$(cat "$REDIS_PIDFILE")" 2>/dev/null
    fi
    for p in "${PIDS[@]}"; do
        # the broker drains and exits; never leave one behind
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the baseline binary ---
BASELINE=$BUILD_DIR/baseline
if [ ! -x "$BASELINE" ] || [ "$ROOT/tests/bench/baseline.c" -nt "$BASELINE" ]; then
    mkdir -p "$BUILD_DIR"
    # shellcheck disable=SC2046
    gcc -std=c11 -O2 -g -D_GNU_SOURCE -DH2O_USE_LIBUV=0 -Wall -Wextra -Wno-unused-parameter -Werror \
        -o "$BASELINE" "$ROOT/tests/bench/baseline.c" \
        $(pkg-config --cflags --libs libh2o-evloop libssl libcrypto) -lpthread || die "baseline build failed"
fi

# a port below the ephemeral range that no socket (in any state) uses
free_port() {
    local p lo
    lo=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)
    lo=${lo:-32768}
    for _ in $(seq 100); do
        p=$((10000 + RANDOM % (lo - 10000)))
        if [ -z "$(ss -Htan "sport = :$p" 2>/dev/null)" ]; then echo "$p"; return 0; fi
    done
    return 1
}

# wait_log FILE PATTERN: waits up to 5 s for a line matching PATTERN
wait_log() {
    for _ in $(seq 100); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

declare -A PORT ADMIN LOG PID_OF

start_baseline() {
    LOG[baseline]=$WORK/baseline.log
    "${SRV_PIN[@]}" "$BASELINE" 127.0.0.1:0 "$THREADS" >"${LOG[baseline]}" 2>&1 &
    PIDS+=($!)
    PID_OF[baseline]=$!
    wait_log "${LOG[baseline]}" '^listening port' || die "baseline did not start: $(cat "${LOG[baseline]}")"
    PORT[baseline]=$(awk '/^listening port/ {print $3; exit}' "${LOG[baseline]}")
}

# start_broker NAME STORE LOG_CALLS
start_broker() {
    local name=$1 log=$WORK/$1.log
    LOG[$name]=$log
    SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
        SANDBOX_BROKER_THREADS=$THREADS SANDBOX_BROKER_TOKEN_STORE=$2 SANDBOX_BROKER_LOG_CALLS=$3 \
        "${SRV_PIN[@]}" "$BROKER" 2>>"$log" >/dev/null &
    PIDS+=($!)
    PID_OF[$name]=$!
    wait_log "$log" '"event":"started"' || die "broker $name did not start: $(cat "$log")"
    PORT[$name]=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    ADMIN[$name]=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "${PORT[$name]}" ] && [ -n "${ADMIN[$name]}" ] || die "broker $name: no ports in $log"
    # the Redis store connects asynchronously: wait until it is ready
    for _ in $(seq 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$name]}/readyz")" = 200 ] && break
        sleep 0.05
    done
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$name]}/readyz")" = 200 ] ||
        die "broker $name is not ready: $(tail -5 "$log")"
}

# mint SERVER RUNID: prints a fresh token. Every measurement gets its own run, because the broker
# counts calls per run (quota_calls, at most 1,000,000 per run when raised at mint); the concurrency
# quota is raised above wrk's connection count. A broker without quotas gets the plain request.
# a decide axis naming other calls than the one measured (services.svc.fn): it must cost nothing
DECIDE_CAPS='"capabilities":{"services":["svc"],"decide":{"methods":["collections.posts.delete","store.*.create","tools.call"],"fetch":["pay.example",{"host":"*.stripe.example","methods":["POST"],"paths":["/v1/**"]}]}}'
mint() {
    local srv=$1 run=$2 body tok caps=${3:-'"capabilities":{"services":["svc"]}'}
    for extra in ',"quotas":{"calls":1000000,"concurrent":1024}' ''; do
        body=$(curl -s -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
            -d "{\"runId\":\"$run\",\"ttlMs\":3600000$extra,$caps}" \
            "http://127.0.0.1:${ADMIN[$srv]}/admin/v1/tokens")
        tok=$(printf '%s' "$body" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
        if [ -n "$tok" ]; then echo "$tok"; return 0; fi
        case $body in *quotas*) continue ;; esac # no quota support: retry without
        break
    done
    say "broker $srv: mint answered: $body"
    return 1
}

# Redis: retry on another port if the one picked was taken in the meantime
for attempt in 1 2 3 4 5; do
    REDIS_PORT=$(free_port) || die "no free port for Redis"
    "${SRV_PIN[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --pidfile "$REDIS_PIDFILE" --logfile "$WORK/redis.log" --dir "$WORK" >/dev/null || die "redis-server failed"
    for _ in $(seq 100); do
        [ -s "$REDIS_PIDFILE" ] && break
        grep -q 'aborting' "$WORK/redis.log" 2>/dev/null && break
        sleep 0.05
    done
    [ -s "$REDIS_PIDFILE" ] && break
    [ "$attempt" = 5 ] && die "redis-server did not start: $(tail -3 "$WORK/redis.log")"
    : >"$WORK/redis.log"
done

start_baseline
start_broker mem memory true
start_broker mem-nolog memory false
start_broker redis "redis://127.0.0.1:$REDIS_PORT" true
start_broker redis-nolog "redis://127.0.0.1:$REDIS_PORT" false

# case -> server, method, expected status
case_server() { case $1 in baseline) echo baseline ;; mem-*nolog*) echo mem-nolog ;; mem-*) echo mem ;; redis-*nolog*) echo redis-nolog ;; *) echo redis ;; esac; }
case_caps() { case $1 in *-decide) echo "$DECIDE_CAPS" ;; *) echo '"capabilities":{"services":["svc"]}' ;; esac; }
case_method() { case $1 in *denied*) echo services.other.fn ;; *) echo services.svc.fn ;; esac; }
case_expect() { case $1 in *denied*) echo 403 ;; *) echo 501 ;; esac; }

write_lua() { # CASE TOKEN -> $WORK/CASE.lua
    local c=$1 tok=$2
    cat >"$WORK/$c.lua" <<EOF
wrk.method = "POST"
wrk.path = "/api/sandbox/rpc"
wrk.body = '{"method":"$(case_method "$c")","args":{}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-questpie-sandbox-token"] = "$tok"
local expected = $(case_expect "$c")
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) good = 0; bad = 0; last_bad = 0 end
function response(status, headers, body)
  if status == expected then good = good + 1 else bad = bad + 1; last_bad = status end
end
function done(summary, latency, requests)
  local g, b, lb = 0, 0, 0
  for _, t in ipairs(threads) do
    g = g + t:get("good"); b = b + t:get("bad")
    if t:get("last_bad") ~= 0 then lb = t:get("last_bad") end
  end
  local e = summary.errors
  io.write(string.format("BENCH rps=%.1f p50_us=%d p99_us=%d requests=%d good=%d bad=%d last_bad=%d sockerr=%d\n",
    summary.requests / (summary.duration / 1e6), latency:percentile(50), latency:percentile(99),
    summary.requests, g, b, lb, e.connect + e.read + e.write + e.timeout))
end
EOF
}

# sanity: one request per case with the expected status, before any load
for c in $CASES; do
    case " $ALL_CASES " in *" $c "*) ;; *) die "unknown case $c (cases: $ALL_CASES)" ;; esac
    srv=$(case_server "$c")
    tok=$(printf '%064d' 0)
    if [ "$srv" != baseline ]; then tok=$(mint "$srv" "bench-check-$c-$$" "$(case_caps "$c")") || exit 1; fi
    got=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
        -H "x-questpie-sandbox-token: $tok" -d "{\"method\":\"$(case_method "$c")\",\"args\":{}}" \
        "http://127.0.0.1:${PORT[$srv]}/api/sandbox/rpc")
    [ "$got" = "$(case_expect "$c")" ] || die "case $c: expected $(case_expect "$c"), got $got"
done

FAILED=0
RESULTS=$WORK/results.txt
: >"$RESULTS"

# on-CPU nanoseconds of every thread of a process (/proc/PID/task/*/schedstat, first field)
cpu_ns_of() {
    local f a _ sum=0
    for f in /proc/"$1"/task/*/schedstat; do
        read -r a _ <"$f" 2>/dev/null && sum=$((sum + a))
    done
    echo "$sum"
}
# CPU spent serving a case: the server, plus redis-server for the Redis cases (it shares the server core)
server_cpu_ns() {
    local n
    n=$(cpu_ns_of "${PID_OF[$(case_server "$1")]}")
    case $1 in redis-*) n=$((n + $(cpu_ns_of "$(cat "$REDIS_PIDFILE")"))) ;; esac
    echo "$n"
}

# run_wrk CASE SECONDS ROUND (ROUND 0 = warm-up, not recorded)
run_wrk() {
    local c=$1 secs=$2 round=$3 srv out line tok cpu0 cpu1
    srv=$(case_server "$c")
    # the baseline ignores the token; it gets one of the same length so every request has the same size
    tok=$(printf '%064d' 0)
    if [ "$srv" != baseline ]; then tok=$(mint "$srv" "bench-$c-r$round-$$" "$(case_caps "$c")") || exit 1; fi
    write_lua "$c" "$tok"
    cpu0=$(server_cpu_ns "$c")
    # in the background, so a signal is handled at once rather than after wrk finishes
    "${WRK_PIN[@]}" wrk -t1 -c"$CONNS" -d"${secs}s" --timeout 2s -s "$WORK/$c.lua" \
        "http://127.0.0.1:${PORT[$srv]}" >"$WORK/wrk.out" 2>&1 &
    WRK_PID=$!
    wait "$WRK_PID"
    WRK_PID=
    out=$(cat "$WORK/wrk.out")
    cpu1=$(server_cpu_ns "$c")
    line=$(printf '%s\n' "$out" | grep '^BENCH ' | tail -1)
    [ -n "$line" ] && line="$line cpu_ns=$((cpu1 - cpu0))"
    if ! kill -0 "${PID_OF[$srv]}" 2>/dev/null; then
        say "case $c: server $srv died; log tail:"; tail -5 "${LOG[$srv]}" >&2; exit 1
    fi
    if [ -z "$line" ]; then
        say "case $c: wrk gave no result:"; say "$out"; FAILED=1; return
    fi
    # keep the per-call log files from growing without bound (opened O_APPEND, so truncation is safe)
    [ "$srv" = baseline ] || : >"${LOG[$srv]}"
    [ "$round" = 0 ] && return
    echo "$c $round $line" >>"$RESULTS"
    say "  round $round  $(printf '%-20s' "$c") ${line#BENCH }"
}

[ "$SECS" -gt 6 ] 2>/dev/null &&
    say "note: a run allows at most 1,000,000 calls; above ~$((1000000 / SECS)) req/s a ${SECS}s measurement ends in 429s (flagged below)"
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
say "load average before the run: $LOAD0"
awk -v l="$LOAD0" 'BEGIN { exit !(l > 0.5) }' &&
    say "warning: the machine is busy (load $LOAD0); other work on the cores moves req/s; cpu-r (CPU cost per request) is the steadier ratio"
say "sandbox-broker RPC benchmark: $(nproc) cores, server cpus=$SRV_CPUS, wrk cpus=$WRK_CPUS, threads=$THREADS, -c$CONNS, ${ROUNDS}x${SECS}s"
for c in $CASES; do run_wrk "$c" "$WARMUP" 0; done
for r in $(seq "$ROUNDS"); do
    for c in $CASES; do run_wrk "$c" "$SECS" "$r"; done
done

# --- the table ---
awk -v cases="$CASES" '
function val(s, k,   i, a) { for (i = 3; i <= NF; ++i) { split($i, a, "="); if (a[1] == k) return a[2] } return 0 }
{
    c = $1; n[c]++
    rps[c] += val($0, "rps"); p50[c] += val($0, "p50_us"); p99[c] += val($0, "p99_us")
    req[c] += val($0, "requests"); bad[c] += val($0, "bad"); serr[c] += val($0, "sockerr"); cpu[c] += val($0, "cpu_ns")
    lb = val($0, "last_bad"); if (lb != 0) last[c] = lb
    r = val($0, "rps"); if (!(c in lo) || r < lo[c]) lo[c] = r; if (!(c in hi) || r > hi[c]) hi[c] = r
    byround[c, $2] = r; rounds[$2] = 1
    if (val($0, "requests") > 0) cpuround[c, $2] = val($0, "cpu_ns") / val($0, "requests")
}
# median over rounds of (baseline CPU per request / case CPU per request in the same round): a burst of
# other load on the machine moves one round, not the figure
function pairedcpu(c,   k, m, i, j, t, v) {
    m = 0
    for (k in rounds) if (((c, k) in cpuround) && (("baseline", k) in cpuround) && cpuround[c, k] > 0 && cpuround["baseline", k] > 0) v[++m] = cpuround["baseline", k] / cpuround[c, k]
    if (m == 0) return 0
    for (i = 2; i <= m; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
}
# median over rounds of (case req/s / baseline req/s in the same round): robust to a slow round
function paired(c,   k, m, i, j, t, v) {
    m = 0
    for (k in rounds) if (((c, k) in byround) && (("baseline", k) in byround) && byround["baseline", k] > 0) v[++m] = byround[c, k] / byround["baseline", k]
    if (m == 0) return "-"
    for (i = 2; i <= m; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return sprintf("%.2fx", (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2)
}
END {
    nc = split(cases, cl, " ")
    base = ("baseline" in n) ? rps["baseline"] / n["baseline"] : 0
    basecpu = ("baseline" in n && req["baseline"] > 0) ? cpu["baseline"] / req["baseline"] : 0
    printf "\n%-20s %6s %9s %17s %7s %7s %6s %6s %8s %6s %6s %9s %5s %4s\n", "case", "status", "req/s", "(min..max)", "p50 ms", "p99 ms", "ratio", "paired", "cpu/req", "cpu-r", "cpu-p", "requests", "bad", "serr"
    for (i = 1; i <= nc; ++i) {
        c = cl[i]; if (!(c in n)) continue
        m = rps[c] / n[c]
        ex = (c ~ /denied/) ? 403 : 501
        cr = req[c] > 0 ? cpu[c] / req[c] : 0
        printf "%-20s %6d %9.0f %17s %7.3f %7.3f %6s %6s %6.2fus %6s %6s %9d %5d %4d%s\n", c, ex, m, sprintf("(%.0f..%.0f)", lo[c], hi[c]),
            p50[c] / n[c] / 1000, p99[c] / n[c] / 1000, (base > 0 ? sprintf("%.2fx", m / base) : "-"), paired(c),
            cr / 1000, (basecpu > 0 && cr > 0 ? sprintf("%.2fx", basecpu / cr) : "-"),
            (pairedcpu(c) > 0 ? sprintf("%.2fx", pairedcpu(c)) : "-"), req[c], bad[c], serr[c],
            (bad[c] > 0 ? sprintf("  <- non-%d statuses (last %d)", ex, last[c]) : "")
    }
    if (base > 0 && ("mem-granted" in n)) {
        printf "\n"
        target("mem-granted", "log_calls=true, the default")
        if ("mem-granted-nolog" in n) target("mem-granted-nolog", "log_calls=false")
    }
    vs("mem-granted-decide", "mem-granted")
    vs("mem-granted-nolog-decide", "mem-granted-nolog")
    if (base > 0 && ("redis-granted" in n)) {
        if (!("mem-granted" in n)) printf "\n"
        redis_target("redis-granted", "log_calls=true, the default")
        if ("redis-granted-nolog" in n) redis_target("redis-granted-nolog", "log_calls=false")
    }
}
# a decide axis that names other calls: the paired req/s ratio against the same case without it, and the CPU cost ratio
function vs(c, ref,   k, m, i, j, t, v, kr) {
    if (!(c in n) || !(ref in n)) return
    m = 0
    for (k in rounds) if (((c, k) in byround) && ((ref, k) in byround) && byround[ref, k] > 0) v[++m] = byround[c, k] / byround[ref, k]
    if (m == 0) return
    for (i = 2; i <= m; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    kr = (req[c] > 0 && req[ref] > 0 && cpu[c] > 0) ? (cpu[ref] / req[ref]) / (cpu[c] / req[c]) : 0
    printf "decide axis, no rule matching (%s vs %s): %.3fx req/s paired, %.3fx by CPU cost\n", c, ref,
        (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2, kr
}
# The targets are judged on the paired medians (each round of a case against the baseline of the same round);
# the whole-run ratios are printed next to them.
# the Redis store: >= 0.60x by CPU cost (the broker plus redis-server) and >= 0.70x in req/s
function redis_target(c, what,   r, k, kw) {
    r = paired(c); sub(/x$/, "", r)
    k = pairedcpu(c)
    kw = (basecpu > 0 && req[c] > 0 && cpu[c] > 0) ? basecpu / (cpu[c] / req[c]) : 0
    printf "redis store target >= 0.60x by CPU cost, >= 0.70x req/s: %s (%s, %s: %.2fx by CPU cost, %.2fx req/s, paired; whole run %.2fx by CPU cost)\n",
        (k >= 0.6 && r + 0 >= 0.7 ? "PASS" : "FAIL"), c, what, k, r + 0, kw
}
# the memory store: >= 0.80x req/s and >= 0.75x by CPU cost; flagged when the two ratios tell different stories
function target(c, what,   r, k, rw, kw) {
    r = paired(c); sub(/x$/, "", r); r += 0
    k = pairedcpu(c)
    rw = rps[c] / n[c] / base
    kw = (basecpu > 0 && req[c] > 0 && cpu[c] > 0) ? basecpu / (cpu[c] / req[c]) : 0
    printf "memory store target >= 0.80x req/s, >= 0.75x by CPU cost: %s (%s, %s: %.2fx req/s, %.2fx by CPU cost, paired; whole run %.2fx, %.2fx)%s\n",
        (r >= 0.8 && k >= 0.75 ? "PASS" : "FAIL"), c, what, r, k, rw, kw,
        ((k > 0 && (r - k > 0.15 || k - r > 0.15)) ? "  <- req/s disturbed by other load: rerun on a quiet machine" : "")
}' "$RESULTS" || { say "rpc.sh: could not summarise $RESULTS"; FAILED=1; }

if awk '{ for (i = 3; i <= NF; ++i) if ($i ~ /^bad=/ && $i != "bad=0") f = 1 } END { exit !f }' "$RESULTS"; then
    say "rpc.sh: some responses had an unexpected status; the numbers above are not valid"
    FAILED=1
fi
if awk '{ for (i = 3; i <= NF; ++i) if ($i ~ /^sockerr=/ && $i != "sockerr=0") f = 1 } END { exit !f }' "$RESULTS"; then
    say "rpc.sh: wrk reported socket errors (connect/read/write/timeout)"
    FAILED=1
fi
exit "$FAILED"

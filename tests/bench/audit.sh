#!/usr/bin/env bash
# Audit chain and run timeline benchmark, in the style of rpc.sh: wrk against several brokers in
# one run, alternating the cases round by round (log_calls off, granted calls):
#   off           memory store, audit off, timeline off            (the floor)
#   signed        memory store, audit file, hash chain + Ed25519 checkpoints, timeline off
#   full          memory store, audit as `signed`, run timeline on
#   redis-signed  Redis store, audit as `signed`, timeline off
#   redis-full    Redis store, audit as `signed`, run timeline on (one list per run in Redis)
#   plain         (with BENCH_REF_BROKER) a broker built from before the chain: audit file, unchained
# and reports, per case, req/s and the CPU time per request (the broker; for the Redis cases plus
# redis-server, which shares the server core), with the paired ratios to `off` in the same round.
# Targets (the issue: under 5 % per call, same run, with and without), by CPU per request, the steadier
# figure on a shared machine (req/s is printed too):
#   timeline: full >= 0.95x of signed, redis-full >= 0.95x of redis-signed
#   chain:    signed >= 0.95x of plain (needs BENCH_REF_BROKER; the chain against the writer it replaced)
# Then, under callgrind (one worker; BENCH_INSTR=0 skips it), the broker's instructions per call for
# the same pairs, which other load on the machine does not move (target: the timeline within 1.05x).
# Then it stops the `signed` broker and times `audit-verify --key` over the file the run wrote:
# records per second (docs/audit.md: a day of logs), and as a ratio to one `openssl dgst -sha256` pass over the
# same file in the same run.
#
# Environment (all optional): BROKER, BENCH_REF_BROKER, BENCH_SECONDS (5), BENCH_ROUNDS (3),
# BENCH_WARMUP (1), BENCH_CONNS (32), BENCH_THREADS (1), BENCH_SERVER_CPUS / BENCH_WRK_CPUS
# (1 / 0 with >= 2 cores), BENCH_CASES (a subset), BENCH_KEEP=1 keeps the work directory.
# Exit status: 0 when every case ran with only expected statuses and the verification passed (the
# target lines are informational).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
WARMUP=${BENCH_WARMUP:-1}
CONNS=${BENCH_CONNS:-32}
THREADS=${BENCH_THREADS:-1}
SECRET="bench-admin-secret-$$-0123456789abcdef"
REF=${BENCH_REF_BROKER:-}
CASES=${BENCH_CASES:-off signed full redis-signed redis-full${REF:+ plain}}

say() { printf '%s\n' "$*" >&2; }
die() { say "audit.sh: $*"; exit 1; }

for tool in wrk curl taskset openssl redis-server; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
[ -x "$BROKER" ] || die "no broker binary at $BROKER"

if [ "$(nproc)" -ge 2 ]; then
    SRV_PIN=(taskset -c "${BENCH_SERVER_CPUS:-1}")
    WRK_PIN=(taskset -c "${BENCH_WRK_CPUS:-0}")
else
    SRV_PIN=() WRK_PIN=()
fi

WORK=$(mktemp -d /tmp/sb-bench-audit.XXXXXX)
PIDS=()
WRK_PID=
cleanup() {
    local p
    [ -n "$WRK_PID" ] && kill -TERM "$WRK_PID" 2>/dev/null
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    [ -s "${REDIS_PIDFILE:-}" ] && kill -TERM "$(cat "$REDIS_PIDFILE")" 2>/dev/null
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

openssl genpkey -algorithm ed25519 -out "$WORK/key.pem" 2>/dev/null || die "openssl genpkey failed"
"$BROKER" audit-pubkey "$WORK/key.pem" >"$WORK/pub.pem" || die "audit-pubkey failed"

wait_log() {
    for _ in $(seq 100); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

declare -A PORT ADMIN LOG PID_OF

# start_broker NAME STORE AUDIT TIMELINE_MAX_EVENTS [KEYFILE]
start_broker() {
    local name=$1 log=$WORK/$1.log bin=$BROKER
    [ "$name" = plain ] && bin=$REF
    LOG[$name]=$log
    env SANDBOX_BROKER_ADMIN_SECRET="$SECRET" SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
        SANDBOX_BROKER_THREADS="$THREADS" SANDBOX_BROKER_TOKEN_STORE="$2" SANDBOX_BROKER_LOG_CALLS=false \
        SANDBOX_BROKER_REDIS_PREFIX="bench-$name:" SANDBOX_BROKER_AUDIT="$3" \
        $([ "$name" != plain ] && echo SANDBOX_BROKER_TIMELINE_MAX_EVENTS="$4") \
        ${5:+SANDBOX_BROKER_AUDIT_KEY_FILE="$5"} \
        "${SRV_PIN[@]}" "$bin" 2>>"$log" >/dev/null &
    PIDS+=($!)
    PID_OF[$name]=$!
    wait_log "$log" '"event":"started"' || die "broker $name did not start: $(cat "$log")"
    PORT[$name]=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    ADMIN[$name]=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "${PORT[$name]}" ] && [ -n "${ADMIN[$name]}" ] || die "broker $name: no ports in $log"
    for _ in $(seq 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$name]}/readyz")" = 200 ] && return 0
        sleep 0.05
    done
    die "broker $name is not ready: $(tail -5 "$log")"
}

mint() { # SERVER RUNID
    local body tok
    body=$(curl -s -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
        -d "{\"runId\":\"$2\",\"ttlMs\":3600000,\"quotas\":{\"calls\":1000000,\"concurrent\":1024},\"capabilities\":{\"services\":[\"svc\"]}}" \
        "http://127.0.0.1:${ADMIN[$1]}/admin/v1/tokens")
    tok=$(printf '%s' "$body" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
    [ -n "$tok" ] || { say "mint answered: $body"; return 1; }
    echo "$tok"
}

# Redis for the redis-* cases, on a free port below the ephemeral range
REDIS_PIDFILE=$WORK/redis.pid
for _ in 1 2 3 4 5; do
    REDIS_PORT=$((10000 + RANDOM % 20000))
    "${SRV_PIN[@]}" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --pidfile "$REDIS_PIDFILE" --logfile "$WORK/redis.log" --dir "$WORK" >/dev/null || die "redis-server failed"
    for _ in $(seq 100); do [ -s "$REDIS_PIDFILE" ] && break; sleep 0.05; done
    [ -s "$REDIS_PIDFILE" ] && break
done
[ -s "$REDIS_PIDFILE" ] || die "redis-server did not start"
REDIS="redis://127.0.0.1:$REDIS_PORT"

for c in $CASES; do
    case $c in
    off) start_broker off memory off 0 ;;
    signed) start_broker signed memory "$WORK/signed.audit" 0 "$WORK/key.pem" ;;
    full) start_broker full memory "$WORK/full.audit" 1000 "$WORK/key.pem" ;;
    redis-signed) start_broker redis-signed "$REDIS" "$WORK/redis-signed.audit" 0 "$WORK/key.pem" ;;
    redis-full) start_broker redis-full "$REDIS" "$WORK/redis-full.audit" 1000 "$WORK/key.pem" ;;
    plain) [ -n "$REF" ] || die "case plain needs BENCH_REF_BROKER"; start_broker plain memory "$WORK/plain.audit" 0 ;;
    *) die "unknown case $c" ;;
    esac
done

cpu_ns_of() {
    local f a _ sum=0
    for f in /proc/"$1"/task/*/schedstat; do
        read -r a _ <"$f" 2>/dev/null && sum=$((sum + a))
    done
    echo "$sum"
}

# the broker, plus redis-server for the Redis cases (it shares the server core)
server_cpu_ns() {
    local n
    n=$(cpu_ns_of "${PID_OF[$1]}")
    case $1 in redis-*) n=$((n + $(cpu_ns_of "$(cat "$REDIS_PIDFILE")"))) ;; esac
    echo "$n"
}

RESULTS=$WORK/results.txt
: >"$RESULTS"
FAILED=0

run_wrk() { # CASE SECONDS ROUND
    local c=$1 tok cpu0 cpu1 line
    tok=$(mint "$c" "bench-$c-r$3-$$") || exit 1
    cat >"$WORK/$c.lua" <<EOF
wrk.method = "POST"
wrk.path = "/api/sandbox/rpc"
wrk.body = '{"method":"services.svc.fn","args":{}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-questpie-sandbox-token"] = "$tok"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) bad = 0 end
function response(status, headers, body) if status ~= 501 then bad = bad + 1 end end
function done(summary, latency, requests)
  local b = 0
  for _, t in ipairs(threads) do b = b + t:get("bad") end
  io.write(string.format("BENCH rps=%.1f requests=%d bad=%d\n", summary.requests / (summary.duration / 1e6), summary.requests, b))
end
EOF
    cpu0=$(server_cpu_ns "$c")
    "${WRK_PIN[@]}" wrk -t1 -c"$CONNS" -d"$2s" --timeout 2s -s "$WORK/$c.lua" "http://127.0.0.1:${PORT[$c]}" >"$WORK/wrk.out" 2>&1 &
    WRK_PID=$!
    wait "$WRK_PID"
    WRK_PID=
    cpu1=$(server_cpu_ns "$c")
    line=$(grep '^BENCH ' "$WORK/wrk.out" | tail -1)
    [ -n "$line" ] || { say "case $c: wrk gave no result: $(cat "$WORK/wrk.out")"; FAILED=1; return; }
    [ "$3" = 0 ] && return
    echo "$c $3 $line cpu_ns=$((cpu1 - cpu0))" >>"$RESULTS"
    say "  round $3  $(printf '%-8s' "$c") ${line#BENCH } cpu_ns=$((cpu1 - cpu0))"
}

say "audit chain benchmark: $(nproc) cores, threads=$THREADS, -c$CONNS, ${ROUNDS}x${SECS}s, load $(cut -d' ' -f1 /proc/loadavg)"
for c in $CASES; do run_wrk "$c" "$WARMUP" 0; done
for r in $(seq "$ROUNDS"); do
    for c in $CASES; do run_wrk "$c" "$SECS" "$r"; done
done

awk -v cases="$CASES" '
function val(s, k,   i, a) { for (i = 3; i <= NF; ++i) { split($i, a, "="); if (a[1] == k) return a[2] } return 0 }
{ c = $1; rps[c, $2] = val($0, "rps"); q = val($0, "requests"); cpr[c, $2] = q > 0 ? val($0, "cpu_ns") / q : 0; rounds[$2] = 1; bad += val($0, "bad") }
# CPU per request of `with` against `without`, paired round by round (each round runs both back to back)
function target(what, with, without,   k, m, v, w, r, q) {
    if (!((with, 1) in cpr) || !((without, 1) in cpr)) return
    m = 0
    for (k in rounds) if (((with, k) in cpr) && ((without, k) in cpr) && cpr[with, k] > 0 && rps[without, k] > 0) {
        m++; v[m] = cpr[without, k] / cpr[with, k]; w[m] = rps[with, k] / rps[without, k]
    }
    if (m == 0) return
    r = median(v, m); q = median(w, m)
    printf "%s cost target: %s >= 0.95x of %s by CPU per request, paired by round: %s (%.3fx; req/s %.3fx)\n", what, with, without,
        (r >= 0.95 ? "PASS" : "FAIL"), r, q
}
function median(v, m,   i, j, t) {
    for (i = 2; i <= m; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
}
END {
    n = split(cases, cl, " ")
    printf "\n%-8s %10s %12s %14s %14s\n", "case", "req/s", "cpu/req us", "req/s paired", "cpu-r paired"
    for (i = 1; i <= n; ++i) {
        c = cl[i]; m = 0; p = 0; delete a; delete b; delete x; delete y
        if (!((c, 1) in rps)) continue
        for (k in rounds) {
            m++; x[m] = rps[c, k]; y[m] = cpr[c, k]
            # the ratio to `off` only from rounds where both ran and measured something (BENCH_CASES may leave it out)
            if (rps["off", k] > 0 && cpr[c, k] > 0) { p++; a[p] = rps[c, k] / rps["off", k]; b[p] = cpr["off", k] / cpr[c, k] }
        }
        printf "%-8s %10.0f %12.2f %14s %14s\n", c, median(x, m), median(y, m) / 1000,
            (p ? sprintf("%.3fx", median(a, p)) : "-"), (p ? sprintf("%.3fx", median(b, p)) : "-")
    }
    printf "\n"
    target("timeline (memory)", "full", "signed")
    target("timeline (redis)", "redis-full", "redis-signed")
    target("chain", "signed", "plain")
    if (bad) { print "unexpected statuses: " bad; exit 1 }
}' "$RESULTS" || FAILED=1

# --- instructions per call, under callgrind (one worker; not moved by other load on the machine) ---
# the broker's own instructions, every thread (the audit writer too), per granted call, for pairs that
# differ in one feature; Redis's own work is not in them (the wall-clock cases above include it)
IR_LINES=
if [ "${BENCH_INSTR:-1}" = 1 ] && command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
    cat >"$WORK/client.py" <<'PYEOF'
import http.client, sys
port, tok, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
bad = 0
for _ in range(n):
    c.request("POST", "/api/sandbox/rpc", b'{"method":"services.svc.fn","args":{}}',
              {"Content-Type": "application/json", "x-questpie-sandbox-token": tok})
    r = c.getresponse()
    r.read()
    bad += r.status != 501
print(bad)
PYEOF
    N=${BENCH_INSTR_CALLS:-400}
    # instr NAME STORE AUDIT TIMELINE [KEYFILE [BINARY]]: prints instructions per call
    instr() {
        local log=$WORK/vg-$1.log bin=${6:-$BROKER} pid port admin tok bad f ir body
        : >"$log"
        env SANDBOX_BROKER_ADMIN_SECRET="$SECRET" SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
            SANDBOX_BROKER_THREADS=1 SANDBOX_BROKER_TOKEN_STORE="$2" SANDBOX_BROKER_LOG_CALLS=false \
            SANDBOX_BROKER_REDIS_PREFIX="instr-$1:" SANDBOX_BROKER_AUDIT="$3" \
            $([ -z "${6:-}" ] && echo SANDBOX_BROKER_TIMELINE_MAX_EVENTS="$4") ${5:+SANDBOX_BROKER_AUDIT_KEY_FILE="$5"} \
            valgrind --tool=callgrind --callgrind-out-file="$WORK/cg-$1.%p" "$bin" 2>>"$log" >/dev/null &
        pid=$!
        PIDS+=("$pid")
        for _ in $(seq 600); do grep -q '"event":"started"' "$log" && break; sleep 0.1; done
        port=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
        admin=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
        [ -n "$port" ] && [ -n "$admin" ] || die "$1 under callgrind did not start: $(tail -3 "$log")"
        for _ in $(seq 100); do
            [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ] && break
            sleep 0.1
        done
        ADMIN[instr]=$admin
        tok=$(mint instr "instr-$1-$$") || die "mint under callgrind failed"
        /usr/bin/python3 "$WORK/client.py" "$port" "$tok" 50 >/dev/null
        sleep 0.3
        callgrind_control -z "$pid" >/dev/null 2>&1
        bad=$(/usr/bin/python3 "$WORK/client.py" "$port" "$tok" "$N")
        sleep 0.3 # the audit writer's and the timeline's batches after the last call
        [ "$bad" = 0 ] || die "callgrind $1: $bad calls failed"
        callgrind_control -d "$1" "$pid" >/dev/null 2>&1
        f=
        for _ in $(seq 100); do
            f=$(grep -l "^desc: Trigger: dump $1\$" "$WORK"/cg-"$1".* 2>/dev/null | head -1)
            [ -n "$f" ] && break
            sleep 0.1
        done
        [ -n "$f" ] || die "callgrind $1: no dump"
        ir=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        echo $((ir / N))
    }
    IR_OFF=$(instr i-off memory off 0)
    IR_SIGNED=$(instr i-signed memory "$WORK/i-signed.audit" 0 "$WORK/key.pem")
    IR_FULL=$(instr i-full memory "$WORK/i-full.audit" 1000 "$WORK/key.pem")
    IR_RSIGNED=$(instr i-rsigned "$REDIS" "$WORK/i-rsigned.audit" 0 "$WORK/key.pem")
    IR_RFULL=$(instr i-rfull "$REDIS" "$WORK/i-rfull.audit" 1000 "$WORK/key.pem")
    IR_PLAIN=
    [ -n "$REF" ] && IR_PLAIN=$(instr i-plain memory "$WORK/i-plain.audit" 0 "" "$REF")
    awk -v off="$IR_OFF" -v s="$IR_SIGNED" -v f="$IR_FULL" -v rs="$IR_RSIGNED" -v rf="$IR_RFULL" -v p="$IR_PLAIN" 'BEGIN {
        printf "\ninstructions per call in the broker (callgrind, one worker, every thread):\n"
        printf "  memory: audit off %d, signed chain %d, signed chain + timeline %d\n", off, s, f
        printf "  redis:  signed chain %d, signed chain + timeline %d\n", rs, rf
        printf "timeline (memory) on instructions: %.3fx of without: %s\n", f / s, (f / s <= 1.05 ? "PASS" : "FAIL")
        printf "timeline (redis) on instructions: %.3fx of without: %s\n", rf / rs, (rf / rs <= 1.05 ? "PASS" : "FAIL")
        # valgrind hides the CPU's SHA extensions, so OpenSSL hashes in plain code under it: the chain's SHA-256 per
        # record counts here about ten times what it costs on the CPU (the wall-clock chain target is the one to read)
        if (p != "") printf "chain on instructions (informational, SHA-256 without the CPU extensions): signed %d against the unchained writer %d: %.3fx\n", s, p, s / p
    }' >&2
fi

# the verifier over what the signed broker wrote
kill -TERM "${PID_OF[signed]}"
for _ in $(seq 100); do kill -0 "${PID_OF[signed]}" 2>/dev/null || break; sleep 0.1; done
n=$(wc -l <"$WORK/signed.audit")
# the baseline, same file, same run: one SHA-256 pass over its bytes with the same library (the chain's hash, without parsing)
t0=$(date +%s%N)
openssl dgst -sha256 "$WORK/signed.audit" >/dev/null
tb=$(($(date +%s%N) - t0))
t0=$(date +%s%N)
"$BROKER" audit-verify --key "$WORK/pub.pem" "$WORK/signed.audit" >"$WORK/verify.out" 2>&1
rc=$?
t1=$(date +%s%N)
tail -1 "$WORK/verify.out" >&2
[ "$rc" = 0 ] || { say "audit-verify failed: $(cat "$WORK/verify.out")"; FAILED=1; }
awk -v n="$n" -v ns="$((t1 - t0))" -v tb="$tb" 'BEGIN {
    if (ns <= 0) ns = 1
    printf "audit-verify: %d records in %.2f s: %.0f records/s (%.1f M records a minute); %.1fx the time of openssl dgst -sha256 over the same file\n",
        n, ns / 1e9, n / (ns / 1e9), n / (ns / 1e9) * 60 / 1e6, (tb > 0 ? ns / tb : 0) }' >&2
exit "$FAILED"

#!/usr/bin/env bash
# http.fetch with one injected secret against the same fetch without, in one
# run, as a ratio (PROTOCOL.md section 5, "Secrets": substitution on the way
# out and redaction of the answer should cost < 5 %).
#
# What runs is fetch.sh's loopback set-up (fetch_upstream answering 200 and a
# 1024-byte body, dnsmasq for bench.test, the broker), with two tokens: one of
# a run without secrets, and one of a run holding the secret "bench" for
# bench.test (schemes http). fetch_client times, alternating round by round on
# two keep-alive connections to the broker, the plain fetch and the fetch
# with "authorization: Bearer {{secret:bench}}" (the broker decides the
# secret for the hop, writes the value into the request, and redacts every
# form of it from the status text, headers and body of the answer); a direct
# fetch is timed too, for scale.
# Reported: p50/p90/p99 per side and the median over rounds of the per-round
# p50 ratio secret/plain; the < 1.05 target is informational: the exit
# status says only whether every response was right and every process
# stayed up.
#
# The plain side sends "authorization: Bearer <the value>" itself: the same
# bytes reach the upstream either way, so the ratio is what the feature costs
# (parsing the placeholder, the per-hop decision, substitution, redaction).
# Then, with valgrind installed (BENCH_INSTR=0 skips it), the broker's own
# instructions per fetch, plain and with the secret, under callgrind
# (BENCH_INSTR_CALLS fetches each, default 300): a figure other load on the
# machine does not move.
#
# Environment (all optional): BROKER, BENCH_ROUNDS (10), BENCH_PER_ROUND
# (500), BENCH_WARMUP (50), BENCH_THREADS (1), BENCH_BUILD_DIR, BENCH_KEEP=1,
# BENCH_LIMIT (85 s; 240 s with callgrind), as for fetch.sh.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
ROUNDS=${BENCH_ROUNDS:-10}
PER=${BENCH_PER_ROUND:-500}
WARMUP=${BENCH_WARMUP:-50}
THREADS=${BENCH_THREADS:-1}
BUILD_DIR=${BENCH_BUILD_DIR:-$ROOT/build/bench}
SECRET="fetch-bench-admin-secret-$$-0123456789abcdef"
VALUE="bench-secret-value-$$-ABCDEFGHIJKLMNOP"
LIMIT=${BENCH_LIMIT:-240}

BENCH_NAME=fetch_secret.sh
# shellcheck source=tests/bench/fetch_common.sh
. "$ROOT/tests/bench/fetch_common.sh"

# --- the broker ---
EGRESS="{\"dns_servers\":[\"127.0.0.1:$DNS_PORT\"],\"allow_cidrs\":[\"127.0.0.1/32\"],\"deny_local_interfaces\":false}"
SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
    SANDBOX_BROKER_THREADS=$THREADS SANDBOX_BROKER_EGRESS=$EGRESS SANDBOX_BROKER_LOG_CALLS=false \
    "$BROKER" 2>>"$WORK/broker.log" >/dev/null &
PIDS+=($!)
BROKER_PID=$!
wait_log "$WORK/broker.log" '"event":"started"' || die "broker did not start: $(tail -5 "$WORK/broker.log")"
PORT=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$WORK/broker.log" | head -1)
ADMIN=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$WORK/broker.log" | head -1)
[ -n "$PORT" ] && [ -n "$ADMIN" ] || die "no ports in the broker log: $(tail -5 "$WORK/broker.log")"

mint() {
    curl -s --max-time 5 -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' -d "$1" \
        "http://127.0.0.1:$ADMIN/admin/v1/tokens" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p'
}
Q='"quotas":{"calls":1000000,"concurrent":1024,"fetchBytes":1099511627776}'
TOKEN=$(mint '{"runId":"bench-plain","capabilities":{"net":["bench.test"]},'"$Q"'}')
STOKEN=$(mint '{"runId":"bench-secret","capabilities":{"net":["bench.test"]},'"$Q"',"secrets":{"bench":{"value":"'"$VALUE"'","hosts":["bench.test"],"schemes":["http"]}}}')
[ -n "$TOKEN" ] && [ -n "$STOKEN" ] || die "mint failed"

LOAD0=$(cut -d' ' -f1 /proc/loadavg)
say "http.fetch secret benchmark: $(nproc) cores, load $LOAD0, broker threads=$THREADS"
awk -v l="$LOAD0" 'BEGIN { exit !(l > 0.5) }' && say "warning: the machine is busy (load $LOAD0); latencies and ratios will be noisy"
say "plain vs secret vs direct: $ROUNDS rounds x $PER fetches per side, $WARMUP warm-up"

timeout 60 "$BUILD_DIR/fetch_client" "$PORT" "$TOKEN" "$UP_PORT" "$DNS_PORT" "$ROUNDS" "$PER" "$WARMUP" "$STOKEN" "$VALUE" >"$WORK/client.out" &
CLIENT_PID=$!
PIDS+=("$CLIENT_PID")
wait "$CLIENT_PID" || die "the measuring client failed (broker log tail: $(tail -3 "$WORK/broker.log"))"
kill -0 "$BROKER_PID" 2>/dev/null || die "the broker died: $(tail -5 "$WORK/broker.log")"
grep -q -- "$VALUE" "$WORK/broker.log" && die "the secret's value is in the broker log"

# --- instructions per fetch, under callgrind (not moved by other load on the machine) ---
IR_PLAIN= IR_SECRET=
if [ "${BENCH_INSTR:-1}" = 1 ] && command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
    cat >"$WORK/client.py" <<'PYEOF'
import http.client, json, sys
port, tok, up, n, secret, value = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", sys.argv[6]
args = {"url": "http://bench.test:%d/" % up,
        "headers": {"authorization": "Bearer " + ("{{secret:bench}}" if secret else value)}}
body = json.dumps({"method": "http.fetch", "args": args}).encode()
c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
bad = 0
for _ in range(n):
    c.request("POST", "/api/sandbox/rpc", body, {"Content-Type": "application/json", "x-questpie-sandbox-token": tok})
    r = c.getresponse()
    bad += r.status != 200 or b'"status":200' not in r.read()
print(bad)
PYEOF
    N=${BENCH_INSTR_CALLS:-300}
    : >"$WORK/vg.log"
    SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
        SANDBOX_BROKER_THREADS=1 SANDBOX_BROKER_EGRESS=$EGRESS SANDBOX_BROKER_LOG_CALLS=false \
        valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" "$BROKER" 2>>"$WORK/vg.log" >/dev/null &
    VPID=$!
    PIDS+=("$VPID")
    for _ in $(seq 600); do grep -q '"event":"started"' "$WORK/vg.log" && break; sleep 0.1; done
    VPORT=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$WORK/vg.log" | head -1)
    ADMIN=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$WORK/vg.log" | head -1)
    [ -n "$VPORT" ] && [ -n "$ADMIN" ] || die "the broker under callgrind did not start: $(tail -3 "$WORK/vg.log")"
    VTOKEN=$(mint '{"runId":"bench-plain","capabilities":{"net":["bench.test"]},'"$Q"'}')
    VSTOKEN=$(mint '{"runId":"bench-secret","capabilities":{"net":["bench.test"]},'"$Q"',"secrets":{"bench":{"value":"'"$VALUE"'","hosts":["bench.test"],"schemes":["http"]}}}')
    [ -n "$VTOKEN" ] && [ -n "$VSTOKEN" ] || die "mint (callgrind) failed"
    /usr/bin/python3 "$WORK/client.py" "$VPORT" "$VTOKEN" "$UP_PORT" 20 0 "$VALUE" >/dev/null
    /usr/bin/python3 "$WORK/client.py" "$VPORT" "$VSTOKEN" "$UP_PORT" 20 1 "$VALUE" >/dev/null
    for c in "plain $VTOKEN 0" "secret $VSTOKEN 1"; do
        set -- $c
        callgrind_control -z "$VPID" >/dev/null 2>&1
        bad=$(/usr/bin/python3 "$WORK/client.py" "$VPORT" "$2" "$UP_PORT" "$N" "$3" "$VALUE")
        [ "$bad" = 0 ] || die "callgrind $1: $bad fetches failed"
        callgrind_control -d "$1" "$VPID" >/dev/null 2>&1
        f=
        for _ in $(seq 100); do
            f=$(grep -l "^desc: Trigger: dump $1\$" "$WORK"/callgrind.out.* 2>/dev/null | head -1)
            [ -n "$f" ] && break
            sleep 0.1
        done
        ir=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
        if [ "$1" = plain ]; then IR_PLAIN=$((ir / N)); else IR_SECRET=$((ir / N)); fi
    done
    grep -q -- "$VALUE" "$WORK/vg.log" && die "the secret's value is in the broker log (callgrind)"
fi

val() { sed -n "s/^$1 .*$2=\([0-9.]*\).*/\1/p" "$WORK/client.out"; }
B50=$(val broker p50_us) B90=$(val broker p90_us) B99=$(val broker p99_us) BN=$(val broker n)
S50=$(val secret p50_us) S90=$(val secret p90_us) S99=$(val secret p99_us) SN=$(val secret n)
D50=$(val direct p50_us) D90=$(val direct p90_us) D99=$(val direct p99_us) DN=$(val direct n)
PAIRED=$(sed -n 's/^paired_p50_ratio_secret=//p' "$WORK/client.out")
[ -n "$B50" ] && [ -n "$S50" ] && [ -n "$PAIRED" ] || die "no results in $(cat "$WORK/client.out")"
awk -v b50="$B50" -v b90="$B90" -v b99="$B99" -v bn="$BN" -v s50="$S50" -v s90="$S90" -v s99="$S99" -v sn="$SN" \
    -v d50="$D50" -v d90="$D90" -v d99="$D99" -v dn="$DN" -v paired="$PAIRED" 'BEGIN {
    printf "\n%-42s %6s %8s %8s %8s %7s\n", "side", "n", "p50 us", "p90 us", "p99 us", "s/p50"
    printf "%-42s %6d %8.1f %8.1f %8.1f %6.3fx\n", "broker http.fetch, no secret", bn, b50, b90, b99, s50 / b50
    printf "%-42s %6d %8.1f %8.1f %8.1f %7s\n", "broker http.fetch, one injected secret", sn, s50, s90, s99, "-"
    printf "%-42s %6d %8.1f %8.1f %8.1f %7s\n", "direct (for scale)", dn, d50, d90, d99, "-"
    printf "\npaired per-round p50 ratio secret/plain: %.3fx\n", paired
    printf "target < 1.05x (informational): %s\n", (paired < 1.05 ? "MET" : "NOT MET")
}'
if [ -n "$IR_PLAIN" ] && [ -n "$IR_SECRET" ]; then
    awk -v p="$IR_PLAIN" -v s="$IR_SECRET" 'BEGIN {
        printf "\ninstructions per fetch in the broker (callgrind, one worker): no secret %d, one secret %d: %.3fx\n", p, s, s / p
        printf "target < 1.05x on instructions (informational): %s\n", (s / p < 1.05 ? "MET" : "NOT MET")
    }'
fi
exit 0

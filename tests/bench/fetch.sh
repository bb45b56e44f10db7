#!/usr/bin/env bash
# http.fetch latency benchmark: a fetch through the broker against
# `curl --resolve` to the same loopback upstream, in one run, as a ratio; and a
# second fetch of the same run (a kept-alive connection reused) against a
# kept-alive direct request plus the same lookups.
#
# What runs (everything on 127.0.0.1, nothing else is ever contacted):
#   * fetch_upstream (fetch_upstream.c): answers every request with 200 and a
#     fixed 1024-byte body, "Connection: close" (GET /ka: kept alive);
#   * dnsmasq on a free loopback port: bench.test -> 127.0.0.1, nothing else
#     (--no-resolv --no-hosts --local=/test/);
#   * the broker, egress.dns_servers = that dnsmasq, allow_cidrs =
#     127.0.0.1/32 (the audited exception that lets it connect to loopback),
#     deny_local_interfaces = false, keepalive_pool_size = 4; two tokens (two
#     runs) with net ["bench.test"]: one for the fresh fetches, one for /ka.
# What is measured (fetch_client.c, one process, alternating round by round):
#   * broker: http.fetch of http://bench.test:PORT/ through the RPC route, on
#     ONE keep-alive client connection to the broker. Each call is what the
#     broker always does: A and AAAA queries to dnsmasq, validation, a fresh
#     upstream connection, the exchange, the JSON answer (body in base64).
#   * direct: what `curl --resolve bench.test:PORT:127.0.0.1
#     http://bench.test:PORT/` does on the wire: a fresh TCP connection to
#     127.0.0.1:PORT, the same GET (Host: bench.test:PORT), read to the end,
#     close; no resolution and no process start-up (timed in-process).
#   * direct+dns: the same, after an A and an AAAA query for bench.test to
#     the same dnsmasq (sent together, both answers awaited): the resolution
#     the broker does on every hop, so the gap splits into DNS and the rest;
#   * broker-ka: http.fetch of http://bench.test:PORT/ka with the second
#     token: after its first fetch, the run's parked connection is reused
#     (each fetch still resolves and validates the name afresh);
#   * direct-ka+dns: the same A and AAAA queries, then GET /ka on one
#     kept-alive connection;
#   * for reference, real `curl --resolve` runs, each timed by curl itself
#     (-w '%{time_total}', which excludes curl's process start-up but
#     includes its own setup).
# Reported: p50/p90/p99 per side, the broker's latency divided by each
# side's (p50 and p99), and the median over rounds of the per-round p50
# ratio (robust to drift). The targets (fresh <= 1.5x direct+dns, kept-alive
# <= 1.2x direct-ka+dns, at p50) are informational: the exit status says only
# whether every response was right
# and every process stayed up. Loopback makes the direct side as cheap as it
# gets (tens of microseconds), so the ratio is an upper bound of what the
# broker adds to a real upstream's latency; "broker adds N us" is the
# absolute cost, which is what a real upstream sees.
#
# Environment (all optional):
#   BROKER           broker binary            (default: build/bin/sandbox-broker)
#   BENCH_ROUNDS     alternating rounds       (default: 10)
#   BENCH_PER_ROUND  fetches per side a round (default: 500)
#   BENCH_WARMUP     warm-up fetches per side (default: 50)
#   BENCH_CURL_RUNS  real curl runs           (default: 300; 0 skips)
#   BENCH_THREADS    broker worker threads    (default: 1)
#   BENCH_KEEPALIVE  egress.keepalive_pool_size (default: 4; 0 turns reuse off; "omit" leaves the
#                    key out: the broker's default, and a broker older than the key runs too)
#   BENCH_BUILD_DIR  where the helpers are built (default: build/bench)
#   BENCH_KEEP=1     keep the work directory (logs)
#   BENCH_LIMIT      the watchdog, in seconds (default: 85)
# The whole run is bounded: a watchdog stops it after 85 s. A trap stops
# every process the script started (by PID) and removes its work directory.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
ROUNDS=${BENCH_ROUNDS:-10}
PER=${BENCH_PER_ROUND:-500}
WARMUP=${BENCH_WARMUP:-50}
CURL_RUNS=${BENCH_CURL_RUNS:-300}
THREADS=${BENCH_THREADS:-1}
KEEPALIVE=${BENCH_KEEPALIVE:-4}
BUILD_DIR=${BENCH_BUILD_DIR:-$ROOT/build/bench}
SECRET="fetch-bench-admin-secret-$$-0123456789abcdef"
LIMIT=${BENCH_LIMIT:-85}

BENCH_NAME=fetch.sh
# shellcheck source=tests/bench/fetch_common.sh
. "$ROOT/tests/bench/fetch_common.sh"

# --- the broker ---
EGRESS="{\"dns_servers\":[\"127.0.0.1:$DNS_PORT\"],\"allow_cidrs\":[\"127.0.0.1/32\"],\"deny_local_interfaces\":false"
[ "$KEEPALIVE" = omit ] || EGRESS="$EGRESS,\"keepalive_pool_size\":$KEEPALIVE"
EGRESS="$EGRESS}"
SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
    SANDBOX_BROKER_THREADS=$THREADS SANDBOX_BROKER_EGRESS=$EGRESS SANDBOX_BROKER_LOG_CALLS=false \
    "$BROKER" 2>>"$WORK/broker.log" >/dev/null &
PIDS+=($!)
BROKER_PID=$!
wait_log "$WORK/broker.log" '"event":"started"' || die "broker did not start: $(tail -5 "$WORK/broker.log")"
PORT=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$WORK/broker.log" | head -1)
ADMIN=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$WORK/broker.log" | head -1)
[ -n "$PORT" ] && [ -n "$ADMIN" ] || die "no ports in the broker log: $(tail -5 "$WORK/broker.log")"

MINT=$(curl -s --max-time 5 -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
    -d '{"runId":"bench","capabilities":{"net":["bench.test"]},"quotas":{"calls":1000000,"concurrent":1024,"fetchBytes":1099511627776}}' \
    "http://127.0.0.1:$ADMIN/admin/v1/tokens")
TOKEN=$(printf '%s' "$MINT" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
[ -n "$TOKEN" ] || die "mint answered: $MINT"
MINT=$(curl -s --max-time 5 -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
    -d '{"runId":"bench-ka","capabilities":{"net":["bench.test"]},"quotas":{"calls":1000000,"concurrent":1024,"fetchBytes":1099511627776}}' \
    "http://127.0.0.1:$ADMIN/admin/v1/tokens")
TOKEN_KA=$(printf '%s' "$MINT" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
[ -n "$TOKEN_KA" ] || die "mint answered: $MINT"

LOAD0=$(cut -d' ' -f1 /proc/loadavg)
say "http.fetch benchmark: $(nproc) cores, load $LOAD0, broker threads=$THREADS, upstream 127.0.0.1:$UP_PORT, dnsmasq 127.0.0.1:$DNS_PORT"
awk -v l="$LOAD0" 'BEGIN { exit !(l > 0.5) }' && say "warning: the machine is busy (load $LOAD0); latencies and ratios will be noisy"
say "broker vs direct vs direct+dns, and kept-alive: $ROUNDS rounds x $PER fetches per side, $WARMUP warm-up"

# --- broker vs direct, in one process ---
timeout 60 "$BUILD_DIR/fetch_client" "$PORT" "$TOKEN" "$UP_PORT" "$DNS_PORT" "$ROUNDS" "$PER" "$WARMUP" "$TOKEN_KA" >"$WORK/client.out" &
CLIENT_PID=$!
PIDS+=("$CLIENT_PID")
wait "$CLIENT_PID" || die "the measuring client failed (broker log tail: $(tail -3 "$WORK/broker.log"))"
kill -0 "$BROKER_PID" 2>/dev/null || die "the broker died: $(tail -5 "$WORK/broker.log")"

# --- real curl --resolve, for reference (bounded: stops early past 20 s) ---
: >"$WORK/curl.times"
if [ "$CURL_RUNS" -gt 0 ]; then
    start=$SECONDS
    for _ in $(seq "$CURL_RUNS"); do
        curl -s -o /dev/null --max-time 5 --resolve "bench.test:$UP_PORT:127.0.0.1" -w '%{http_code} %{time_total}\n' \
            "http://bench.test:$UP_PORT/" >>"$WORK/curl.times" || die "curl --resolve failed"
        [ $((SECONDS - start)) -lt 20 ] || { say "note: curl runs stopped after 20 s"; break; }
    done
    awk '$1 != 200 { bad = 1 } END { exit bad }' "$WORK/curl.times" || die "curl --resolve got a non-200 status"
fi

# --- the table ---
val() { sed -n "s/^$1 .*$2=\([0-9.]*\).*/\1/p" "$WORK/client.out"; }
CURL_STATS=$(awk '{ print $2 * 1e6 }' "$WORK/curl.times" | sort -n | awk '
    { v[NR] = $1; s += $1 }
    function p(q,   k) { k = int(q / 100 * NR + 0.999999); if (k < 1) k = 1; return v[k] }
    END { if (NR) printf "n=%d p50_us=%.1f p90_us=%.1f p99_us=%.1f mean_us=%.1f\n", NR, p(50), p(90), p(99), s / NR }')
B50=$(val broker p50_us) B90=$(val broker p90_us) B99=$(val broker p99_us) BN=$(val broker n)
D50=$(val direct p50_us) D90=$(val direct p90_us) D99=$(val direct p99_us) DN=$(val direct n)
R50=$(val resolved p50_us) R90=$(val resolved p90_us) R99=$(val resolved p99_us) RN=$(val resolved n)
K50=$(val broker-ka p50_us) K90=$(val broker-ka p90_us) K99=$(val broker-ka p99_us) KN=$(val broker-ka n)
L50=$(val resolved-ka p50_us) L90=$(val resolved-ka p90_us) L99=$(val resolved-ka p99_us) LN=$(val resolved-ka n)
PAIRED=$(sed -n 's/^paired_p50_ratio=//p' "$WORK/client.out")
PAIRED_R=$(sed -n 's/^paired_p50_ratio_resolved=//p' "$WORK/client.out")
PAIRED_K=$(sed -n 's/^paired_p50_ratio_ka=//p' "$WORK/client.out")
[ -n "$B50" ] && [ -n "$D50" ] && [ -n "$R50" ] && [ -n "$K50" ] && [ -n "$L50" ] && [ -n "$PAIRED" ] && [ -n "$PAIRED_K" ] ||
    die "no results in $(cat "$WORK/client.out")"
# the broker really reused: a kept-alive fetch on a parked connection says "reused":1 in its egress.response line
[ "$KEEPALIVE" = 0 ] || [ "$KEEPALIVE" = omit ] || grep -q '"event":"egress.response".*"reused":1' "$WORK/broker.log" ||
    die "no fetch reused a parked connection"
C50=$(printf '%s' "$CURL_STATS" | sed -n 's/.*p50_us=\([0-9.]*\).*/\1/p')
C90=$(printf '%s' "$CURL_STATS" | sed -n 's/.*p90_us=\([0-9.]*\).*/\1/p')
C99=$(printf '%s' "$CURL_STATS" | sed -n 's/.*p99_us=\([0-9.]*\).*/\1/p')
CN=$(printf '%s' "$CURL_STATS" | sed -n 's/^n=\([0-9]*\).*/\1/p')

awk -v b50="$B50" -v b90="$B90" -v b99="$B99" -v bn="$BN" -v d50="$D50" -v d90="$D90" -v d99="$D99" -v dn="$DN" \
    -v r50="$R50" -v r90="$R90" -v r99="$R99" -v rn="$RN" -v c50="${C50:-0}" -v c90="${C90:-0}" -v c99="${C99:-0}" \
    -v cn="${CN:-0}" -v paired="$PAIRED" -v paired_r="$PAIRED_R" -v k50="$K50" -v k90="$K90" -v k99="$K99" -v kn="$KN" \
    -v l50="$L50" -v l90="$L90" -v l99="$L99" -v ln="$LN" -v paired_k="$PAIRED_K" 'BEGIN {
    printf "\n%-38s %6s %8s %8s %8s %7s %7s\n", "side", "n", "p50 us", "p90 us", "p99 us", "b/p50", "b/p99"
    printf "%-38s %6d %8.1f %8.1f %8.1f %7s %7s\n", "broker http.fetch (RPC, keep-alive)", bn, b50, b90, b99, "-", "-"
    printf "%-38s %6d %8.1f %8.1f %8.1f %6.2fx %6.2fx\n", "direct (curl --resolve, on the wire)", dn, d50, d90, d99, b50 / d50, b99 / d99
    printf "%-38s %6d %8.1f %8.1f %8.1f %6.2fx %6.2fx\n", "direct+dns (A+AAAA to dnsmasq first)", rn, r50, r90, r99, b50 / r50, b99 / r99
    if (cn > 0)
        printf "%-38s %6d %8.1f %8.1f %8.1f %6.2fx %6.2fx\n", "curl --resolve (its time_total)", cn, c50, c90, c99, b50 / c50, b99 / c99
    printf "%-38s %6d %8.1f %8.1f %8.1f %7s %7s\n", "broker, 2nd+ fetch of a run (reused)", kn, k50, k90, k99, "-", "-"
    printf "%-38s %6d %8.1f %8.1f %8.1f %6.2fx %6.2fx\n", "direct-ka+dns (lookups, kept-alive)", ln, l50, l90, l99, k50 / l50, k99 / l99
    printf "\nb/p50, b/p99: the broker'"'"'s latency divided by that side'"'"'s, same run (the kept-alive rows: the reused fetch'"'"'s)\n"
    printf "paired per-round p50 ratio: %.2fx vs direct, %.2fx vs direct+dns; kept-alive %.2fx vs direct-ka+dns\n", paired, paired_r, paired_k
    printf "broker adds %.0f us at p50 over direct (of which DNS %.0f us), %.0f us at p99\n", b50 - d50, r50 - d50, b99 - d99
    printf "target fresh <= 1.5x direct+dns (informational): %s (p50 %.2fx, paired %.2fx)\n", (b50 / r50 <= 1.5 ? "MET" : "NOT MET"), b50 / r50, paired_r
    printf "target kept-alive <= 1.2x direct-ka+dns (informational): %s (p50 %.2fx, paired %.2fx)\n", (k50 / l50 <= 1.2 ? "MET" : "NOT MET"), k50 / l50, paired_k
}'
exit 0

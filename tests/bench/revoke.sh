#!/usr/bin/env bash
# Revoke-to-refusal delay across instances (issue 6: target p99 <= 10 ms).
#
# Two broker instances share one Redis on loopback. For each of REVOKE_TOKENS tokens,
# tests/bench/revoke_probe.py mints on instance A, checks that granted calls work on
# instance B (501, three times: B then answers from the record it keeps while Redis tracks
# it), revokes on A (by token and by run, alternately) and calls B back to back until it
# answers 401; the delay is from A's 204 to B's first 401. It prints
# p50/p90/p99/max per revocation kind and overall.
#
# Environment (all optional):
#   BROKER          broker binary               (default: build/bin/sandbox-broker)
#   REVOKE_TOKENS   tokens to measure           (default: 500)
#   REVOKE_MODE     token | run | both          (default: both)
#   REVOKE_THREADS  worker threads per broker   (default: 2)
#   REVOKE_LOG_CALLS  per-call log lines (true/false, default true, as in production)
#   REVOKE_LOAD_CONNS  when > 0, wrk keeps that many connections busy with granted calls on B during
#                   the measurement (the delay under load); default 0 (an idle B)
#   BENCH_KEEP=1    keep the work directory (broker and Redis logs)
# Exit status: 0 when everything started and every token was refused on B after its revocation
# (the p99 target line is informational); 1 when something failed to start or a revocation did
# not hold.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
TOKENS=${REVOKE_TOKENS:-500}
MODE=${REVOKE_MODE:-both}
THREADS=${REVOKE_THREADS:-2}
LOG_CALLS=${REVOKE_LOG_CALLS:-true}
LOAD_CONNS=${REVOKE_LOAD_CONNS:-0}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
SANDBOX_BROKER_ADMIN_SECRET="bench-revoke-secret-$$-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export SANDBOX_BROKER_ADMIN_SECRET

say() { printf '%s\n' "$*" >&2; }
die() { say "revoke.sh: $*"; exit 1; }

for tool in redis-server curl timeout; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y redis-server curl coreutils)"
done
[ -x "$BROKER" ] || die "no broker binary at $BROKER (build it: cmake -S . -B build && cmake --build build --target sandbox-broker)"

WORK=$(mktemp -d /tmp/sb-revoke.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# a port the kernel just handed out for 127.0.0.1 (bound and released: free unless raced)
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- Redis ---
start_redis() {
    for _ in 1 2 3 4 5; do
        REDIS_PORT=$(free_port) || die "no free port for Redis"
        redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
            --logfile "$WORK/redis.log" --dir "$WORK" >/dev/null 2>&1 &
        REDIS_PID=$!
        PIDS+=("$REDIS_PID")
        for _ in $(seq 100); do
            [ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ] && return 0
            kill -0 "$REDIS_PID" 2>/dev/null || break
            sleep 0.05
        done
        kill -KILL "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null
    done
    die "redis-server did not start: $(tail -3 "$WORK/redis.log" 2>/dev/null)"
}
start_redis

# --- two brokers on it ---
declare -A PORT ADMIN
start_broker() { # NAME
    local name=$1 log=$WORK/$1.log
    SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 SANDBOX_BROKER_THREADS=$THREADS \
        SANDBOX_BROKER_TOKEN_STORE="redis://127.0.0.1:$REDIS_PORT" SANDBOX_BROKER_LOG_CALLS=$LOG_CALLS \
        "$BROKER" 2>"$log" >/dev/null &
    PIDS+=($!)
    for _ in $(seq 100); do grep -q '"event":"started"' "$log" 2>/dev/null && break; sleep 0.05; done
    PORT[$name]=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    ADMIN[$name]=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "${PORT[$name]}" ] && [ -n "${ADMIN[$name]}" ] || die "broker $name did not start: $(tail -5 "$log")"
    for _ in $(seq 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$name]}/readyz")" = 200 ] && return 0
        sleep 0.05
    done
    die "broker $name is not ready: $(tail -5 "$log")"
}
start_broker a
start_broker b

LOAD_NOTE="B idle"
if [ "$LOAD_CONNS" -gt 0 ] 2>/dev/null; then
    command -v wrk >/dev/null || die "wrk not found (apt-get install -y wrk)"
    body=$(curl -s -X POST -H "Authorization: Bearer $SANDBOX_BROKER_ADMIN_SECRET" -H 'Content-Type: application/json' \
        -d '{"runId":"revoke-bench-load","ttlMs":3600000,"capabilities":{"services":["billing"]},"quotas":{"calls":1000000,"concurrent":1024}}' \
        "http://127.0.0.1:${ADMIN[a]}/admin/v1/tokens")
    LOAD_TOKEN=$(printf '%s' "$body" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
    [ -n "$LOAD_TOKEN" ] || die "mint for the background load answered: $body"
    cat >"$WORK/load.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"method":"services.billing.charge","args":{}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-questpie-sandbox-token"] = "$LOAD_TOKEN"
EOF
    wrk -t1 -c"$LOAD_CONNS" -d600s -s "$WORK/load.lua" "http://127.0.0.1:${PORT[b]}/api/sandbox/rpc" >"$WORK/wrk.out" 2>&1 &
    PIDS=("$!" "${PIDS[@]}")
    sleep 1
    LOAD_NOTE="B under wrk load, $LOAD_CONNS connections"
fi

say "revoke.sh: $TOKENS tokens, mode $MODE, brokers with $THREADS threads each (log_calls=$LOG_CALLS), Redis $REDIS_PORT, $(nproc) cores, $LOAD_NOTE"
timeout 600 "$PY" "$ROOT/tests/bench/revoke_probe.py" --a-admin "${ADMIN[a]}" --b-public "${PORT[b]}" \
    --tokens "$TOKENS" --mode "$MODE"
rc=$?
[ "$rc" = 0 ] || say "revoke.sh: the probe reported failures (exit $rc)"
exit "$rc"

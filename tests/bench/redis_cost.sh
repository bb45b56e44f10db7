#!/usr/bin/env bash
# Where a granted call on the Redis token store spends CPU, split between the broker and
# redis-server, for one or more broker builds run alternately (round by round) against their own
# redis-server on loopback: wrk -c32 on one core, the broker (one worker) and redis-server on the
# other, CPU per request read from /proc for each process apart. Each build's figures are printed
# with their ratio to the first build's in the same run (tests/bench/README.md, "The Redis store
# without a round trip per call"). Not a pass/fail test.
#
#   redis_cost.sh BROKER [BROKER...]
#   BENCH_SECONDS  seconds per measurement (default 4)
#   BENCH_ROUNDS   alternating rounds      (default 3)
#   BENCH_TIMELINE timeline_max_events     (default 1000, the broker's default; 0 turns it off)
# Needs wrk, curl, redis-server, taskset and Debian's python3. Loopback only.
set -u -o pipefail

SECS=${BENCH_SECONDS:-4}
ROUNDS=${BENCH_ROUNDS:-3}
TIMELINE=${BENCH_TIMELINE:-1000}
SECRET="bench-admin-secret-$$-0123456789abcdef"
[ $# -ge 1 ] || { echo "usage: $0 BROKER [BROKER...]" >&2; exit 2; }
for tool in wrk curl redis-server redis-cli taskset /usr/bin/python3; do
    command -v "$tool" >/dev/null || { echo "redis_cost.sh: $tool not found" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "redis_cost.sh: needs two cores (wrk on one, the servers on the other)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sb-rcost.XXXXXX)
RPID= BPID=
cleanup() {
    [ -n "$BPID" ] && kill -TERM "$BPID" 2>/dev/null && wait "$BPID" 2>/dev/null
    if [ -n "$RPID" ] && kill -TERM "$RPID" 2>/dev/null; then
        for _ in $(seq 40); do [ -d "/proc/$RPID" ] || break; sleep 0.05; done
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
taskset -c 1 redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --pidfile "$WORK/redis.pid" --logfile "$WORK/redis.log" --dir "$WORK" >/dev/null || { echo "redis-server failed" >&2; exit 1; }
for _ in $(seq 100); do [ -s "$WORK/redis.pid" ] && break; sleep 0.05; done
RPID=$(cat "$WORK/redis.pid")

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# one measurement: prints "req/s broker_us_per_req redis_us_per_req"
measure() {
    local broker=$1 log=$WORK/broker.log pub adm tok n b0 b1 r0 r1 out hz
    redis-cli -p "$port" flushall >/dev/null
    : >"$log"
    SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
        SANDBOX_BROKER_THREADS=1 SANDBOX_BROKER_TOKEN_STORE=redis://127.0.0.1:$port SANDBOX_BROKER_TIMELINE_MAX_EVENTS=$TIMELINE \
        taskset -c 1 "$broker" 2>"$log" >/dev/null &
    BPID=$!
    for _ in $(seq 200); do
        pub=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
        [ -n "$pub" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$pub/readyz")" = 200 ] && break
        sleep 0.05
    done
    adm=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    tok=$(curl -s -X POST -H "Authorization: Bearer $SECRET" -H 'content-type: application/json' \
        -d '{"runId":"bench","capabilities":{"services":["mailer"]},"quotas":{"calls":1000000,"concurrent":1024}}' \
        "http://127.0.0.1:$adm/admin/v1/tokens" | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])') ||
        { echo "redis_cost.sh: $broker did not mint: $(tail -3 "$log")" >&2; exit 1; }
    cat >"$WORK/post.lua" <<EOF
wrk.method = "POST"
wrk.body = '{"method":"services.mailer.send","args":{}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-questpie-sandbox-token"] = "$tok"
EOF
    taskset -c 0 wrk -t1 -c32 -d1s -s "$WORK/post.lua" "http://127.0.0.1:$pub/api/sandbox/rpc" >/dev/null # warm-up
    b0=$(cpu_ticks "$BPID") r0=$(cpu_ticks "$RPID")
    out=$(taskset -c 0 wrk -t1 -c32 -d"${SECS}s" -s "$WORK/post.lua" "http://127.0.0.1:$pub/api/sandbox/rpc")
    b1=$(cpu_ticks "$BPID") r1=$(cpu_ticks "$RPID")
    kill -TERM "$BPID" 2>/dev/null
    wait "$BPID" 2>/dev/null
    BPID=
    n=$(echo "$out" | awk '/requests in/ {print $1}')
    hz=$(getconf CLK_TCK)
    awk -v n="$n" -v s="$SECS" -v b="$((b1 - b0))" -v r="$((r1 - r0))" -v hz="$hz" \
        'BEGIN { printf "%.0f %.3f %.3f\n", n / s, b * 1e6 / hz / n, r * 1e6 / hz / n }'
}

RES=$WORK/results
for round in $(seq "$ROUNDS"); do
    i=0
    for broker in "$@"; do
        echo "$i $(measure "$broker")" >>"$RES"
        i=$((i + 1))
    done
    echo "round $round done" >&2
done

printf '%-40s %9s %14s %14s %9s %9s\n' "broker" "req/s" "broker us/req" "redis us/req" "x-first" "redis x"
i=0
for broker in "$@"; do
    awk -v i="$i" -v name="$broker" '
        $1 == 0 { fb += $3; fr += $4; fn++ }
        $1 == i { rps += $2; b += $3; r += $4; n++ }
        END {
            printf "%-40s %9.0f %14.3f %14.3f %8.3fx %8.3fx\n", name, rps / n, b / n, r / n,
                (b + r) / n / ((fb + fr) / fn), (fr > 0 ? (r / n) / (fr / fn) : 0)
        }' "$RES"
    i=$((i + 1))
done

#!/usr/bin/env bash
# Mixed workload through the production shape, and the memory cost of live tokens (issue 6).
#
# Part 1 (load): nginx running deploy/nginx/sandbox-broker.conf (ports rewritten, as in
# tests/integration/test_nginx.py) in front of two brokers sharing one Redis, all on loopback.
# wrk sends, for LOAD_SECONDS, a mix of
#     60 % granted calls      services.billing.charge  -> 501 not_implemented
#     30 % denied calls       services.payroll.run     -> 403 forbidden
#     10 % unauthorized calls (a token never minted)   -> 401 unauthorized
# while a side loop does what a host does: mint on one instance, call through nginx (501), revoke
# on the other instance (by token or by run), call again (401). Reported: throughput, p50/p99
# latency, answers by status (anything but 501/403/401 is an error), the admin loop's results,
# each broker's RSS before/after and the CPU seconds each process used (req/s per broker core).
#
# Part 2 (memory): one broker with the memory store (max_tokens 200000) gets LOAD_MEM_TOKENS
# (default 100,000) live tokens minted through its admin API; reported: RSS growth per live
# token, compared with docs/config.md ("about 0.5 KiB plus the manifest" per token, plus the
# bucket array).
#
# Environment (all optional):
#   BROKER             broker binary                 (default: build/bin/sandbox-broker)
#   LOAD_SECONDS       wrk duration                   (default: 20)
#   LOAD_CONNS         wrk connections                (default: 32)
#   LOAD_WRK_THREADS   wrk threads                    (default: 1)
#   LOAD_THREADS       worker threads per broker      (default: 2)
#   LOAD_NGINX_WORKERS nginx worker processes         (default: 1)
#   LOAD_LOG_CALLS     per-call log lines true/false  (default: true, as in production)
#   LOAD_ADMIN_PAUSE   seconds between admin-loop rounds (default: 0.05)
#   LOAD_MEM_TOKENS    tokens for part 2, 0 skips it  (default: 100000)
#   LOAD_REDIS_TOKENS  tokens minted into Redis after the load, for Redis memory per token (default: 20000)
#   BENCH_KEEP=1       keep the work directory (logs, lua, raw results)
# Exit status: 0 when everything started and every answer had an expected status; 1 otherwise.
# The memory comparison is reported, not enforced.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
SECS=${LOAD_SECONDS:-20}
CONNS=${LOAD_CONNS:-32}
WRK_THREADS=${LOAD_WRK_THREADS:-1}
THREADS=${LOAD_THREADS:-2}
NGINX_WORKERS=${LOAD_NGINX_WORKERS:-1}
LOG_CALLS=${LOAD_LOG_CALLS:-true}
ADMIN_PAUSE=${LOAD_ADMIN_PAUSE:-0.05}
MEM_TOKENS=${LOAD_MEM_TOKENS:-100000}
REDIS_TOKENS=${LOAD_REDIS_TOKENS:-20000}
NGINX_CONF=$ROOT/deploy/nginx/sandbox-broker.conf
SECRET="bench-load-secret-$$-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
RPC=/api/sandbox/rpc
TICK=$(getconf CLK_TCK)
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

say() { printf '%s\n' "$*" >&2; }
die() { say "load.sh: $*"; exit 1; }

NGINX=$(command -v nginx || echo /usr/sbin/nginx)
for tool in wrk curl redis-server redis-cli awk; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y wrk curl redis-server nginx)"
done
[ -x "$NGINX" ] || die "nginx not found (apt-get install -y nginx)"
[ -x "$BROKER" ] || die "no broker binary at $BROKER (build it: cmake -S . -B build && cmake --build build --target sandbox-broker)"

WORK=$(mktemp -d /tmp/sb-load.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
    local p
    [ -n "${ADMIN_LOOP:-}" ] && kill -TERM "$ADMIN_LOOP" 2>/dev/null && wait "$ADMIN_LOOP" 2>/dev/null
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
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# cpu of a process and its children that were reaped (nginx workers): utime+stime+cutime+cstime
cpu_ticks_tree() {
    local t=0 p
    for p in "$@"; do t=$((t + $(awk '{print $14 + $15 + $16 + $17}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
    echo "$t"
}

# --- brokers -----------------------------------------------------------------
declare -A PORT ADMIN PID_OF
start_broker() { # NAME STORE [extra VAR=value ...]
    local name=$1 store=$2 log=$WORK/$1.log
    shift 2
    env SANDBOX_BROKER_ADMIN_SECRET="$SECRET" SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
        SANDBOX_BROKER_THREADS="$THREADS" SANDBOX_BROKER_TOKEN_STORE="$store" SANDBOX_BROKER_LOG_CALLS="$LOG_CALLS" "$@" \
        "$BROKER" 2>"$log" >/dev/null &
    PID_OF[$name]=$!
    PIDS+=("$!")
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

# mint NAME JSON-BODY: prints the token
mint() {
    local body tok
    body=$(curl -s -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' -d "$2" \
        "http://127.0.0.1:${ADMIN[$1]}/admin/v1/tokens")
    tok=$(printf '%s' "$body" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
    [ -n "$tok" ] || { say "mint on $1 answered: $body"; return 1; }
    echo "$tok"
}

FAILED=0

# --- minting many tokens through an admin API with wrk ------------------------------
CAPS_EMPTY='{}'
CAPS_TYPICAL='{"services":["billing"],"net":["api.example.com:443"],"data":{"collections":{"posts":["read","create"]}},"timeoutMs":60000}'
# mint_lua CAPS TAG -> $WORK/mint-TAG.lua
mint_lua() {
    cat >"$WORK/mint-$2.lua" <<EOF
local threads = {}
local counter = 1
function setup(thread) thread:set("id", counter); counter = counter + 1; table.insert(threads, thread) end
function init(args) n = 0; ok = 0; bad = 0; last_bad = 0; share = tonumber(args[1]) end
function request()
  n = n + 1
  return wrk.format("POST", "/admin/v1/tokens", {["Authorization"] = "Bearer $SECRET", ["Content-Type"] = "application/json"},
    string.format('{"runId":"mem-$2-%d-%d","ttlMs":3600000,"capabilities":$1}', id, n))
end
function response(status, headers, body)
  if status == 201 then ok = ok + 1 else bad = bad + 1; last_bad = status end
  if ok >= share then wrk.thread:stop() end
end
function done(summary, latency, requests)
  local o, b, lb = 0, 0, 0
  for _, t in ipairs(threads) do o = o + t:get("ok"); b = b + t:get("bad"); if t:get("last_bad") ~= 0 then lb = t:get("last_bad") end end
  io.write(string.format("MINT ok=%d bad=%d last_bad=%d\n", o, b, lb))
end
EOF
}
# live NAME: live tokens of a memory-store broker (sb_tokens_live), or token records in Redis
live() {
    case $1 in
        mem-*) curl -s "http://127.0.0.1:${ADMIN[$1]}/metrics" | awk '/^sb_tokens_live / {print $2}' ;;
        *) redis-cli -p "$REDIS_PORT" eval "return #redis.call('KEYS', ARGV[1])" 0 'sb:tok:*' ;;
    esac
}
# mint_n BROKER COUNT TAG: mints COUNT more tokens (each wrk thread stops at its share; wrk is told to stop then)
mint_n() {
    local share=$(( ($2 + 1) / 2 )) target=$(( $(live "$1") + $2 )) pid
    wrk -t2 -c8 -d600s --timeout 10s -s "$WORK/mint-$3.lua" "http://127.0.0.1:${ADMIN[$1]}" -- "$share" \
        >"$WORK/mint-$3-$2.out" 2>&1 &
    pid=$!
    for _ in $(seq 3000); do
        [ "$(live "$1")" -ge "$target" ] 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -INT "$pid" 2>/dev/null
    wait "$pid"
    grep '^MINT ' "$WORK/mint-$3-$2.out" || { say "wrk (mint) gave no result: $(tail -3 "$WORK/mint-$3-$2.out")"; echo "MINT bad=1 "; }
}

if [ "$SECS" -gt 0 ] 2>/dev/null; then
# --- Redis -------------------------------------------------------------------
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

start_broker a "redis://127.0.0.1:$REDIS_PORT"
start_broker b "redis://127.0.0.1:$REDIS_PORT"

# --- nginx with the deployed file ----------------------------------------------
NGINX_PORT=$(free_port) || die "no free port for nginx"
for sub in body proxy fcgi uwsgi scgi; do mkdir -p "$WORK/nginx/$sub"; chmod 777 "$WORK/nginx/$sub"; done
chmod 755 "$WORK/nginx"
awk -v s1="${PORT[a]}" -v s2="${PORT[b]}" -v lp="$NGINX_PORT" '
    /^    server 127\.0\.0\.1:[0-9]+ max_fails=0;$/ {
        if (!done) { print "    server 127.0.0.1:" s1 " max_fails=0;"; print "    server 127.0.0.1:" s2 " max_fails=0;"; done = 1 }
        next
    }
    { if (sub(/listen 127\.0\.0\.1:8443;/, "listen 127.0.0.1:" lp ";")) listened = 1; print }
    END { if (!done || !listened) exit 1 }' "$NGINX_CONF" >"$WORK/nginx/site.conf" ||
    die "$NGINX_CONF changed shape: cannot rewrite its upstream servers and listen port"
cat >"$WORK/nginx/nginx.conf" <<EOF
daemon off;
worker_processes $NGINX_WORKERS;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  include $WORK/nginx/site.conf;
}
EOF
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >/dev/null 2>&1 &
NGINX_PID=$!
PIDS+=("$NGINX_PID")
for _ in $(seq 100); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$NGINX_PORT/healthz")" = 200 ] && break
    sleep 0.05
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$NGINX_PORT/healthz")" = 200 ] ||
    die "nginx did not start: $(tail -5 "$WORK/nginx/error.log" 2>/dev/null)"

# --- tokens for the mix: 8 runs, minted on both instances, quotas lifted ---------
TOKENS=()
for i in 0 1 2 3 4 5 6 7; do
    srv=a; [ $((i % 2)) = 1 ] && srv=b
    t=$(mint "$srv" "{\"runId\":\"load-$$-$i\",\"ttlMs\":3600000,\"capabilities\":{\"services\":[\"billing\"]},\"quotas\":{\"calls\":1000000,\"concurrent\":1024}}") ||
        die "mint failed"
    TOKENS+=("\"$t\"")
done
BOGUS=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
lua_tokens=$(IFS=,; echo "${TOKENS[*]}")
cat >"$WORK/mix.lua" <<EOF
local tokens = {$lua_tokens}
local bogus = "$BOGUS"
local granted = '{"method":"services.billing.charge","args":{"amount":5}}'
local denied = '{"method":"services.payroll.run","args":{}}'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  n = 0; sent_granted = 0; sent_denied = 0; sent_unauth = 0
  s401 = 0; s403 = 0; s501 = 0; s429 = 0; s502 = 0; s503 = 0; s5xx = 0; sother = 0; last_other = 0
end
function request()
  n = n + 1
  local k = n % 10
  local tok = tokens[(n % #tokens) + 1]
  local body = granted
  if k == 9 then
    tok = bogus; sent_unauth = sent_unauth + 1
  elseif k >= 6 then
    body = denied; sent_denied = sent_denied + 1
  else
    sent_granted = sent_granted + 1
  end
  return wrk.format("POST", "$RPC", {["Content-Type"] = "application/json", ["x-questpie-sandbox-token"] = tok}, body)
end
function response(status, headers, body)
  if status == 501 then s501 = s501 + 1
  elseif status == 403 then s403 = s403 + 1
  elseif status == 401 then s401 = s401 + 1
  elseif status == 429 then s429 = s429 + 1
  elseif status == 502 then s502 = s502 + 1
  elseif status == 503 then s503 = s503 + 1
  elseif status >= 500 then s5xx = s5xx + 1
  else sother = sother + 1; last_other = status end
end
function done(summary, latency, requests)
  local t = {}
  for _, name in ipairs({"sent_granted", "sent_denied", "sent_unauth", "s501", "s403", "s401", "s429", "s502", "s503", "s5xx", "sother"}) do
    t[name] = 0
    for _, th in ipairs(threads) do t[name] = t[name] + th:get(name) end
  end
  local e = summary.errors
  io.write(string.format("LOAD requests=%d secs=%.3f rps=%.1f p50_us=%d p90_us=%d p99_us=%d max_us=%d " ..
    "sent_granted=%d sent_denied=%d sent_unauth=%d s501=%d s403=%d s401=%d s429=%d s502=%d s503=%d s5xx=%d sother=%d " ..
    "connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    t.sent_granted, t.sent_denied, t.sent_unauth, t.s501, t.s403, t.s401, t.s429, t.s502, t.s503, t.s5xx, t.sother,
    e.connect, e.read, e.write, e.timeout))
end
EOF

# sanity: one of each kind through nginx before any load
chk() { curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -H "x-questpie-sandbox-token: $1" \
    -d "$2" "http://127.0.0.1:$NGINX_PORT$RPC"; }
first=${TOKENS[0]//\"/}
[ "$(chk "$first" '{"method":"services.billing.charge","args":{}}')" = 501 ] || die "granted call through nginx is not 501"
[ "$(chk "$first" '{"method":"services.payroll.run","args":{}}')" = 403 ] || die "denied call through nginx is not 403"
[ "$(chk "$BOGUS" '{"method":"services.billing.charge","args":{}}')" = 401 ] || die "unknown token through nginx is not 401"

# --- the host's side loop --------------------------------------------------------
admin_loop() {
    local i=0 x y tok run path c1 c2 r
    while :; do
        i=$((i + 1))
        if [ $((i % 2)) = 0 ]; then x=a; y=b; else x=b; y=a; fi
        run="load-admin-$$-$i"
        if ! tok=$(mint "$x" "{\"runId\":\"$run\",\"capabilities\":{\"services\":[\"billing\"]}}" 2>/dev/null); then
            echo "mint fail"; sleep "$ADMIN_PAUSE"; continue
        fi
        echo "mint 201"
        c1=$(chk "$tok" '{"method":"services.billing.charge","args":{}}')
        echo "call-before $c1"
        if [ $((i % 2)) = 0 ]; then path=/admin/v1/tokens/$tok; else path=/admin/v1/runs/$run; fi
        r=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE -H "Authorization: Bearer $SECRET" "http://127.0.0.1:${ADMIN[$y]}$path")
        echo "revoke $r"
        c2=$(chk "$tok" '{"method":"services.billing.charge","args":{}}')
        echo "call-after $c2"
        sleep "$ADMIN_PAUSE"
    done
}

say "load.sh: $(nproc) cores; nginx ($NGINX_WORKERS worker) -> 2 brokers ($THREADS threads each, log_calls=$LOG_CALLS) -> Redis; wrk -t$WRK_THREADS -c$CONNS -d${SECS}s; admin loop every ${ADMIN_PAUSE}s"
# warm-up, so that RSS "before" is the steady state of an instance that has served traffic
wrk -t1 -c"$CONNS" -d2s -s "$WORK/mix.lua" "http://127.0.0.1:$NGINX_PORT" >/dev/null 2>&1
RSS_A0=$(rss_kib "${PID_OF[a]}") RSS_B0=$(rss_kib "${PID_OF[b]}")
CPU_A0=$(cpu_ticks "${PID_OF[a]}") CPU_B0=$(cpu_ticks "${PID_OF[b]}") CPU_R0=$(cpu_ticks "$REDIS_PID")
CPU_N0=$(cpu_ticks_tree $(pgrep -P "$NGINX_PID") "$NGINX_PID")
admin_loop >"$WORK/admin.txt" 2>/dev/null &
ADMIN_LOOP=$!
wrk -t"$WRK_THREADS" -c"$CONNS" -d"${SECS}s" --timeout 5s -s "$WORK/mix.lua" "http://127.0.0.1:$NGINX_PORT" >"$WORK/wrk.out" 2>&1
kill -TERM "$ADMIN_LOOP" 2>/dev/null; wait "$ADMIN_LOOP" 2>/dev/null; ADMIN_LOOP=
CPU_A1=$(cpu_ticks "${PID_OF[a]}") CPU_B1=$(cpu_ticks "${PID_OF[b]}") CPU_R1=$(cpu_ticks "$REDIS_PID")
CPU_N1=$(cpu_ticks_tree $(pgrep -P "$NGINX_PID") "$NGINX_PID")
RSS_A1=$(rss_kib "${PID_OF[a]}") RSS_B1=$(rss_kib "${PID_OF[b]}")
for n in a b; do kill -0 "${PID_OF[$n]}" 2>/dev/null || { say "broker $n died:"; tail -5 "$WORK/$n.log" >&2; FAILED=1; }; done

LINE=$(grep '^LOAD ' "$WORK/wrk.out" | tail -1)
if [ -z "$LINE" ]; then
    say "load.sh: wrk gave no result:"; cat "$WORK/wrk.out" >&2; exit 1
fi
get() { printf '%s\n' "$LINE" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
REQ=$(get requests)
echo
echo "== mixed load through nginx (${SECS} s, $CONNS connections)"
awk -v r="$(get rps)" -v p50="$(get p50_us)" -v p90="$(get p90_us)" -v p99="$(get p99_us)" -v mx="$(get max_us)" -v n="$REQ" \
    'BEGIN { printf "throughput   %.0f req/s (%d requests)\nlatency      p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.1f ms\n", r, n, p50/1000, p90/1000, p99/1000, mx/1000 }'
echo "answers      501: $(get s501) (granted sent: $(get sent_granted)), 403: $(get s403) (denied sent: $(get sent_denied)), 401: $(get s401) (unauthorized sent: $(get sent_unauth))"
ERRS=$(( $(get s429) + $(get s502) + $(get s503) + $(get s5xx) + $(get sother) ))
SOCK=$(( $(get connect) + $(get read) + $(get write) + $(get timeout) ))
echo "errors       429: $(get s429), 502: $(get s502), 503: $(get s503), other 5xx: $(get s5xx), other: $(get sother); socket errors: connect $(get connect), read $(get read), write $(get write), timeout $(get timeout)"
# every answer must match what was sent (up to the requests still in flight when wrk stopped)
for pair in "sent_granted s501" "sent_denied s403" "sent_unauth s401"; do
    set -- $pair
    d=$(( $(get "$1") - $(get "$2") )); d=${d#-}
    if [ "$d" -gt $((CONNS * 2)) ]; then say "load.sh: $1=$(get "$1") but $2=$(get "$2")"; FAILED=1; fi
done
[ "$ERRS" = 0 ] || { say "load.sh: $ERRS answers with an unexpected status"; FAILED=1; }
[ "$SOCK" = 0 ] || { say "load.sh: wrk reported $SOCK socket errors"; FAILED=1; }

echo "admin loop   $(sort "$WORK/admin.txt" | uniq -c | awk '{printf "%s %s: %d; ", $2, $3, $1}')"
if grep -v -E '^(mint 201|call-before 501|revoke 204|call-after 401)$' "$WORK/admin.txt" | grep -q .; then
    say "load.sh: the admin loop saw unexpected statuses"; FAILED=1
fi
for n in a b; do
    calls=$(curl -s "http://127.0.0.1:${ADMIN[$n]}/metrics" | awk '/^sb_calls_total\{/ { s += $NF } END { print s + 0 }')
    echo "broker $n     calls answered (since start) $calls"
done
awk -v a0="$RSS_A0" -v a1="$RSS_A1" -v b0="$RSS_B0" -v b1="$RSS_B1" 'BEGIN {
    printf "RSS          broker a %.1f -> %.1f MiB, broker b %.1f -> %.1f MiB\n", a0/1024, a1/1024, b0/1024, b1/1024 }'
awk -v t="$TICK" -v n="$REQ" -v s="$SECS" -v a=$((CPU_A1 - CPU_A0)) -v b=$((CPU_B1 - CPU_B0)) -v r=$((CPU_R1 - CPU_R0)) \
    -v x=$((CPU_N1 - CPU_N0)) 'BEGIN {
    ca = a / t; cb = b / t; cr = r / t; cn = x / t
    printf "CPU seconds  broker a %.2f, broker b %.2f, redis %.2f, nginx %.2f (of %d s wall)\n", ca, cb, cr, cn, s
    if (ca + cb > 0) printf "per core     %.0f req/s per broker CPU-second; redis %.0f req/s per CPU-second; nginx %.0f req/s per CPU-second\n",
        n / (ca + cb), (cr > 0 ? n / cr : 0), (cn > 0 ? n / cn : 0) }'

# Redis memory per live token (the shared store's cost): mint LOAD_REDIS_TOKENS on broker a
if [ "$REDIS_TOKENS" -gt 0 ] 2>/dev/null; then
    used() { redis-cli -p "$REDIS_PORT" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'; }
    mint_lua "$CAPS_TYPICAL" redis
    K0=$(live a); U0=$(used)
    RM=$(mint_n a "$REDIS_TOKENS" redis)
    K1=$(live a); U1=$(used)
    case "$RM" in *"bad=0 "*) ;; *) say "load.sh: some mints failed (redis): $RM"; FAILED=1 ;; esac
    awk -v k0="$K0" -v k1="$K1" -v u0="$U0" -v u1="$U1" -v mj="${#CAPS_TYPICAL}" 'BEGIN {
        if (k1 > k0) printf "redis memory %.0f bytes of used_memory per live token (%d tokens, each its own run; manifest %d bytes of JSON)\n", (u1 - u0) / (k1 - k0), k1 - k0, mj }'
fi
fi

# --- part 2: memory per live token -----------------------------------------------
# Two fresh memory-store brokers: one gets tokens with an empty manifest (the fixed cost of a
# record), the other tokens with a typical small manifest (the manifest's cost is the difference).
# Each gets a warm-up of 1,000 tokens first, so that one-time allocations (arenas, buffers) are not
# counted; the growth is divided by the live-token count the broker reports (sb_tokens_live).
if [ "$MEM_TOKENS" -gt 0 ] 2>/dev/null; then
    WARM=1000
    # mem_case NAME CAPS: prints "bytes_per_token live_tokens rss0_kib rss1_kib rss2_kib"
    mem_case() {
        local name=$1 caps=$2 r0 r1 r2 l1 l2 w m
        start_broker "$name" memory SANDBOX_BROKER_MAX_TOKENS=200000 SANDBOX_BROKER_MAX_TTL_MS=3600000 SANDBOX_BROKER_LOG_CALLS=false
        mint_lua "$caps" "$name"
        r0=$(rss_kib "${PID_OF[$name]}")
        w=$(mint_n "$name" "$WARM" "$name")
        l1=$(live "$name"); r1=$(rss_kib "${PID_OF[$name]}")
        m=$(mint_n "$name" "$MEM_TOKENS" "$name")
        l2=$(live "$name"); r2=$(rss_kib "${PID_OF[$name]}")
        case "$w $m" in *"bad=0 "*"bad=0 "*) ;; *) say "load.sh: some mints failed ($name): $w / $m"; return 1 ;; esac
        [ $((l2 - l1)) -gt 0 ] || { say "load.sh: no tokens were minted ($name)"; return 1; }
        kill -TERM "${PID_OF[$name]}" 2>/dev/null
        echo "$(( (r2 - r1) * 1024 / (l2 - l1) )) $l2 $r0 $r1 $r2"
    }
    # start_broker sets PORT/ADMIN/PID_OF and PIDS, so it must not run in a subshell: run each case
    # in the current shell and capture its line through a file
    mem_case mem-empty "$CAPS_EMPTY" >"$WORK/mem-empty.txt" || FAILED=1
    mem_case mem-typical "$CAPS_TYPICAL" >"$WORK/mem-typical.txt" || FAILED=1
    E=$(tail -1 "$WORK/mem-empty.txt") T=$(tail -1 "$WORK/mem-typical.txt")
    if [ -n "$E" ] && [ -n "$T" ]; then
        echo
        echo "== memory store: RSS per live token (max_tokens 200000, $MEM_TOKENS tokens after a warm-up of $WARM)"
        M_JSON=${#CAPS_TYPICAL}
        awk -v e="$E" -v t="$T" -v mj="$M_JSON" -v n="$MEM_TOKENS" 'BEGIN {
            split(e, E, " "); split(t, T, " ")
            ep = E[1]; tp = T[1]
            printf "empty manifest    %5d bytes per token  (RSS %.1f -> %.1f MiB, %d live tokens)\n", ep, E[3]/1024, E[5]/1024, E[2]
            printf "typical manifest  %5d bytes per token  (RSS %.1f -> %.1f MiB, %d live tokens; manifest %d bytes of JSON)\n", tp, T[3]/1024, T[5]/1024, T[2], mj
            printf "so                a record costs ~%d bytes and this manifest ~%d bytes once parsed (the token bucket array,\n", ep, tp - ep
            printf "                  2 MiB at this max_tokens, is included: at most %.0f bytes per token; these runs made no calls,\n", 262144 * 8 / n
            printf "                  so no per-run quota counters are counted)\n"
            printf "docs/config.md    \"about 0.5 KiB plus the manifest\": %d bytes for this manifest (512 + its JSON size)\n", 512 + mj
            printf "verdict           %s: measured %.2fx the statement (record ~%d vs 512 bytes; manifest ~%d vs %d bytes)\n",
                (tp <= (512 + mj) * 1.1 ? "holds" : "does NOT hold"), tp / (512 + mj), ep, tp - ep, mj
        }'
    fi
fi
exit "$FAILED"

#!/usr/bin/env bash
# collections.<n>.findOne by key: through the broker (wrk, JSON RPC) against the
# same parameterised statement sent straight through libpq (pg_direct.c, one
# connection per thread), at equal concurrency, against one throwaway
# PostgreSQL, alternating the cases round by round in one run. Two direct
# baselines: "direct" sends the statement whole every call (PQexecParams),
# "directp" prepares it once per connection (PQexecPrepared), as the broker's
# statement cache does. Prints throughput, p50/p99 and, for the broker cases,
# the broker's CPU time per call (from /proc, so a busy machine skews it
# less than the rates), and the ratios broker/direct and broker/directp
# (target >= 0.9x, informational). A further case, "ceiling", calls globals.site.get through the
# same broker (no database): the broker's own RPC cost at this concurrency, to
# tell the database path from the HTTP layer. Everything listens on
# 127.0.0.1; the cluster, the broker and the work directory are removed on
# exit. Runtime: about 60 s with the defaults.
#
# Environment (all optional):
#   BROKER          broker binary                         (default: build/bin/sandbox-broker)
#   BENCH_SECONDS   seconds per measurement               (default: 5)
#   BENCH_ROUNDS    alternating rounds                    (default: 3)
#   BENCH_WARMUP    warm-up seconds per case, once        (default: 2)
#   BENCH_CONNS     wrk connections = pg_direct threads   (default: 16)
#   BENCH_THREADS   broker worker threads                 (default: 1)
#   BENCH_ROWS      rows in the table                     (default: 10000)
#   BENCH_PG_BIN    PostgreSQL server binaries            (default: newest /usr/lib/postgresql/*/bin)
#   BENCH_BUILD_DIR where pg_direct is built              (default: build/bench)
#   BENCH_CASES     subset of "direct directp broker ceiling" (default: all four)
#   BENCH_PG_SOCKET=1  the broker and pg_direct reach PostgreSQL over its unix socket (default: 127.0.0.1)
#   BENCH_KEEP=1    keep the work directory (logs, lua script, raw results)
# Exit status: 0 when both cases ran and every call returned its row (the
# ratio target is informational); 1 otherwise.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
SECS=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
WARMUP=${BENCH_WARMUP:-2}
CONNS=${BENCH_CONNS:-16}
THREADS=${BENCH_THREADS:-1}
# equal concurrency: the broker's database connections match the direct client's
POOL=$(( CONNS / THREADS > 0 ? CONNS / THREADS : 1 ))
ROWS=${BENCH_ROWS:-10000}
BUILD_DIR=${BENCH_BUILD_DIR:-$ROOT/build/bench}
SECRET="bench-admin-secret-$$-0123456789abcdef"
TENANT=bench
CASES=${BENCH_CASES:-direct directp broker ceiling}

say() { printf '%s\n' "$*" >&2; }
die() { say "pg.sh: $*"; exit 1; }

for tool in wrk curl gcc pkg-config psql; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y wrk curl gcc pkg-config postgresql postgresql-client libpq-dev)"
done
[ -x "$BROKER" ] || die "no broker binary at $BROKER (build it: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j2)"
PG_BIN=${BENCH_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
[ -x "$PG_BIN/initdb" ] && [ -x "$PG_BIN/pg_ctl" ] || die "no initdb/pg_ctl in '$PG_BIN' (apt-get install -y postgresql; or set BENCH_PG_BIN)"

WORK=$(mktemp -d /tmp/sb-bench-pg.XXXXXX)
chmod 755 "$WORK"
BROKER_PID=
PG_STARTED=0
AS_PG=()
if [ "$(id -u)" = 0 ]; then
    # initdb refuses to run as root (deps.md section 5)
    AS_PG=(runuser -u postgres --)
fi
cleanup() {
    if [ -n "$BROKER_PID" ]; then
        kill -TERM "$BROKER_PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$BROKER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$BROKER_PID" 2>/dev/null
        wait "$BROKER_PID" 2>/dev/null
    fi
    if [ "$PG_STARTED" = 1 ]; then
        "${AS_PG[@]}" "$PG_BIN/pg_ctl" -D "$WORK/pg/data" -m immediate -w -s stop >/dev/null 2>&1
    fi
    if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- pg_direct ---
DIRECT=$BUILD_DIR/pg_direct
if [ ! -x "$DIRECT" ] || [ "$ROOT/tests/bench/pg_direct.c" -nt "$DIRECT" ]; then
    mkdir -p "$BUILD_DIR"
    # shellcheck disable=SC2046
    gcc -std=c11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Werror -o "$DIRECT" "$ROOT/tests/bench/pg_direct.c" \
        $(pkg-config --cflags --libs libpq) -lpthread || die "pg_direct build failed"
fi

free_port() {
    local p
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 30000))
        if [ -z "$(ss -Htln "sport = :$p" 2>/dev/null)" ]; then echo "$p"; return 0; fi
    done
    return 1
}

# --- PostgreSQL ---
PG_PORT=$(free_port) || die "no free port for PostgreSQL"
mkdir -p "$WORK/pg"
[ ${#AS_PG[@]} -eq 0 ] || chown postgres: "$WORK/pg"
"${AS_PG[@]}" "$PG_BIN/initdb" -D "$WORK/pg/data" -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8 >"$WORK/initdb.log" 2>&1 ||
    die "initdb failed: $(tail -5 "$WORK/initdb.log")"
# a port that was free when looked at can be taken before the server binds it: try another
for attempt in 1 2 3 4 5; do
    if "${AS_PG[@]}" "$PG_BIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w -s -o \
        "-p $PG_PORT -k $WORK/pg -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c max_connections=300" \
        start >/dev/null 2>&1; then
        PG_STARTED=1
        break
    fi
    PG_PORT=$(free_port) || die "no free port for PostgreSQL"
done
[ "$PG_STARTED" = 1 ] || die "pg_ctl start failed: $(tail -5 "$WORK/pg/log")"
PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
DIRECT_CONNINFO="host=127.0.0.1 port=$PG_PORT user=postgres dbname=postgres"
if [ "${BENCH_PG_SOCKET:-0}" = 1 ]; then
    # the broker and pg_direct both over the cluster's unix socket (no TCP stack on the database's side)
    PG_URL="host=$WORK/pg port=$PG_PORT user=postgres dbname=postgres"
    DIRECT_CONNINFO=$PG_URL
fi
psql "$PG_URL" -X -q -v ON_ERROR_STOP=1 >/dev/null <<SQL || die "schema setup failed"
CREATE TABLE posts (id bigserial PRIMARY KEY, tenant_id text NOT NULL, title text, views int, score float8, price numeric,
                    published boolean, meta jsonb, blob bytea, created timestamptz DEFAULT now(), uid uuid);
INSERT INTO posts (tenant_id, title, views, score, price, published, meta, blob, uid)
SELECT '$TENANT', 'post ' || g, g % 1000, g / 7.0, (g * 1.25)::numeric, g % 2 = 0, jsonb_build_object('n', g, 'tags', jsonb_build_array('a', 'b')),
       decode(md5(g::text), 'hex'), md5(g::text)::uuid
FROM generate_series(1, $ROWS) g;
VACUUM ANALYZE posts;
SQL

# --- the broker ---
cat >"$WORK/broker.json" <<EOF
{"database_url": "$PG_URL", "threads": $THREADS, "database_pool_size": $POOL, "log_calls": false,
 "targets": {"app": {"collections": {"posts": {"table": "posts", "key": "id", "max_limit": 100,
                                               "scope": {"tenant_id": "tenantId"}}},
                     "globals": {"site": {"value": {"name": "bench"}}}}}}
EOF
SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
    "$BROKER" --config "$WORK/broker.json" 2>"$WORK/broker.log" >/dev/null &
BROKER_PID=$!
for _ in $(seq 100); do grep -q '"event":"started"' "$WORK/broker.log" 2>/dev/null && break; sleep 0.05; done
PORT=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$WORK/broker.log" | head -1)
ADMIN=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$WORK/broker.log" | head -1)
[ -n "$PORT" ] && [ -n "$ADMIN" ] || die "broker did not start: $(tail -5 "$WORK/broker.log")"
# every worker introspects on its own pool
for _ in $(seq 200); do
    [ "$(grep -c '"event":"pg.ready"' "$WORK/broker.log")" -ge "$THREADS" ] && break
    sleep 0.05
done
[ "$(grep -c '"event":"pg.ready"' "$WORK/broker.log")" -ge "$THREADS" ] || die "broker did not introspect: $(tail -5 "$WORK/broker.log")"

mint() { # extra JSON fields; every token is a run of its own (quotas count per run id)
    curl -s -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
        -d "{\"runId\":\"bench-pg-$$-$(date +%s%N)\",\"ttlMs\":3600000,\"target\":\"app\",\"scope\":{\"tenantId\":\"$TENANT\"},\"capabilities\":{\"data\":{\"collections\":{\"posts\":[\"read\"]},\"globals\":{\"site\":[\"read\"]}}}$1}" \
        "http://127.0.0.1:$ADMIN/admin/v1/tokens"
}
# new_token: a token of its own run. Per-run quotas (where the broker has them) would end a run long
# before the benchmark does: raise them, and use a fresh run for every measurement (at most 10^6 calls).
new_token() {
    local body tok
    body=$(mint ',"quotas":{"calls":1000000,"concurrent":1024}')
    tok=$(printf '%s' "$body" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
    if [ -z "$tok" ]; then
        body=$(mint '')
        tok=$(printf '%s' "$body" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
    fi
    [ -n "$tok" ] || die "mint answered: $body"
    printf '%s' "$tok"
}
TOKEN=$(new_token) || exit 1

# sanity: one call each way returns the row
GOT=$(curl -s -X POST -H 'Content-Type: application/json' -H "x-questpie-sandbox-token: $TOKEN" \
    -d '{"method":"collections.posts.findOne","args":{"where":{"id":42}}}' "http://127.0.0.1:$PORT/api/sandbox/rpc")
case $GOT in *'"ok":true'*'"id":42'*) ;; *) die "broker findOne answered: $GOT" ;; esac
"$DIRECT" "$DIRECT_CONNINFO" 1 0.2 "$ROWS" "$TENANT" >/dev/null ||
    die "pg_direct sanity run failed"

# write_lua FILE BODY-EXPRESSION TOKEN: a wrk script counting replies that are ok and not null
write_lua() {
cat >"$1" <<EOF
wrk.method = "POST"
wrk.path = "/api/sandbox/rpc"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-questpie-sandbox-token"] = "$3"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) good = 0; bad = 0; last_bad = 0; math.randomseed(os.time() + math.random(1000000)) end
function request()
  return wrk.format(nil, nil, nil, $2)
end
function response(status, headers, body)
  if status == 200 and string.find(body, '"ok":true', 1, true) and not string.find(body, '"value":null', 1, true) then
    good = good + 1
  else
    bad = bad + 1; last_bad = status
  end
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
BODY_broker="'{\"method\":\"collections.posts.findOne\",\"args\":{\"where\":{\"id\":' .. math.random($ROWS) .. '}}}'"
BODY_ceiling="'{\"method\":\"globals.site.get\",\"args\":{}}'"

FAILED=0
RESULTS=$WORK/results.txt
: >"$RESULTS"
WRK_THREADS=$(( $(nproc) > 1 ? 2 : 1 ))

# the broker's utime + stime, in clock ticks (/proc/PID/stat fields 14 and 15; the name in field 2 has no spaces)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$BROKER_PID/stat"; }

# run_case CASE SECONDS ROUND (ROUND 0 = warm-up, not recorded)
run_case() {
    local c=$1 secs=$2 round=$3 out line
    if [ "$c" != direct ] && [ "$c" != directp ]; then
        local body_var=BODY_$c tok
        local cpu0 cpu1 req
        tok=$(new_token) || exit 1
        write_lua "$WORK/$c.lua" "${!body_var}" "$tok"
        cpu0=$(cpu_ticks)
        out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"${secs}s" --timeout 5s -s "$WORK/$c.lua" "http://127.0.0.1:$PORT" 2>&1)
        cpu1=$(cpu_ticks)
        kill -0 "$BROKER_PID" 2>/dev/null || { say "the broker died; log tail:"; tail -5 "$WORK/broker.log" >&2; exit 1; }
    else
        local mode=unnamed
        [ "$c" = directp ] && mode=prepared
        out=$("$DIRECT" "$DIRECT_CONNINFO" "$CONNS" "$secs" "$ROWS" "$TENANT" "$mode" 2>&1)
    fi
    line=$(printf '%s\n' "$out" | grep '^BENCH ' | tail -1)
    if [ -z "$line" ]; then
        say "case $c gave no result:"; say "$out"; FAILED=1; return
    fi
    if [ "$c" != direct ] && [ "$c" != directp ]; then
        # the broker's CPU (user + system) per call over the measurement
        req=$(printf '%s\n' "$line" | sed -n 's/.* requests=\([0-9]*\).*/\1/p')
        line="$line cpu_us=$(awk -v a="$cpu0" -v b="$cpu1" -v n="$req" -v hz="$(getconf CLK_TCK)" \
            'BEGIN { printf "%.1f", (n > 0 ? (b - a) * 1e6 / hz / n : 0) }')"
    fi
    [ "$round" = 0 ] && return
    echo "$c $round $line" >>"$RESULTS"
    say "  round $round  $(printf '%-7s' "$c") ${line#BENCH }"
}

LOAD0=$(cut -d' ' -f1 /proc/loadavg)
say "load average before the run: $LOAD0"
awk -v l="$LOAD0" 'BEGIN { exit !(l > 0.5) }' &&
    say "warning: the machine is busy (load $LOAD0); other work on the cores skews the numbers, compare the paired column"
say "collections.posts.findOne by key: $(nproc) cores, broker threads=$THREADS (pool of $POOL connections each), -c$CONNS" \
    "(pg_direct: $CONNS threads, one connection each), ${ROUNDS}x${SECS}s, $ROWS rows"
for c in $CASES; do
    case $c in direct|directp|broker|ceiling) ;; *) die "unknown case $c (cases: direct directp broker ceiling)" ;; esac
done
for c in $CASES; do run_case "$c" "$WARMUP" 0; done
for r in $(seq "$ROUNDS"); do
    for c in $CASES; do run_case "$c" "$SECS" "$r"; done
done

awk '
function val(s, k,   i, a) { for (i = 3; i <= NF; ++i) { split($i, a, "="); if (a[1] == k) return a[2] } return 0 }
{
    c = $1; n[c]++
    rps[c] += val($0, "rps"); p50[c] += val($0, "p50_us"); p99[c] += val($0, "p99_us"); cpu[c] += val($0, "cpu_us")
    req[c] += val($0, "requests"); bad[c] += val($0, "bad"); serr[c] += val($0, "sockerr")
    byround[c, $2] = val($0, "rps"); rounds[$2] = 1
}
function paired(base,   k, m, i, j, t, v) {
    m = 0
    for (k in rounds) if (((("broker", k) in byround) && (base, k) in byround) && byround[base, k] > 0) v[++m] = byround["broker", k] / byround[base, k]
    if (m == 0) return -1
    for (i = 2; i <= m; ++i) for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
}
END {
    printf "\n%-8s %10s %9s %9s %10s %6s %7s %12s\n", "case", "calls/s", "p50 ms", "p99 ms", "calls", "bad", "sockerr", "cpu us/call"
    for (i = 1; i <= 4; ++i) {
        c = (i == 1) ? "direct" : (i == 2) ? "directp" : (i == 3) ? "broker" : "ceiling"; if (!(c in n)) continue
        printf "%-8s %10.0f %9.3f %9.3f %10d %6d %7d %12s\n", c, rps[c] / n[c], p50[c] / n[c] / 1000, p99[c] / n[c] / 1000, req[c], bad[c], serr[c],
            (c == "broker" || c == "ceiling") ? sprintf("%.1f", cpu[c] / n[c]) : "-"
    }
    for (i = 1; i <= 2; ++i) {
        base = (i == 1) ? "direct" : "directp"
        if ((base in n) && ("broker" in n) && rps[base] > 0) {
            r = (rps["broker"] / n["broker"]) / (rps[base] / n[base]); p = paired(base)
            printf "\nbroker / %s throughput: %.2fx (median of per-round ratios %.2fx); target >= 0.90x: %s (informational); p99 %.3f ms vs %.3f ms\n",
                base, r, p, (r >= 0.9 ? "PASS" : "FAIL"), p99["broker"] / n["broker"] / 1000, p99[base] / n[base] / 1000
        }
    }
    if (("ceiling" in n) && ("broker" in n) && rps["ceiling"] > 0)
        printf "broker findOne / the same broker without a database (globals.site.get): %.2fx\n", (rps["broker"] / n["broker"]) / (rps["ceiling"] / n["ceiling"])
}' "$RESULTS" || { say "pg.sh: could not summarise $RESULTS"; FAILED=1; }

if awk '{ for (i = 3; i <= NF; ++i) if (($i ~ /^bad=/ && $i != "bad=0") || ($i ~ /^sockerr=/ && $i != "sockerr=0")) f = 1 } END { exit !f }' "$RESULTS"; then
    say "pg.sh: some calls failed (bad or socket errors); the numbers above are not valid"
    FAILED=1
fi
exit "$FAILED"

#!/usr/bin/env bash
# Installs test needs, builds (plain and ASan+UBSan), starts every server the
# tests use on loopback (Redis, PostgreSQL), runs the whole suite in both builds plus a short fuzz
# smoke, and stops the servers. Exit status: 0 only when everything passed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=$(nproc)

./scripts/install-deps.sh --test

# npm packages the tests run for real: Deno (the guest runtime) and an MCP server
export SB_NODE_PREFIX=${SB_NODE_PREFIX:-$ROOT/.cache/node}
if [ ! -x "$SB_NODE_PREFIX/node_modules/.bin/deno" ]; then
    mkdir -p "$SB_NODE_PREFIX"
    npm install --prefix "$SB_NODE_PREFIX" --no-audit --no-fund --loglevel=error deno@2.9.6 >/dev/null
fi
if [ ! -f "$SB_NODE_PREFIX/node_modules/@modelcontextprotocol/server-everything/dist/index.js" ]; then
    npm install --prefix "$SB_NODE_PREFIX" --no-audit --no-fund --loglevel=error \
        @modelcontextprotocol/server-everything@2025.11.25 >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$JOBS"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSB_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$JOBS"

# --- servers ---------------------------------------------------------------
WORK=$(mktemp -d /tmp/sb-tests.XXXXXX)
REDIS_PORT=${SB_TEST_REDIS_PORT:-6390}
PG_PORT=${SB_TEST_PG_PORT:-6432}
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
cleanup() {
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    [ -d "$WORK/pg/data" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m immediate -w -s stop >/dev/null 2>&1
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/redis" \
    --daemonize yes --pidfile "$WORK/redis/redis.pid" --logfile "$WORK/redis/redis.log"
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$REDIS_PORT" ping >/dev/null
export SB_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT"

# PostgreSQL: initdb and pg_ctl refuse to run as root, so they run as postgres
chmod 755 "$WORK"
mkdir -p "$WORK/pg" && chown postgres: "$WORK/pg"
runuser -u postgres -- "$PGBIN/initdb" -D "$WORK/pg/data" -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8 >/dev/null
runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w -s \
    -o "-p $PG_PORT -k $WORK/pg -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start
export SB_TEST_PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"

# --- suites ----------------------------------------------------------------
status=0
echo "== lint"
./scripts/checksrc || status=1
./scripts/verify-unit build/bin/sandbox-broker || status=1

echo "== fuzz smoke"
if [ -x fuzz/run-smoke.sh ]; then
    FUZZ_SECONDS=${FUZZ_SECONDS:-5} fuzz/run-smoke.sh || status=1
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/lsan.supp:print_suppressions=0}
echo "== tests under ASan+UBSan"
(cd build-asan && ctest --output-on-failure -j"$JOBS") || status=1
echo "== tests"
(cd build && ctest --output-on-failure -j"$JOBS") || status=1
exit $status

#!/usr/bin/env bash
# Installs test needs, builds every build type warning-free with -Werror (RelWithDebInfo, Debug with
# ASan+UBSan, Release, MinSizeRel), starts every server the tests use on loopback (Redis, PostgreSQL),
# runs the lint (banned functions, caps, formatting), a short fuzz smoke and the whole suite in three
# builds (ASan+UBSan, RelWithDebInfo, Release: what packagers build), and stops the servers.
# Exit status: 0 only when everything passed and no test was skipped.
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

# every build type with -Werror (CI keeps it; packagers may pass -DSB_WERROR=OFF)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSB_WERROR=ON >/dev/null
cmake --build build -j"$JOBS"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSB_SANITIZE=ON -DSB_WERROR=ON >/dev/null
cmake --build build-asan -j"$JOBS"
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DSB_WERROR=ON >/dev/null
cmake --build build-release -j"$JOBS"
cmake -S . -B build-minsize -DCMAKE_BUILD_TYPE=MinSizeRel -DSB_WERROR=ON >/dev/null
cmake --build build-minsize -j"$JOBS"

# --- servers ---------------------------------------------------------------
# The jailed guests run under uids of their own, and PostgreSQL as postgres: they must be able to
# reach the checkout (a clone inside a 0700 directory, e.g. one made by mktemp -d, is not). Grant
# search (x, never read) on the directories above it that lack it, and say so.
d=$ROOT
while :; do
    case "$(stat -c %A "$d" | cut -c10)" in
    x | t) ;;
    *)
        echo "tests/run.sh: granting other users search permission on $d (the jailed guests read the checkout)"
        chmod o+x "$d"
        ;;
    esac
    [ "$d" = / ] && break
    d=$(dirname "$d")
done
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
# every test runs here: one that skips itself fails its module (tests/integration/sbtest.py)
export SB_TEST_NO_SKIP=1

# --- suites ----------------------------------------------------------------
status=0
echo "== lint"
./scripts/checksrc || status=1
./scripts/checkformat || status=1
./scripts/verify-unit build/bin/sandbox-broker || status=1

echo "== fuzz smoke"
if [ -x fuzz/run-smoke.sh ]; then
    FUZZ_SECONDS=${FUZZ_SECONDS:-5} fuzz/run-smoke.sh || status=1
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/lsan.supp:print_suppressions=0}
# the check target builds what the tests need and runs them all; a test ctest reports as not run
# (a shim test that exits 77) fails the suite like a skipped integration test does (SB_TEST_NO_SKIP)
suite() {
    local dir=$1 log=$WORK/$1.log rc=0
    cmake --build "$dir" --target check 2>&1 | tee "$log" || rc=1
    if grep -q "The following tests did not run" "$log"; then
        echo "$dir: tests were skipped (listed above); every test must run here"
        rc=1
    fi
    return $rc
}
echo "== tests under ASan+UBSan"
suite build-asan || status=1
echo "== tests"
suite build || status=1
echo "== tests, Release build"
suite build-release || status=1
exit $status

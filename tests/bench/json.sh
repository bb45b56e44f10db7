#!/usr/bin/env bash
# The JSON benchmark (tests/bench/json.c): the RPC route's JSON decode and encode, the jansson route
# against the one-pass one, in one run, as ratios. Builds build/bench/bench_json with the main CMake
# build (RelWithDebInfo unless BUILD_DIR says otherwise) and runs it.
#
#   BUILD_DIR     CMake build directory       (default: build)
#   BENCH_ROUNDS  alternating rounds          (default: 5)
#   BENCH_MS      milliseconds per measurement (default: 300)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD_DIR" --target bench_json >/dev/null
exec "$BUILD_DIR/bench/bench_json"

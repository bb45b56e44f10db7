#!/usr/bin/env bash
# The log line benchmark (tests/bench/logline.c): what one call log line costs, in ns, beside one
# snprintf of the same fields and a memcpy of the finished line, in one run. Builds
# build/bench/bench_logline with the main CMake build (RelWithDebInfo unless BUILD_DIR says
# otherwise) and runs it.
#
#   BUILD_DIR     CMake build directory       (default: build)
#   BENCH_ROUNDS  alternating rounds          (default: 7)
#   BENCH_LINES   lines per measurement       (default: 200000)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD_DIR" --target bench_logline >/dev/null
exec "$BUILD_DIR/bench/bench_logline"

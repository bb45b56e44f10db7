#!/bin/sh
# Builds the libFuzzer drivers (clang, ASan+UBSan) and runs each one over its
# committed corpus, then fuzzes it for FUZZ_SECONDS (default 10) seconds.
# Exits non-zero if any driver crashes, fails a property, leaks, times out or
# runs out of memory; reproducers are kept in $FUZZ_BUILD_DIR/fuzz/artifacts/.
#
# Environment:
#   FUZZ_SECONDS    fuzzing time per driver after the corpus run (default 10; 0: corpus only)
#   FUZZ_TARGETS    space-separated subset of drivers (default: every fuzz/fuzz_<target>.c)
#   FUZZ_BUILD_DIR  build directory (default: build-fuzz)
#   FUZZ_TIMEOUT    per-input timeout in seconds (default 10)
#   SB_FUZZ_KNOWN   tolerate known, reported bugs (see fuzz/README.md); default strict
set -eu

cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-10}
build=${FUZZ_BUILD_DIR:-build-fuzz}
timeout=${FUZZ_TIMEOUT:-10}
# default: every fuzz/fuzz_<target>.c
all=$(for f in fuzz/fuzz_*.c; do t=${f#fuzz/fuzz_}; echo "${t%.c}"; done | tr '\n' ' ')
targets=${FUZZ_TARGETS:-$all}

CC=clang cmake -S . -B "$build" -DSB_FUZZ=ON -DSB_TESTS=OFF >/dev/null
# only the drivers: the broker binary is not needed here
exes=""
for t in $targets; do exes="$exes fuzz_$t"; done
# shellcheck disable=SC2086
cmake --build "$build" -j"$(nproc)" --target $exes

failed=""
summary=""
for t in $targets; do
    exe="$build/fuzz/fuzz_$t"
    art="$build/fuzz/artifacts/$t"
    log="$build/fuzz/fuzz_$t.log"
    # new inputs go to a scratch directory, never into the committed corpus
    scratch=$(mktemp -d)
    mkdir -p "$art"
    set -- -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$art/"
    if [ "$seconds" = 0 ]; then
        set -- -runs=0 -timeout="$timeout" -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art/"
    fi
    if [ -f "fuzz/$t.dict" ]; then
        set -- "$@" -dict="fuzz/$t.dict"
    fi
    echo "== fuzz_$t (corpus fuzz/corpus/$t, ${seconds}s)"
    if "$exe" "$@" "$scratch" "fuzz/corpus/$t" >"$log" 2>&1; then
        status=ok
    else
        status=FAILED
        failed="$failed $t"
        grep -E 'property failed|ERROR:|runtime error|^\*\*\*|Test unit written' "$log" | head -20 || true
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    summary="$summary$(printf '%-10s %-7s runs=%-10s exec/s=%s' "$t" "$status" "${runs:-?}" "${rate:-?}")
"
    rm -rf "$scratch"
done

echo
printf '%s' "$summary"
if [ -n "$failed" ]; then
    echo "fuzz smoke FAILED:$failed (logs: $build/fuzz/fuzz_<target>.log, reproducers: $build/fuzz/artifacts/)"
    exit 1
fi
echo "fuzz smoke passed"

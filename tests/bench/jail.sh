#!/usr/bin/env bash
# The cost of the guest's own filesystem: run latency of this checkout's jail against the jail of a
# previous revision (default: the merge base with main, the jail without a mount namespace, with
# the deny-list filter and a work directory on the host), in the same run, as a ratio.
#
# What runs (nothing leaves loopback; the broker URL names a closed port: the guests make no call):
#   - the previous revision is checked out into a temporary git worktree and only its sandbox-shim
#     is built there (cmake, RelWithDebInfo, -j2); the worktree is removed at exit;
#   - Deno runs: `sandbox-shim run` of `export default () => 1;`, spawn to outcome, timed by bash
#     ($EPOCHREALTIME, no fork), old and new alternating, BENCH_N each;
#   - C guest runs: `sandbox-shim relay -- jail_probe probe --only hostname` (build/tests/jail_probe,
#     the same guest binary for both), alternating the same way. This one shows the jail's fixed
#     cost per run (namespaces, id maps, the root's mounts, the filter), which Deno's start hides.
# Both shims run with the jail on (the default), as whoever runs the script (root: a uid per guest).
#
# Output: per kind the p50 and p90 in milliseconds of each and the ratio new/old of the p50s.
# Informational: no target fails the script. Timing only here, never in a pass/fail test.
#
# Measured on the 2-core VM (BENCH_N 40, as root, Deno 2.9.6): see tests/bench/README.md, "jail".
#
# Environment (all optional):
#   BASE_REV     the revision to compare with (default: git merge-base HEAD main)
#   SHIM         this checkout's shim (default: build/bin/sandbox-shim)
#   PROBE        the C guest (default: build/tests/jail_probe)
#   DENO         Deno (default: $SB_NODE_PREFIX/node_modules/.bin/deno, else deno on PATH)
#   BENCH_N      runs of each kind per shim (default 40)
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
SHIM=${SHIM:-$here/build/bin/sandbox-shim}
PROBE=${PROBE:-$here/build/tests/jail_probe}
BENCH_N=${BENCH_N:-40}
BASE_REV=${BASE_REV:-$(git -C "$here" merge-base HEAD main)}
if [ -z "${DENO:-}" ]; then
    if [ -n "${SB_NODE_PREFIX:-}" ] && [ -x "$SB_NODE_PREFIX/node_modules/.bin/deno" ]; then
        DENO=$SB_NODE_PREFIX/node_modules/.bin/deno
    else
        DENO=$(command -v deno || true)
    fi
fi
for f in "$SHIM" "$PROBE"; do
    [ -x "$f" ] || { echo "jail.sh: $f not built (cmake --build build)" >&2; exit 2; }
done

work=$(mktemp -d /tmp/sb-bench-jail-XXXXXX)
chmod 755 "$work"
old_tree=$work/old
cleanup() {
    git -C "$here" worktree remove --force "$old_tree" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "jail.sh: building sandbox-shim at $BASE_REV in a temporary worktree" >&2
git -C "$here" worktree add --detach "$old_tree" "$BASE_REV" >/dev/null 2>&1
cmake -S "$old_tree" -B "$old_tree/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$old_tree/build" -j2 --target sandbox-shim >/dev/null
OLD=$old_tree/build/bin/sandbox-shim

token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export SB_BENCH_TOKEN=$token
url="http://127.0.0.1:9/rpc" # discard port, closed: no call is made
src=$work/guest.js
echo 'export default () => 1;' >"$src"
chmod 644 "$src"

# one timed invocation; prints milliseconds; fails loudly if the run did not succeed
timed() {
    local t0 t1 out
    t0=$EPOCHREALTIME
    out=$("$@" 2>/dev/null) || { echo "jail.sh: run failed: $*" >&2; exit 1; }
    t1=$EPOCHREALTIME
    case $out in *'"ok":true'*) ;; *) echo "jail.sh: not ok: $out" >&2; exit 1 ;; esac
    echo "$t0 $t1" | awk '{printf "%.3f\n", ($2 - $1) * 1000}'
}

stats() { # file -> "p50 p90"
    sort -n "$1" | awk '{a[NR]=$1} END {i50=int((NR+1)/2); i90=int(NR*0.9); if (i90<1) i90=1; printf "%.2f %.2f\n", a[i50], a[i90]}'
}

kind() { # name, then the command after the shim binary
    local name=$1
    shift
    : >"$work/$name.old"
    : >"$work/$name.new"
    for _ in $(seq 1 "$BENCH_N"); do
        timed "$OLD" "$@" >>"$work/$name.old"
        timed "$SHIM" "$@" >>"$work/$name.new"
    done
    read -r o50 o90 < <(stats "$work/$name.old")
    read -r n50 n90 < <(stats "$work/$name.new")
    printf '%-10s old p50 %8s ms  p90 %8s ms | new p50 %8s ms  p90 %8s ms | new/old p50 %s\n' "$name" "$o50" "$o90" "$n50" \
        "$n90" "$(awk -v a="$n50" -v b="$o50" 'BEGIN {printf "%.2fx", a / b}')"
}

echo "load: $(cut -d' ' -f1-3 /proc/loadavg); runs per kind and shim: $BENCH_N; base $BASE_REV; uid $(id -u)"
kind c-guest relay --broker-url "$url" --token-env SB_BENCH_TOKEN -- "$PROBE" probe --only hostname
if [ -n "$DENO" ]; then
    kind deno run --broker-url "$url" --token-env SB_BENCH_TOKEN --source "$src" --deno "$DENO"
else
    echo "deno: not found (set DENO or SB_NODE_PREFIX); skipped"
fi

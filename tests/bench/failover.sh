#!/usr/bin/env bash
# Failover benchmark: how soon the Redis store answers normally again after
# Redis comes back (outages of several lengths) and after a Sentinel
# failover (promotion to first good answer). See tests/bench/README.md.
#
# Environment (all optional):
#   SB_BIN_DIR     directory holding sandbox-broker (default: build/bin)
#   BENCH_OUTAGES  outage lengths in seconds (default: "0.5 2 5 10")
#   BENCH_ROUNDS   Sentinel failovers, each on a fresh topology (default: 3)
# Arguments: "plain", "sentinel" or both (the default).
# Exit status: 0 when every answer was a right one and every recovery came
# within 10 s (the goals are reported, not enforced); 1 otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export SB_BIN_DIR=${SB_BIN_DIR:-$ROOT/build/bin}
for tool in redis-server redis-sentinel; do
    command -v "$tool" >/dev/null || { echo "failover.sh: $tool not found (apt-get install -y redis-server redis-sentinel)" >&2; exit 1; }
done
[ -x "$SB_BIN_DIR/sandbox-broker" ] || { echo "failover.sh: no broker at $SB_BIN_DIR/sandbox-broker" >&2; exit 1; }
echo "load average before the run: $(cut -d' ' -f1 /proc/loadavg)"
exec /usr/bin/python3 -u -W ignore "$ROOT/tests/bench/failover.py" "$@"

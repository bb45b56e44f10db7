#!/usr/bin/env bash
# Token memory benchmark: starts the broker on the memory token store, reads
# its resident memory, mints BENCH_TOKENS tokens through the admin API with
# realistic manifests (most of them shared by many runs, some of them each
# run's own), reads the resident memory again and prints the difference per
# token. With BASELINE_BROKER set, the same mints go to that binary too (an
# older build), one broker after the other, and the script prints the ratio.
# See tests/bench/README.md ("Token memory").
#
# Environment (all optional):
#   BROKER           broker binary under test      (default: build/bin/sandbox-broker)
#   BASELINE_BROKER  a binary to compare against   (default: none)
#   BENCH_TOKENS     tokens to mint                (default: 100000)
#   BENCH_SHARED     distinct shared manifests     (default: 20)
#   BENCH_OWN_PCT    percent of the tokens whose manifest is their run's own (default: 10)
#   BENCH_CALL=1     also make one granted call with every token, so every run has its quota counters
#   BENCH_TARGET_MIB the goal for the resident memory after minting (default: 64)
#   BENCH_KEEP=1     keep the work directory (broker logs)
# Exit status: 0 when every mint succeeded, the store holds every token and
# sampled tokens answer as their manifest says (the target line is
# informational); 1 otherwise.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKER=${BROKER:-$ROOT/build/bin/sandbox-broker}
BASELINE_BROKER=${BASELINE_BROKER:-}
TOKENS=${BENCH_TOKENS:-100000}
SHARED=${BENCH_SHARED:-20}
OWN_PCT=${BENCH_OWN_PCT:-10}
CALL=${BENCH_CALL:-0}
TARGET_MIB=${BENCH_TARGET_MIB:-64}
SECRET="bench-admin-secret-$$-0123456789abcdef"

say() { printf '%s\n' "$*" >&2; }
die() { say "tokens.sh: $*"; exit 1; }

for tool in python3 curl; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
[ -x "$BROKER" ] || die "no broker binary at $BROKER (build it: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j2)"
[ -z "$BASELINE_BROKER" ] || [ -x "$BASELINE_BROKER" ] || die "no baseline binary at $BASELINE_BROKER"

WORK=$(mktemp -d /tmp/sb-bench-tokens.XXXXXX)
PID=
cleanup() {
    if [ -n "$PID" ]; then
        kill -TERM "$PID" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$PID" 2>/dev/null
        wait "$PID" 2>/dev/null
    fi
    if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# the client: mints over one kept-alive connection, then checks a sample of the tokens
cat >"$WORK/mint.py" <<'EOF'
import http.client, json, os, random, sys

admin, public, secret = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
tokens, shared, own_pct, call = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "1"
rnd = random.Random(12345)  # the same manifests and run ids for every binary

def manifest(k, own=None):
    """a typical manifest: a few collections, a files glob, a net entry, a service; `own` makes it a run's own"""
    m = {
        "data": {"collections": {"posts": ["read", "create", "update"], "comments": ["read", "create"],
                                 "users%d" % (k % 5): ["read"]}},
        "files": {"read": ["uploads/app%d/**" % k]},
        "net": ["api%d.example.com:443" % k],
        "services": ["svc"],
        "timeoutMs": 60000 + 1000 * (k % 7),
    }
    if own is not None:
        m["files"]["write"] = ["runs/%s/**" % own]
    return m

conn = http.client.HTTPConnection("127.0.0.1", admin)
auth = {"Authorization": "Bearer " + secret, "Content-Type": "application/json"}
minted = []
for i in range(tokens):
    run = "run-%08d-%016x" % (i, rnd.getrandbits(64))
    own = rnd.randrange(100) < own_pct
    body = {"runId": run, "ttlMs": 3600000, "scope": {"tenantId": "tenant-%04d" % (i % 500)},
            "capabilities": manifest(i % shared, run if own else None)}
    conn.request("POST", "/admin/v1/tokens", json.dumps(body), auth)
    r = conn.getresponse()
    data = r.read()
    if r.status != 201:
        sys.exit("mint %d answered %d: %s" % (i, r.status, data[:200]))
    minted.append(json.loads(data)["token"])

# every token answers as its manifest says: a sample before the RSS is read, all of them with BENCH_CALL=1
pub = http.client.HTTPConnection("127.0.0.1", public)
def rpc(tok, method):
    pub.request("POST", "/api/sandbox/rpc", json.dumps({"method": method, "args": {}}),
                {"x-questpie-sandbox-token": tok, "Content-Type": "application/json"})
    r = pub.getresponse()
    r.read()
    return r.status
check = minted if call else rnd.sample(minted, min(200, len(minted)))
for tok in check:
    if rpc(tok, "services.svc.fn") != 501:
        sys.exit("a granted call did not reach the dispatcher")
for tok in rnd.sample(minted, min(20, len(minted))):
    if rpc(tok, "services.other.fn") != 403:
        sys.exit("a call outside the manifest was not refused")
print(len(minted))
EOF

# measure BINARY LABEL: appends "LABEL before_kib after_kib" to $WORK/results
measure() {
    local bin=$1 label=$2 log=$WORK/$2.log port admin before after n live
    SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
        SANDBOX_BROKER_THREADS=1 SANDBOX_BROKER_TOKEN_STORE=memory SANDBOX_BROKER_LOG_CALLS=false \
        SANDBOX_BROKER_MAX_TOKENS=$TOKENS "$bin" 2>"$log" >/dev/null &
    PID=$!
    for _ in $(seq 100); do grep -q '"event":"started"' "$log" 2>/dev/null && break; sleep 0.05; done
    port=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    admin=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    if [ -z "$port" ] || [ -z "$admin" ]; then die "$label did not start: $(tail -5 "$log")"; fi
    sleep 0.3
    before=$(rss_kib "$PID")
    n=$(python3 "$WORK/mint.py" "$admin" "$port" "$SECRET" "$TOKENS" "$SHARED" "$OWN_PCT" "$CALL") || die "$label: minting failed"
    [ "$n" = "$TOKENS" ] || die "$label: $n of $TOKENS tokens minted"
    sleep 0.3
    after=$(rss_kib "$PID")
    live=$(curl -s -H "Authorization: Bearer $SECRET" "http://127.0.0.1:$admin/metrics" | awk '/^sb_tokens_live / {print $2}')
    [ "$live" = "$TOKENS" ] || die "$label: the store holds ${live:-?} tokens, not $TOKENS"
    kill -TERM "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=
    echo "$label $before $after" >>"$WORK/results"
}

say "minting $TOKENS tokens ($SHARED shared manifests, ${OWN_PCT}% of the runs with their own; one call each: $CALL)"
[ -n "$BASELINE_BROKER" ] && measure "$BASELINE_BROKER" baseline
measure "$BROKER" broker
mapfile -t RESULTS <"$WORK/results"

printf '%-10s %12s %12s %12s %12s\n' binary "rss before" "rss after" "growth" "per token"
for row in "${RESULTS[@]}"; do
    read -r label before after <<<"$row"
    awk -v l="$label" -v b="$before" -v a="$after" -v n="$TOKENS" 'BEGIN {
        printf "%-10s %8.1f MiB %8.1f MiB %8.1f MiB %8.0f B\n", l, b / 1024, a / 1024, (a - b) / 1024, (a - b) * 1024 / n }'
done
read -r _ nb na <<<"${RESULTS[${#RESULTS[@]} - 1]}"
if [ -n "$BASELINE_BROKER" ]; then
    read -r _ bb ba <<<"${RESULTS[0]}"
    awk -v bb="$bb" -v ba="$ba" -v nb="$nb" -v na="$na" 'BEGIN {
        printf "ratio (broker / baseline): rss after %.2fx, growth per token %.2fx\n", na / ba, (na - nb) / (ba - bb) }'
fi
awk -v a="$na" -v t="$TARGET_MIB" -v n="$TOKENS" 'BEGIN {
    printf "target: %d tokens in <= %d MiB resident: %.1f MiB, %s\n", n, t, a / 1024, a / 1024 <= t ? "met" : "NOT met" }'

#!/usr/bin/env bash
# The broker's main job, end to end, on embedded defaults:
#   start the broker (memory token store, loopback listeners),
#   mint a token for a run through the admin endpoint,
#   make a granted call and two denied ones,
#   revoke the token and show that the next call is refused.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target sandbox-broker >/dev/null

PUB=${SB_DEMO_PORT:-18080}
ADM=${SB_DEMO_ADMIN_PORT:-18081}
export SANDBOX_BROKER_ADMIN_SECRET="demo-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export SANDBOX_BROKER_LISTEN=127.0.0.1:$PUB SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:$ADM
LOG=$(mktemp)
./build/bin/sandbox-broker 2>"$LOG" &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait $BROKER 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$ADM/healthz" >/dev/null && break; sleep 0.1; done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
rpc() {
    printf '$ rpc %s\n' "$1"
    curl -s -w '  -> HTTP %{http_code}\n' -X POST "http://127.0.0.1:$PUB/api/sandbox/rpc" \
        -H "x-questpie-sandbox-token: $TOKEN" -H 'content-type: application/json' -d "$1"
}

say "mint a token for run demo-1 (services: [\"billing\"], collections.posts: [\"read\"])"
MINT=$(curl -s -X POST "http://127.0.0.1:$ADM/admin/v1/tokens" -H "Authorization: Bearer $SANDBOX_BROKER_ADMIN_SECRET" \
    -d '{"runId":"demo-1","capabilities":{"services":["billing"],"data":{"collections":{"posts":["read"]}},"timeoutMs":5000}}')
echo "$MINT"
TOKEN=$(printf '%s' "$MINT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')

say "granted: the manifest allows it; no handler is wired, so the broker answers not_implemented"
rpc '{"method":"services.billing.charge","args":{"amount":5}}'
rpc '{"method":"collections.posts.find","args":{"limit":5}}'
say "denied: not in the manifest"
rpc '{"method":"services.payroll.run","args":{}}'
rpc '{"method":"collections.posts.delete","args":{"where":{"id":{"equals":1}}}}'
rpc '{"method":"email.send","args":{}}'
say "revoke the run (the host does this the moment the run settles)"
curl -s -w 'HTTP %{http_code}\n' -X DELETE "http://127.0.0.1:$ADM/admin/v1/runs/demo-1" \
    -H "Authorization: Bearer $SANDBOX_BROKER_ADMIN_SECRET"
say "the same granted call is now refused"
rpc '{"method":"services.billing.charge","args":{"amount":5}}'
say "metrics (excerpt)"
curl -s "http://127.0.0.1:$ADM/metrics" | grep -E '^sb_(calls_total|denials_total\{reason="(token|axis_services))' || true
say "broker log (tokens appear only as a hash prefix)"
kill -TERM $BROKER; wait $BROKER || true
trap - EXIT
cat "$LOG"; rm -f "$LOG"

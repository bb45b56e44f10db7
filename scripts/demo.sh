#!/usr/bin/env bash
# The broker's main job, end to end, on embedded defaults:
#   start the broker (memory token store, loopback listeners),
#   mint a token for a run through the admin endpoint,
#   make a granted call and two denied ones,
#   revoke the token and show that the next call is refused;
# then the supervisor as a service: `sandbox-shim serve` takes a run the way
# the upstream adapter posts it, and its Deno guest reaches the broker.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target sandbox-broker sandbox-shim >/dev/null

# Deno for the guests (the tests use the same one)
export SB_NODE_PREFIX=${SB_NODE_PREFIX:-$PWD/.cache/node}
DENO=${DENO_BIN:-$SB_NODE_PREFIX/node_modules/.bin/deno}
if [ ! -x "$DENO" ]; then
    mkdir -p "$SB_NODE_PREFIX"
    npm install --prefix "$SB_NODE_PREFIX" --no-audit --no-fund --loglevel=error deno@2.9.6 >/dev/null
fi

PUB=${SB_DEMO_PORT:-18080}
ADM=${SB_DEMO_ADMIN_PORT:-18081}
PGPORT=${SB_DEMO_PG_PORT:-15432}
SERVE_PORT=${SB_DEMO_SERVE_PORT:-18787}
export SANDBOX_BROKER_ADMIN_SECRET="demo-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export SANDBOX_BROKER_LISTEN=127.0.0.1:$PUB SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:$ADM
DEMO=$(mktemp -d /tmp/sb-demo.XXXXXX)
chmod 755 "$DEMO"
LOG=$DEMO/broker.log
BROKER=
SERVE=
cleanup() {
    [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null && wait "$SERVE" 2>/dev/null
    [ -n "$BROKER" ] && kill "$BROKER" 2>/dev/null && wait "$BROKER" 2>/dev/null
    [ -d "$DEMO/pg/data" ] && run_pg pg_ctl -D "$DEMO/pg/data" -m fast -w -s stop >/dev/null 2>&1
    rm -rf "$DEMO"
}
trap cleanup EXIT

# A throwaway PostgreSQL for the demo target: a posts collection and the document store.
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
run_pg() { local cmd=$1; shift; if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$PGBIN/$cmd" "$@"; else "$PGBIN/$cmd" "$@"; fi; }
mkdir -p "$DEMO/pg"
[ "$(id -u)" = 0 ] && chown postgres: "$DEMO/pg"
run_pg initdb -D "$DEMO/pg/data" -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8 >/dev/null
run_pg pg_ctl -D "$DEMO/pg/data" -l "$DEMO/pg/log" -w -s \
    -o "-p $PGPORT -k $DEMO/pg -c listen_addresses=127.0.0.1 -c fsync=off" start
DB="postgresql://postgres@127.0.0.1:$PGPORT/postgres"
psql "$DB" -qAt -c 'CREATE TABLE posts (id bigserial PRIMARY KEY, tenant_id text NOT NULL, title text, views int)' \
    -f deploy/sql/document_store.sql
cat > "$DEMO/broker.json" <<JSON
{"database_url": "$DB",
 "targets": {"app": {
   "collections": {"posts": {"table": "posts", "key": "id", "max_limit": 100, "scope": {"tenant_id": "tenantId"}}},
   "document_store": {"table": "document_store", "scope": {"tenant_id": "tenantId"}},
   "globals": {"site": {"value": {"name": "Demo"}}}}}}
JSON

./build/bin/sandbox-broker --config "$DEMO/broker.json" 2>"$LOG" &
BROKER=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$ADM/readyz" >/dev/null && break; sleep 0.1; done

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
rpc() {
    printf '$ rpc %s\n' "$1"
    curl -s -w '  -> HTTP %{http_code}\n' -X POST "http://127.0.0.1:$PUB/api/sandbox/rpc" \
        -H "x-questpie-sandbox-token: $TOKEN" -H 'content-type: application/json' -d "$1"
}

mint() {
    curl -s -X POST "http://127.0.0.1:$ADM/admin/v1/tokens" -H "Authorization: Bearer $SANDBOX_BROKER_ADMIN_SECRET" -d "$1"
}
token_of() { python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])'; }

say "tenant t2 writes a post (a run of its own, target app, scope tenantId=t2)"
T2=$(mint '{"runId":"demo-0","target":"app","scope":{"tenantId":"t2"},"capabilities":{"data":{"collections":{"posts":["create"]}}}}' | token_of)
TOKEN=$T2 rpc '{"method":"collections.posts.create","args":{"data":{"title":"t2 only","views":1}}}'

say "mint a token for run demo-1 (tenant t1; posts: read+create; store notes: write; services: billing)"
MINT=$(mint '{"runId":"demo-1","target":"app","scope":{"tenantId":"t1"},"capabilities":{"services":["billing"],"data":{"collections":{"posts":["read","create"]},"stores":{"notes":["write"]},"globals":{"site":["read"]}},"timeoutMs":5000}}')
echo "$MINT"
TOKEN=$(printf '%s' "$MINT" | token_of)

say "granted: the target wires them"
rpc '{"method":"collections.posts.create","args":{"data":{"title":"hello from t1","views":3}}}'
rpc '{"method":"collections.posts.find","args":{"where":{"views":{"gte":1}},"limit":5}}'
rpc '{"method":"store.notes.create","args":{"data":{"key":"k1","data":{"hello":"world"}}}}'
rpc '{"method":"globals.site.get"}'
say "granted, but services are never dispatched: not_implemented"
rpc '{"method":"services.billing.charge","args":{"amount":5}}'
say "clamped: t1 cannot write into t2's scope"
rpc '{"method":"collections.posts.create","args":{"data":{"title":"sneaky","tenant_id":"t2"}}}'
say "denied: not in the manifest"
rpc '{"method":"services.payroll.run","args":{}}'
rpc '{"method":"collections.posts.delete","args":{"where":{"id":{"equals":1}}}}'
rpc '{"method":"email.send","args":{}}'
say "revoke the run (the host does this the moment the run settles)"
curl -s -w 'HTTP %{http_code}\n' -X DELETE "http://127.0.0.1:$ADM/admin/v1/runs/demo-1" \
    -H "Authorization: Bearer $SANDBOX_BROKER_ADMIN_SECRET"
say "the same granted call is now refused"
rpc '{"method":"services.billing.charge","args":{"amount":5}}'
say "the supervisor as a service: sandbox-shim serve on 127.0.0.1:$SERVE_PORT"
ADMISSION="demo-admission-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
SANDBOX_HOST_ADMISSION_SECRET=$ADMISSION SANDBOX_BROKER_URL="http://127.0.0.1:$PUB/api/sandbox/rpc" \
    DENO_BIN=$DENO PORT=$SERVE_PORT ./build/bin/sandbox-shim serve 2>"$DEMO/serve.log" &
SERVE=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$SERVE_PORT/health" >/dev/null && break; sleep 0.1; done
curl -s "http://127.0.0.1:$SERVE_PORT/health"; echo
run() {
    printf '$ POST /run %s\n' "$2"
    curl -s -w '  -> HTTP %{http_code}\n' -X POST "http://127.0.0.1:$SERVE_PORT/run" \
        -H "x-questpie-sandbox-host-admission: $ADMISSION" -H 'content-type: application/json' -d "$1"
}
say "the host mints a token for run demo-2 (tenant t1, posts: read) and posts the run with it as bindings"
T3=$(mint '{"runId":"demo-2","target":"app","scope":{"tenantId":"t1"},"capabilities":{"data":{"collections":{"posts":["read"]}},"timeoutMs":5000}}' | token_of)
SRC='export default async (input) => { const r = await questpie.collections.posts.find({ limit: input.limit }); console.log(\"found\", r.docs.length); return r.docs.map((d) => d.title); }'
run "{\"mode\":\"host\",\"source\":\"$SRC\",\"input\":{\"limit\":5},\"capabilities\":{\"net\":[],\"import\":[],\"timeoutMs\":5000,\"memoryMb\":128},\"secrets\":{},\"bindings\":{\"url\":\"http://127.0.0.1:$PUB/api/sandbox/rpc\",\"token\":\"$T3\"}}" \
    "(a guest reads posts through the broker: only tenant t1's)"
say "the same guest tries a write it was not granted: the broker denies it, and the run ends"
SRC='export default async () => { try { await questpie.collections.posts.create({ data: { title: \"sneaky\" } }); } catch (e) { /* not catchable */ } return \"carried on\"; }'
run "{\"mode\":\"host\",\"source\":\"$SRC\",\"capabilities\":{\"timeoutMs\":5000},\"bindings\":{\"url\":\"http://127.0.0.1:$PUB/api/sandbox/rpc\",\"token\":\"$T3\"}}" \
    "(an ungranted create)"
say "a bindings URL other than the configured broker is refused before anything runs"
run "{\"mode\":\"host\",\"source\":\"export default () => 1\",\"capabilities\":{},\"bindings\":{\"url\":\"http://127.0.0.1:9/steal\",\"token\":\"$T3\"}}" \
    "(bindings.url elsewhere)"
curl -s -o /dev/null -X DELETE "http://127.0.0.1:$ADM/admin/v1/runs/demo-2" -H "Authorization: Bearer $SANDBOX_BROKER_ADMIN_SECRET"
say "serve's log: one line per run, no source, input, secret or token"
kill -TERM "$SERVE"; wait "$SERVE" || true
SERVE=
grep '"event":"run"' "$DEMO/serve.log" || true

say "metrics (excerpt)"
curl -s "http://127.0.0.1:$ADM/metrics" | grep -E '^sb_(calls_total|denials_total\{reason="(token|axis_services))' || true
say "broker log (tokens appear only as a hash prefix)"
kill -TERM "$BROKER"; wait "$BROKER" || true
BROKER=
cat "$LOG"

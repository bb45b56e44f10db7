#!/usr/bin/env bash
# Instructions per RPC: the broker under callgrind (memory token store by default, one worker), N calls of each
# case sent one after another on one kept-alive connection; the counters are zeroed before a case and
# dumped after it, so each figure is the broker's own instructions for N calls divided by N. The
# *-decide cases make the same calls under a manifest with a decide axis whose rules name other
# families (PROTOCOL.md section 5a): what a call that matches no rule pays; *-decide-family adds a
# rule on another service, so the call's own family is searched and not matched. Unlike
# req/s, it does not move with other load on the machine, so two builds compare within one run.
# Not a pass/fail test (tests/bench/README.md).
#
#   rpc_instr.sh BROKER [BROKER...]   each binary in turn, the same cases
#   BENCH_CALLS      calls per case (default 2000)
#   BENCH_LOG_CALLS  the broker's log_calls (default false: the route alone)
#   BENCH_STORE      the token store (default memory; a redis:// URL counts the broker's side of the
#                    Redis path, redis-server's own instructions not included)
# Needs valgrind, curl and Debian's python3 with python3-msgpack. Loopback only.
set -u -o pipefail

N=${BENCH_CALLS:-2000}
LOG_CALLS=${BENCH_LOG_CALLS:-false}
STORE=${BENCH_STORE:-memory}
SECRET="bench-admin-secret-$$-0123456789abcdef"
[ $# -ge 1 ] || { echo "usage: $0 BROKER [BROKER...]" >&2; exit 2; }
for tool in valgrind callgrind_control curl /usr/bin/python3; do
    command -v "$tool" >/dev/null || { echo "rpc_instr.sh: $tool not found" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/sb-instr.XXXXXX)
VPID=
cleanup() {
    if [ -n "$VPID" ]; then
        kill -TERM "$VPID" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$VPID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$VPID" 2>/dev/null
        wait "$VPID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# client.py PORT TOKEN METHOD N ENC STATUS: sends N calls, prints how many had another status
cat >"$WORK/client.py" <<'EOF'
import http.client, json, sys
import msgpack
port, tok, method, n, enc, want = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
req = {"method": method, "args": {}}
body, ctype = (msgpack.packb(req), "application/msgpack") if enc == "msgpack" else (json.dumps(req).encode(), "application/json")
c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
bad = 0
for _ in range(n):
    c.request("POST", "/api/sandbox/rpc", body, {"Content-Type": ctype, "x-questpie-sandbox-token": tok})
    r = c.getresponse()
    r.read()
    bad += r.status != want
print(bad)
EOF

# Ratios, measured in this run: a *-decide case against the same call without the decide axis, and
# every case against the first BROKER's same case (the baseline when two builds are compared).
declare -A FIRST=() OWN=()
printf '%-40s %-26s %8s %10s %10s\n' "broker" "case" "Ir/call" "x-undecided" "x-first"
for broker in "$@"; do
    OWN=()
    log=$WORK/broker.log
    : >"$log"
    rm -f "$WORK"/callgrind.out.*
    SANDBOX_BROKER_ADMIN_SECRET=$SECRET SANDBOX_BROKER_LISTEN=127.0.0.1:0 SANDBOX_BROKER_ADMIN_LISTEN=127.0.0.1:0 \
        SANDBOX_BROKER_THREADS=1 SANDBOX_BROKER_TOKEN_STORE=$STORE SANDBOX_BROKER_LOG_CALLS=$LOG_CALLS \
        valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out.%p" "$broker" 2>>"$log" >/dev/null &
    VPID=$!
    for _ in $(seq 600); do grep -q '"event":"started"' "$log" && break; sleep 0.1; done
    port=$(sed -n 's/.*"listener":"public".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    admin=$(sed -n 's/.*"listener":"admin".*"port":\([0-9]*\).*/\1/p' "$log" | head -1)
    [ -n "$port" ] && [ -n "$admin" ] || { echo "rpc_instr.sh: $broker did not start: $(tail -3 "$log")" >&2; exit 1; }
    # the Redis store connects asynchronously: wait until it is ready
    for _ in $(seq 300); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ] && break
        sleep 0.1
    done
    tok=$(curl -s -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
        -d '{"runId":"instr","ttlMs":3600000,"quotas":{"calls":1000000,"concurrent":1024},"capabilities":{"services":["svc"]}}' \
        "http://127.0.0.1:$admin/admin/v1/tokens" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p')
    [ -n "$tok" ] || { echo "rpc_instr.sh: no token from $broker" >&2; exit 1; }
    # decide rules on other families only, and rules that include the called family (another service)
    mint_caps() {
        curl -s -X POST -H "Authorization: Bearer $SECRET" -H 'Content-Type: application/json' \
            -d "{\"runId\":\"$1\",\"ttlMs\":3600000,\"quotas\":{\"calls\":1000000,\"concurrent\":1024},\"capabilities\":$2}" \
            "http://127.0.0.1:$admin/admin/v1/tokens" | sed -n 's/.*"token":"\([0-9a-f]\{64\}\)".*/\1/p'
    }
    rules='"collections.posts.delete","store.*.create","tools.call"'
    fetch='"fetch":["pay.example",{"host":"*.stripe.example","methods":["POST"],"paths":["/v1/**"]}]'
    dtok=$(mint_caps instd "{\"services\":[\"svc\"],\"decide\":{\"methods\":[$rules],$fetch}}")
    ftok=$(mint_caps instf "{\"services\":[\"svc\"],\"decide\":{\"methods\":[$rules,\"services.other.*\"],$fetch}}")
    [ -n "$dtok" ] && [ -n "$ftok" ] || { echo "rpc_instr.sh: no decide token from $broker (a build without the decide axis?)" >&2; exit 1; }
    /usr/bin/python3 "$WORK/client.py" "$port" "$tok" services.svc.fn 50 json 501 >/dev/null # warm-up
    for c in "granted-json json services.svc.fn 501 $tok" "denied-json json services.other.fn 403 $tok" \
        "granted-msgpack msgpack services.svc.fn 501 $tok" "denied-msgpack msgpack services.other.fn 403 $tok" \
        "granted-json-decide json services.svc.fn 501 $dtok" "granted-msgpack-decide msgpack services.svc.fn 501 $dtok" \
        "granted-json-decide-family json services.svc.fn 501 $ftok"; do
        set -- $c
        callgrind_control -z "$VPID" >/dev/null 2>&1
        bad=$(/usr/bin/python3 "$WORK/client.py" "$port" "$5" "$3" "$N" "$2" "$4")
        [ "$bad" = 0 ] || { echo "rpc_instr.sh: $1: $bad calls had another status than $4" >&2; exit 1; }
        callgrind_control -d "$1" "$VPID" >/dev/null 2>&1
        f=
        for _ in $(seq 100); do
            f=$(grep -l "^desc: Trigger: dump $1\$" "$WORK"/callgrind.out.* 2>/dev/null | head -1)
            [ -n "$f" ] && break
            sleep 0.1
        done
        ir=$(grep -E '^(summary|totals):' "$f" | head -1 | awk '{print $2}')
        OWN[$1]=$((ir / N))
        [ -n "${FIRST[$1]:-}" ] || FIRST[$1]=${OWN[$1]}
        twin=${1%%-decide*}
        awk -v b="$broker" -v c="$1" -v v="${OWN[$1]}" -v t="$([ "$twin" != "$1" ] && echo "${OWN[$twin]}")" -v f="${FIRST[$1]}" \
            'BEGIN { printf "%-40s %-26s %8d %10s %10s\n", b, c, v, (t > 0 ? sprintf("%.3fx", v / t) : "-"), (f > 0 ? sprintf("%.3fx", v / f) : "-") }'
    done
    kill -TERM "$VPID"
    wait "$VPID" 2>/dev/null
    VPID=
done

# Sourced by fetch.sh and fetch_secret.sh: the helpers, the work directory
# and its cleanup trap, the watchdog, the build of the bench programs, the
# upstream and dnsmasq. The caller sets ROOT, BROKER, BUILD_DIR, LIMIT and
# BENCH_NAME (for messages) first.
say() { printf '%s\n' "$*" >&2; }
die() { say "$BENCH_NAME: $*"; exit 1; }

DNSMASQ=$(command -v dnsmasq || { [ -x /usr/sbin/dnsmasq ] && echo /usr/sbin/dnsmasq; })
[ -n "$DNSMASQ" ] || die "dnsmasq not found (apt-get install -y dnsmasq)"
for tool in curl gcc ss timeout; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y curl gcc iproute2 coreutils)"
done
[ -x "$BROKER" ] || die "no broker binary at $BROKER (build it: cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j2)"

WORK=$(mktemp -d /tmp/sb-fetch-bench.XXXXXX)
PIDS=()
WATCHDOG=
cleanup() {
    local p i
    [ -n "$WATCHDOG" ] && kill -TERM "$WATCHDOG" 2>/dev/null
    # the last started first: the client, then the broker, dnsmasq, the upstream
    for ((i = ${#PIDS[@]} - 1; i >= 0; --i)); do
        kill -TERM "${PIDS[$i]}" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do
        # the broker drains and exits; never leave anything behind
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then say "work directory kept: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# the bound: the watchdog signals this shell, whose trap then cleans up (long steps run in the
# background and are waited for, so the signal is handled at once)
(
    trap 'kill -TERM "$sp" 2>/dev/null; exit 0' TERM
    sleep "$LIMIT" &
    sp=$!
    wait "$sp" && say "$BENCH_NAME: over ${LIMIT}s, stopping" && kill -TERM $$ 2>/dev/null
) &
WATCHDOG=$!

# --- the helpers (rebuilt when missing or older than their source) ---
mkdir -p "$BUILD_DIR" || die "cannot create $BUILD_DIR"
for h in fetch_upstream fetch_client; do
    if [ ! -x "$BUILD_DIR/$h" ] || [ "$ROOT/tests/bench/$h.c" -nt "$BUILD_DIR/$h" ]; then
        gcc -std=c11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Werror -o "$BUILD_DIR/$h" "$ROOT/tests/bench/$h.c" ||
            die "building $h failed"
    fi
done

# wait_log FILE PATTERN: waits up to 5 s for a line matching PATTERN
wait_log() {
    for _ in $(seq 100); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

# --- the upstream ---
"$BUILD_DIR/fetch_upstream" >"$WORK/upstream.log" 2>&1 &
PIDS+=($!)
wait_log "$WORK/upstream.log" '^listening port' || die "upstream did not start: $(cat "$WORK/upstream.log")"
UP_PORT=$(awk '/^listening port/ {print $3; exit}' "$WORK/upstream.log")

# --- dnsmasq: bench.test -> 127.0.0.1 on a free UDP port (retried if the port was taken meanwhile) ---
DNS_PORT=
for _ in 1 2 3 4 5; do
    p=$((20000 + RANDOM % 10000))
    [ -z "$(ss -Huan "sport = :$p" 2>/dev/null)" ] || continue
    "$DNSMASQ" --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --listen-address=127.0.0.1 \
        --bind-interfaces --port="$p" --local=/test/ --local-ttl=60 --user=root --pid-file="$WORK/dnsmasq.pid" \
        --host-record=bench.test,127.0.0.1 >"$WORK/dnsmasq.log" 2>&1 &
    dpid=$!
    sleep 0.2
    if kill -0 "$dpid" 2>/dev/null; then
        PIDS+=("$dpid")
        DNS_PORT=$p
        break
    fi
    wait "$dpid" 2>/dev/null
done
[ -n "$DNS_PORT" ] || die "dnsmasq did not start: $(cat "$WORK/dnsmasq.log")"

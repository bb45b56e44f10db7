#!/usr/bin/env bash
# Installs what building (and, with --test, testing) sandbox-broker needs on
# Debian 12, from Debian's own packages. Idempotent; uses sudo when not root.
set -euo pipefail

build_pkgs=(build-essential cmake pkg-config libh2o-evloop-dev libh2o-dev-common libmsgpack-dev libc-ares-dev
            libssl-dev libpq-dev libhiredis-dev libjansson-dev libidn2-dev libseccomp-dev curl python3 postgresql)
# systemd: systemd-analyze (verify the units, expand their syscall groups; nothing is started);
# python3-seccomp: tests/integration/unitjail.py; logrotate: the shipped logrotate file is run;
# nodejs: the serve adapter test's client (tests/shim/serve_adapter_client.mjs)
test_pkgs=(redis-server redis-sentinel python3-msgpack clang libclang-rt-14-dev clang-format-14 dnsmasq openssl nginx
           systemd python3-seccomp logrotate nodejs)

pkgs=("${build_pkgs[@]}")
if [ "${1:-}" = "--test" ]; then
    pkgs+=("${test_pkgs[@]}")
fi

SUDO=
if [ "$(id -u)" != 0 ]; then
    SUDO=sudo
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
    echo "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

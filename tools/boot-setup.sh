#!/usr/bin/env bash
# What `make boot-test` boots with: QEMU and the Debian distribution kernel.
#
# - qemu-system-x86_64: installed with `apt-get install qemu-system-x86` when missing.
# - The kernel: the linux-image-amd64 package is a metapackage whose Depends names the
#   versioned package that holds the kernel; both .debs are fetched with `apt-get download`
#   (no install scripts run, nothing is installed) and only boot/vmlinuz-* is extracted from
#   the second (`dpkg-deb --fsys-tarfile`, the archive `dpkg-deb -x` would unpack whole), to
#   DIR/vmlinuz, with its package name in DIR/vmlinuz.txt. A kernel already there is reused.
#
# Usage: tools/boot-setup.sh DIR. Exit status 0 when both are ready; otherwise one line
# `SKIP: boot-test: REASON` on stdout and exit status 3 (the logs of apt are kept in DIR).
set -euo pipefail
dir=${1:?usage: tools/boot-setup.sh DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
log="$dir/apt.log"
: > "$log"

skip() {
    echo "SKIP: boot-test: $*"
    exit 3
}

have() { command -v "$1" >/dev/null 2>&1; }

# apt-get with its output in the log; one `apt-get update` and a retry when the package lists
# are missing or stale (a fresh container has none).
apt() {
    apt-get "$@" >>"$log" 2>&1 && return 0
    apt-get update >>"$log" 2>&1 || return 1
    apt-get "$@" >>"$log" 2>&1
}

have apt-get && have dpkg-deb || skip "needs apt-get and dpkg-deb (a Debian-based system) to get QEMU and the kernel"

if ! have qemu-system-x86_64; then
    [ "$(id -u)" = 0 ] || skip "qemu-system-x86_64 is missing, and installing it (apt-get install qemu-system-x86) needs root"
    echo "boot-setup: installing qemu-system-x86 (log: $log)"
    DEBIAN_FRONTEND=noninteractive apt install -y --no-install-recommends qemu-system-x86 \
        || skip "apt-get install qemu-system-x86 failed (see $log)"
    have qemu-system-x86_64 || skip "qemu-system-x86 is installed but qemu-system-x86_64 is not on PATH"
fi

if [ ! -s "$dir/vmlinuz" ]; then
    work="$dir/deb"
    rm -rf "$work"
    mkdir -p "$work"
    cd "$work"
    echo "boot-setup: downloading the linux-image-amd64 kernel (log: $log)"
    # apt-get download writes into the current directory.
    apt download linux-image-amd64 || skip "apt-get download linux-image-amd64 failed (see $log)"
    meta=$(ls linux-image-amd64_*.deb)
    pkg=$(dpkg-deb -f "$meta" Depends | tr ',|' '\n\n' | sed 's/(.*//; s/ //g' | grep -m1 '^linux-image-[0-9]' || true)
    [ -n "$pkg" ] || skip "$meta: no linux-image-<version> package in its Depends"
    apt download "$pkg" || skip "apt-get download $pkg failed (see $log)"
    deb=$(ls "$pkg"_*.deb)
    dpkg-deb --fsys-tarfile "$deb" | tar -x --wildcards './boot/vmlinuz-*' \
        || skip "$deb: no boot/vmlinuz-* in it"
    mv boot/vmlinuz-* "$dir/vmlinuz"
    echo "$pkg ($(dpkg-deb -f "$deb" Version))" > "$dir/vmlinuz.txt"
    cd "$dir"
    rm -rf "$work"
fi
echo "boot-setup: $(qemu-system-x86_64 --version | head -1); kernel $(cat "$dir/vmlinuz.txt" 2>/dev/null || echo "$dir/vmlinuz")"

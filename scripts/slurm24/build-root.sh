#!/usr/bin/env bash
# Recipe of the Debian 13 (trixie) root that `make test-slurm24` runs in. The stage hashes this
# file: any change here builds a new root under the cache directory.
#
#   build-root.sh TARGET    (root; run inside a private mount namespace: debootstrap mounts
#                           /proc and /sys in TARGET while it works)
set -euo pipefail
target=$1
suite=trixie
mirror=${RS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Slurm 24.11 and munge; the shared libraries the host's Python 3.11 (bind-mounted at the same
# path) loads for ssl, ctypes, sqlite3, readline, expat (pip uses the host's CA bundle).
include=(
    slurm-wlm slurmctld slurmd slurm-client munge
    libssl3t64 libffi8 libsqlite3-0 libexpat1 libreadline8t64 libncursesw6
    libuuid1 liblzma5 libbz2-1.0 zlib1g procps
)
debootstrap --variant=minbase --components=main \
    --include="$(IFS=,; echo "${include[*]}")" "$suite" "$target" "$mirror"
# Nothing in the root starts services on its own; apt caches are not kept.
printf '#!/bin/sh\nexit 101\n' >"$target/usr/sbin/policy-rc.d"
chmod 755 "$target/usr/sbin/policy-rc.d"
# The host's Python is bind-mounted under /root/.pyenv: the sandbox's unprivileged job user must
# be able to pass through /root to run it.
chmod 711 "$target/root"
rm -rf "$target"/var/cache/apt/archives/*.deb "$target"/var/lib/apt/lists/*

#!/usr/bin/env bash
# Recipe of the Debian roots the version stages run in (stage.sh). The stage hashes this file
# and the stage's profile (*.conf): any change builds a new root under the cache directory.
#
#   build-root.sh TARGET SUITE PACKAGE...   (root; run inside a private mount namespace:
#                                           debootstrap mounts /proc and /sys in TARGET)
set -euo pipefail
target=$1 suite=$2
shift 2
mirror=${RS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
debootstrap --variant=minbase --components=main \
    --include="$(IFS=,; echo "$*")" "$suite" "$target" "$mirror"
# Nothing in the root starts services on its own; apt caches are not kept.
printf '#!/bin/sh\nexit 101\n' >"$target/usr/sbin/policy-rc.d"
chmod 755 "$target/usr/sbin/policy-rc.d"
# A host Python may be bind-mounted under /root/.pyenv: the sandbox's unprivileged job user must
# be able to pass through /root to run it.
chmod 711 "$target/root"
rm -rf "$target"/var/cache/apt/archives/*.deb "$target"/var/lib/apt/lists/*

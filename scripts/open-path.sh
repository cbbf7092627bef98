#!/usr/bin/env bash
# Usage: scripts/open-path.sh PATH...
# The tests (and production clusters) run jobs as an ordinary user (the sandbox's `rsjob`); that
# user must traverse to the checkout, its venv, and the interpreter the venv links to (pyenv
# keeps it under root's 0700 home). For every directory at or above each PATH that others
# cannot traverse, grant traverse-only permission (o+x: no listing, no reading) and say so.
# Files and modes otherwise stay as they are. Idempotent; prints nothing when all is open.
set -euo pipefail
for path in "$@"; do
    d=$(realpath -m -- "$path")
    [ -d "$d" ] || d=$(dirname "$d")
    while :; do
        if [ -z "$(find "$d" -maxdepth 0 -perm -o+x)" ]; then
            echo "setup: chmod o+x $d (traverse only: the job user must reach $path)"
            chmod o+x "$d"
        fi
        [ "$d" = / ] && break
        d=$(dirname "$d")
    done
done

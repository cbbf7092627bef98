#!/usr/bin/env bash
# Runs in a stage's Debian root (started by enter.sh): a venv with torch, the stage's
# nvidia-resiliency-ext, the project and its lab (both editable, from /src and /src/lab), kept in
# the root (rebuilt when torch or the stage's constraints change, the project and the lab
# reinstalled when pyproject.toml or lab/pyproject.toml does);
# then pytest.
#
#   inside.sh STAGE PYTHON TORCH [pytest args...]
#   inside.sh STAGE PYTHON TORCH --shell COMMAND    (COMMAND in bash instead of pytest)
#
# TORCH: wheel:SPEC (a wheel the stage copied to /opt/rs-wheels) or pypi:SPEC (from PyPI).
set -euo pipefail
stage=$1 python=$2 torch=$3
shift 3
venv=/opt/rs-venv
here=/src/scripts/slurm-stage
constraints=$here/$stage.constraints
# Built from scratch when torch or the stage's constraints change (or no venv yet); when only
# pyproject.toml changed, the project is reinstalled into it (pip adds what is new: seconds,
# not the torch download).
base=$(echo "$torch" | cat - "$constraints" | sha256sum | cut -c1-16)
want=$(echo "$torch" | cat - /src/pyproject.toml /src/lab/pyproject.toml "$constraints" \
    | sha256sum | cut -c1-16)
pip=("$venv/bin/pip" install -q --disable-pip-version-check --cert /etc/rs-pip-ca.crt)
if [ -x "$venv/bin/pip" ] && [ ! -f "$venv/.rs-base" ] && [ -f "$venv/.rs-stamp" ]; then
    # a venv from before the two stamps: taken as built with this torch (remove
    # ROOT/opt/rs-venv to force a rebuild)
    echo "$base" >"$venv/.rs-base"
fi
if [ "$(cat "$venv/.rs-base" 2>/dev/null)" != "$base" ] || [ ! -x "$venv/bin/pip" ]; then
    echo "$stage: building the venv (torch: $torch; $(grep -v '^#' "$constraints" | tr '\n' ' ')and the project)"
    t0=$(date +%s)
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "${pip[@]}" --upgrade pip setuptools wheel
    case $torch in
        wheel:*) "${pip[@]}" --find-links /opt/rs-wheels -c "$constraints" "${torch#wheel:}";;
        pypi:*) "${pip[@]}" -c "$constraints" "${torch#pypi:}";;
        *) echo "$stage: TORCH=$torch: wheel:SPEC or pypi:SPEC" >&2; exit 2;;
    esac
    "${pip[@]}" -c "$constraints" -e "/src[train,test]" -e /src/lab
    echo "$base" >"$venv/.rs-base"
    echo "$want" >"$venv/.rs-stamp"
    echo "$stage: venv built in $(( $(date +%s) - t0 )) s"
elif [ "$(cat "$venv/.rs-stamp" 2>/dev/null)" != "$want" ]; then
    t0=$(date +%s)
    "${pip[@]}" -c "$constraints" -e "/src[train,test]" -e /src/lab
    echo "$want" >"$venv/.rs-stamp"
    echo "$stage: pyproject.toml changed: the project and the lab reinstalled in $(( $(date +%s) - t0 )) s"
fi
pyinfo=$("$venv/bin/python" - <<'PY'
import sys
from importlib.metadata import version
print(f"Python {sys.version.split()[0]}, torch {version('torch')}, "
      f"nvidia-resiliency-ext {version('nvidia-resiliency-ext')}")
PY
)
munge=$(/usr/sbin/munged -V 2>&1 | awk '{print $1; exit}')
echo "$stage: $(/usr/sbin/slurmctld -V), $munge, glibc $(getconf GNU_LIBC_VERSION | awk '{print $2}'), $pyinfo"
cd /src
export PATH=$venv/bin:$PATH RESILIENT_REQUIRE_SLURM=1
if [ "${1:-}" = --shell ]; then
    exec /bin/bash -c "$2"
fi
exec "$venv/bin/pytest" -q -p no:cacheprovider --durations=15 "$@"

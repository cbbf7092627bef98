#!/usr/bin/env bash
# Runs in the Debian 13 root (started by enter.sh): a venv from the host's Python 3.11 with
# torch 2.13.0, nvidia-resiliency-ext 0.6.x and the project (editable, from /src), kept in the
# root and rebuilt when pyproject.toml or constraints.txt change; then pytest.
#
#   inside.sh PYTHON [pytest args...]
#   inside.sh PYTHON --shell COMMAND    (COMMAND in bash instead of pytest, for debugging)
set -euo pipefail
python=$1
shift
venv=/opt/rs-venv
here=/src/scripts/slurm24
want=$(cat /src/pyproject.toml "$here/constraints.txt" | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.rs-stamp" 2>/dev/null)" != "$want" ]; then
    echo "slurm24: building the venv (torch 2.13.0 from the local wheel, NVRx 0.6, the project)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    pip=("$venv/bin/pip" install -q --disable-pip-version-check --cert /etc/rs-pip-ca.crt)
    "${pip[@]}" --upgrade pip setuptools wheel
    "${pip[@]}" --find-links /opt/rs-wheels -c "$here/constraints.txt" torch==2.13.0
    "${pip[@]}" -c "$here/constraints.txt" -e "/src[train,test]"
    echo "$want" >"$venv/.rs-stamp"
fi
pyinfo=$("$venv/bin/python" - <<'PY'
import sys
from importlib.metadata import version
print(f"Python {sys.version.split()[0]}, torch {version('torch')}, "
      f"nvidia-resiliency-ext {version('nvidia-resiliency-ext')}")
PY
)
munge=$(/usr/sbin/munged -V 2>&1 | awk '{print $1; exit}')
echo "slurm24: $(/usr/sbin/slurmctld -V), $munge, glibc $(getconf GNU_LIBC_VERSION | awk '{print $2}'), $pyinfo"
cd /src
export PATH=$venv/bin:$PATH RESILIENT_REQUIRE_SLURM=1
if [ "${1:-}" = --shell ]; then
    exec /bin/bash -c "$2"
fi
exec "$venv/bin/pytest" -q -p no:cacheprovider --durations=10 "$@"

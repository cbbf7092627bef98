#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian 12/13 machine (root): Slurm + munge from Debian,
# a venv in .venv with CPU torch first, then the project with its extras.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}

# The job user (tests run jobs as `rsjob`, as production clusters run them as their users) must
# reach the checkout and the interpreter the venv links to: traverse-only (o+x) on each
# directory above them that others cannot enter, with a note per directory changed. As root
# only (as another user there is nothing of root's to open). `--job-user-path`: this step alone.
job_user_path() {
    [ "$(id -u)" = 0 ] || return 0
    scripts/open-path.sh "$(pwd)" \
        "$(.venv/bin/python -c 'import os, sys; print(os.path.realpath(sys.executable))')"
}
if [ "${1:-}" = --job-user-path ]; then
    job_user_path
    exit 0
fi
need_apt=0
for prog in slurmctld slurmd munged scontrol srun sbatch; do
    command -v "$prog" >/dev/null 2>&1 || [ -x "/usr/sbin/$prog" ] || need_apt=1
done
if [ "$need_apt" = 1 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: Slurm is missing and installing it needs root:" >&2
        echo "  apt-get install -y --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge" >&2
        exit 1
    fi
    echo "setup: installing Slurm and munge from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm slurmctld slurmd slurm-client munge >/dev/null
fi

# Prometheus and node_exporter: the rules' promtool tests, the dashboard's queries and
# `sandbox up --metrics` run the real ones (Debian's packages).
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus-node-exporter >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: Prometheus is missing and installing it needs root:" >&2
        echo "  apt-get install -y --no-install-recommends prometheus prometheus-node-exporter" >&2
        exit 1
    fi
    echo "setup: installing prometheus and prometheus-node-exporter from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus prometheus-node-exporter >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.resilient-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing Python packages (torch CPU build first)"
    .venv/bin/pip install -q --upgrade pip setuptools wheel
    # torch before anything that depends on it: 2.13.0 is the local CPU wheel.
    .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q torch==2.13.0
    .venv/bin/pip install -q -e ".[train,test,plot]" --config-settings editable_mode=strict
    touch "$stamp"
fi

# The frameworks whose users' scripts the tests run through resilient-launch
# (tests/launcher/foreign/: PyTorch Lightning, Hugging Face Trainer/Accelerate), CPU, against
# the torch installed above: the constraint keeps pip from replacing it (about 200 MB, ~1 min).
fw_stamp=.venv/.resilient-frameworks
if [ ! -f "$fw_stamp" ] || [ "$0" -nt "$fw_stamp" ]; then
    echo "setup: installing pytorch-lightning, transformers, accelerate (CPU, torch kept)"
    torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__.split('+')[0])")
    .venv/bin/pip install -q -c <(echo "torch==$torch_version") \
        "pytorch-lightning>=2.4" "transformers>=4.45" "accelerate>=1.0"
    touch "$fw_stamp"
fi

# The project itself, editable in strict mode: setuptools builds a link tree
# (build/__editable__.*/resilient_slurm/..., one symlink per repository file) instead of an
# import hook, so mypy and IDEs resolve every `resilient_slurm.*` import to its file here.
# A link tree lists files: it is rebuilt whenever the set of package files changes.
# Then the lab (lab/: the distribution resilient-slurm-lab, the sandbox the tests and the demo
# run), editable in strict mode the same way (lab/build/...), right after the product it needs.
install_tree() {  # install_tree NAME DIR PYPROJECT STAMP MODULE FILES...
    local name=$1 dir=$2 pyproject=$3 tree_stamp=$4 module=$5 files log
    shift 5
    files=$(git ls-files "$@" 2>/dev/null | sha1sum | cut -c1-40)
    if [ ! -d "$dir/build" ] || [ "$(cat "$tree_stamp" 2>/dev/null)" != "$files" ] \
            || [ "$pyproject" -nt "$tree_stamp" ] \
            || ! .venv/bin/python -c "import $module" 2>/dev/null; then
        echo "setup: installing $name editable (strict mode: link tree)"
        log=$(mktemp)
        if ! .venv/bin/pip install -q --no-deps --no-build-isolation -e "$dir" \
                --config-settings editable_mode=strict >"$log" 2>&1; then
            cat "$log" >&2; rm -f "$log"; exit 1
        fi
        rm -f "$log"
        echo "$files" >"$tree_stamp"
    fi
}
install_tree "the project" . pyproject.toml .venv/.resilient-linktree resilient_slurm \
    resilient_slurm slurm healthcheck prolog epilog launcher training checkpoint sbatch hooks
install_tree "the lab" lab lab/pyproject.toml .venv/.resilient-lab-linktree \
    resilient_slurm_lab.sandbox.cli lab/resilient_slurm_lab

job_user_path

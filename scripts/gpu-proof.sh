#!/usr/bin/env bash
# One-shot proof on a GPU node: real NVML health checks, an NVML hang, FSDP on NCCL with the
# async checkpointer, ft_launcher restarts with equal digests, save stalls. See docs/gpu-proof.md.
#
#   scripts/gpu-proof.sh OUT_DIR             # on the GPU node (no registry needed)
#   scripts/gpu-proof.sh --dry-run OUT_DIR   # anywhere: every step planned and checked, GPU
#                                            # steps skipped with the reason (CI runs this)
#
# The node needs Python >= 3.10 with torch (CUDA) installed, and the wheels made beforehand by
# scripts/gpu-proof-wheels.sh in $GPU_PROOF_WHEELS (default .gpu-proof/wheels). Nothing is
# installed outside a throw-away venv (--system-site-packages: the node's torch is used).
# Environment: PYTHON (interpreter with torch), GPU_PROOF_SCRATCH (checkpoints, several GB;
# default a new folder under ${TMPDIR:-/tmp}), GPU_PROOF_KEEP_SCRATCH=1 to keep it.
# Exit: 0 every step passed, 1 a step failed, 2 usage or set-up error.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

dry=0
out=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry=1 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu-proof: unknown option $arg" >&2; exit 2 ;;
        *) [ -z "$out" ] || { echo "gpu-proof: one OUT_DIR only" >&2; exit 2; }; out=$arg ;;
    esac
done
[ -n "$out" ] || { echo "usage: scripts/gpu-proof.sh [--dry-run] OUT_DIR" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)  # relative to where it was called from
cd "$repo"
wheels=${GPU_PROOF_WHEELS:-$repo/.gpu-proof/wheels}

pick_python() {
    local c
    for c in ${PYTHON:-} python3.12 python3 python; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' >/dev/null 2>&1; then
            command -v "$c"
            return 0
        fi
    done
    return 1
}

scratch=${GPU_PROOF_SCRATCH:-}
if [ -z "$scratch" ]; then
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu-proof.XXXXXX")
fi
cleanup() {
    if [ "${GPU_PROOF_KEEP_SCRATCH:-0}" != 1 ] && [ -z "${GPU_PROOF_SCRATCH:-}" ]; then
        rm -rf "$scratch"
    fi
}
trap cleanup EXIT

if [ "$dry" = 1 ]; then
    # Plan and check with an interpreter that already has the project (CI: the repo's .venv).
    py=${PYTHON:-}
    [ -n "$py" ] || { [ -x .venv/bin/python ] && py=.venv/bin/python; } || py=python3
    "$py" -c 'import resilient_slurm' 2>/dev/null || {
        echo "gpu-proof: --dry-run needs the project installed in $py (make setup)" >&2; exit 2; }
    rc=0
    "$py" scripts/gpu_proof.py --dry-run --wheels "$wheels" --scratch "$scratch" "$out" || rc=$?
    exit "$rc"
fi

py=$(pick_python) || { echo "gpu-proof: no python with torch found (set PYTHON)" >&2; exit 2; }
[ -d "$wheels" ] || { echo "gpu-proof: no wheels in $wheels (run scripts/gpu-proof-wheels.sh" \
    "on a machine with a registry and bring the folder)" >&2; exit 2; }
pipwhl=$(ls "$wheels"/pip-*.whl 2>/dev/null | head -n1)
[ -n "$pipwhl" ] || { echo "gpu-proof: no pip wheel in $wheels" >&2; exit 2; }

t0=$(date +%s.%N)
venv=$scratch/venv
"$py" -m venv --system-site-packages --without-pip "$venv"
pip=("$venv/bin/python" "$pipwhl/pip" install --no-index --find-links "$wheels"
     --disable-pip-version-check --no-input -q)
{
    "${pip[@]}" "setuptools>=77" wheel
    # The project from this checkout (not a prebuilt wheel): the proof runs the code in the tree;
    # the lab beside it (its NVML hang over the real driver: the nvml-hang step; the fault
    # wrapper the restart step runs).
    "${pip[@]}" --no-build-isolation "$repo" "$repo/lab" nvidia-resiliency-ext numpy
} > "$out/install.log" 2>&1 || {
    echo "gpu-proof: offline install failed (see $out/install.log):" >&2
    tail -n 20 "$out/install.log" >&2
    exit 2
}
install_s=$(python3 -c "import time; print(round(time.time() - $t0, 1))" 2>/dev/null \
            || "$venv/bin/python" -c "import time; print(round(time.time() - $t0, 1))")
rc=0
"$venv/bin/python" scripts/gpu_proof.py --wheels "$wheels" --scratch "$scratch" \
    --install-seconds "$install_s" "$out" || rc=$?
exit "$rc"

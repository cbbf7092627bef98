#!/usr/bin/env bash
# Prepare, on a machine WITH a package registry, the wheels scripts/gpu-proof.sh installs
# offline on a GPU node that has none: nvidia-resiliency-ext and everything it and this
# project need EXCEPT torch (the node's own torch is used), plus pip and setuptools (to build
# this project from the checkout there, so the code proved is the code in the tree).
#
#   scripts/gpu-proof-wheels.sh [DIR]      # default .gpu-proof/wheels (git-ignored)
#
# Target: Python ${GPU_PROOF_PYTHON_VERSION:-3.12}, x86_64, glibc >= 2.${GPU_PROOF_GLIBC_MINOR:-39}
# (NVRx 0.7.0 ships only cp312/cp314 manylinux_2_39 wheels; for an older node pick its NVRx with
# GPU_PROOF_NVRX, e.g. nvidia-resiliency-ext==0.4.1 for glibc < 2.39). Fails if the folder exceeds ${GPU_PROOF_MAX_MIB:-60}
# MiB (the device tool carries at most 64 MiB of ignored paths).
set -euo pipefail
cd "$(dirname "$0")/.."

dest=${1:-.gpu-proof/wheels}
pyver=${GPU_PROOF_PYTHON_VERSION:-3.12}
max_mib=${GPU_PROOF_MAX_MIB:-60}
nvrx=${GPU_PROOF_NVRX:-nvidia-resiliency-ext==0.7.0}
pip=(${PIP:-python3 -m pip})

# Every manylinux tag a glibc 2.39 x86_64 system accepts that wheels here are built for.
# pip's --platform takes exact tags only: list them all (glibc 2.39 accepts 2.5 to 2.39).
platforms=()
glibc_minor=${GPU_PROOF_GLIBC_MINOR:-39}
for minor in $(seq "$glibc_minor" -1 5); do
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
done
for tag in manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
done
target=(--python-version "$pyver" --only-binary=:all: "${platforms[@]}")

rm -rf "$dest.tmp"
mkdir -p "$dest.tmp"

# NVRx without its torch requirement: its other requirements, resolved, then NVRx alone.
"${pip[@]}" download -q --no-deps "${target[@]}" -d "$dest.tmp" "$nvrx"
nvrx_whl=$(ls "$dest.tmp"/nvidia_resiliency_ext-*.whl)
mapfile -t reqs < <(python3 - "$nvrx_whl" <<'EOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        name = re.split(r"[ ;<>=!~(\[]", req, maxsplit=1)[0].lower()
        if name == "torch":
            continue
        print(re.sub(r"\s*\(([^)]*)\)", r"\1", req.split(";")[0]).strip())
EOF
)
# Ours (pyproject's runtime dependencies), pip (run from its wheel to fill the venv) and the
# build backend pyproject asks for.
"${pip[@]}" download -q "${target[@]}" -d "$dest.tmp" "${reqs[@]}" "click>=8.0" \
    "nvidia-ml-py>=12.535" numpy pip "setuptools>=77" wheel

if ls "$dest.tmp" | grep -E '^(torch|nvidia_(cu|nccl|cusparse|cufft|curand|nvjitlink|nvtx))' ; then
    echo "gpu-proof-wheels: a CUDA/torch wheel slipped in (listed above): refusing" >&2
    exit 1
fi
size_kib=$(du -sk "$dest.tmp" | cut -f1)
if (( size_kib > max_mib * 1024 )); then
    echo "gpu-proof-wheels: $((size_kib / 1024)) MiB > ${max_mib} MiB" >&2
    exit 1
fi
rm -rf "$dest"
mv "$dest.tmp" "$dest"
ls "$dest" > "$dest/MANIFEST"
echo "gpu-proof-wheels: $(ls "$dest"/*.whl | wc -l) wheels, $((size_kib / 1024)) MiB in $dest"

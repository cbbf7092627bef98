"""What the GPU proof runs on, as one JSON line: Python, torch and its CUDA, the GPU, NCCL, and
the versions of the packages the proof installed (run by scripts/gpu_proof.py)."""

from __future__ import annotations

import importlib.metadata
import json
import platform

import torch


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def nccl() -> str | None:
    if not torch.cuda.is_available():
        return None
    v = torch.cuda.nccl.version()  # a tuple on current torch, an int on old ones
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


cuda = torch.cuda.is_available()
props = torch.cuda.get_device_properties(0) if cuda else None
print(json.dumps({
    "python": platform.python_version(), "torch": torch.__version__,
    "torch_cuda": torch.version.cuda, "cuda": cuda,
    "nccl": nccl(),
    "gpu": props.name if props else None,
    "gpu_mem_gib": round(props.total_memory / 2**30, 1) if props else None,
    "gpus": torch.cuda.device_count(), "nvrx": version("nvidia-resiliency-ext"),
    "nvml": version("nvidia-ml-py"), "resilient_slurm": version("resilient-slurm"),
}))

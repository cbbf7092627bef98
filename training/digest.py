"""Stable digest of a model state: same tensors (names, dtypes, shapes, bytes) -> same hex."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch


def tensor_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over the sorted names and the exact bytes of each (full, CPU) tensor."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()

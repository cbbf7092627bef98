"""Host buffers of exactly the size asked, page-locked for the device when there is one.

``torch.empty(n, pin_memory=True)`` takes its memory from torch's caching host allocator,
which rounds every block up to a power of two (a 13.1 GB snapshot takes 16 GiB of locked
memory). :func:`host_buffer` instead allocates ordinary host memory of exactly ``n`` bytes
and registers those pages with CUDA (``cudaHostRegister``): one registered arena per buffer,
unregistered when the buffer is collected. Without CUDA (or when registering fails) the
buffer is plain host memory and copies are synchronous; correctness never depends on the pin.
"""

from __future__ import annotations

import weakref

import torch


def _unregister(ptr: int) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:  # noqa: BLE001 - at interpreter exit CUDA may be gone already
        pass


def host_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """A uint8 host tensor of exactly ``nbytes``; with ``pin`` (CUDA in use) its pages are
    registered with CUDA, so device copies from and to it are asynchronous."""
    buf = torch.empty(nbytes, dtype=torch.uint8)
    if not (pin and nbytes and torch.cuda.is_available()):
        return buf
    ptr = buf.data_ptr()
    try:
        rc = torch.cuda.cudart().cudaHostRegister(ptr, nbytes, 0)
    except Exception:  # noqa: BLE001 - no runtime: stay pageable
        return buf
    if int(rc) != 0:
        return buf
    weakref.finalize(buf, _unregister, ptr)
    return buf


def is_pinned(buf: torch.Tensor) -> bool:
    """Whether ``buf``'s pages are page-locked for CUDA (registered or from the pinned
    allocator); False without CUDA."""
    return bool(torch.cuda.is_available() and buf.is_pinned())

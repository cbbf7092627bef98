"""In-memory snapshots for --inprocess live in host memory: device shards staged through
pinned buffers reused across steps; host memory reported."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from resilient_slurm.training.fsdp_state import SHARD  # noqa: E402
from resilient_slurm.training.memstate import HostPool, MemoryState  # noqa: E402


def test_cpu_snapshots_are_copies_and_nothing_is_pinned() -> None:
    pool = HostPool()
    src = {"model": {"w": {SHARD: torch.ones(3), "shape": [6], "shard_dim": 0}}, "n": 1}
    copy = pool.stage(src)
    src["model"]["w"][SHARD].add_(1)
    assert torch.equal(copy["model"]["w"][SHARD], torch.ones(3)) and copy["n"] == 1
    pool.release(copy)
    assert pool._free == {}  # CPU copies are not pooled
    assert MemoryState().host_bytes() == {"own": 0, "peer": 0}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_shards_are_staged_to_pinned_buffers_and_reused() -> None:
    pool = HostPool()
    src = {"w": {SHARD: torch.randn(256, device="cuda"), "shape": [512], "shard_dim": 0}}
    first = pool.stage(src)
    buf = first["w"][SHARD]
    assert buf.device.type == "cpu" and buf.is_pinned()
    assert torch.equal(buf, src["w"][SHARD].cpu())
    pool.release(first)
    second = pool.stage(src)
    assert second["w"][SHARD].data_ptr() == buf.data_ptr()  # the dropped snapshot's buffer

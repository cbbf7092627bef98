"""Checkpointer: async snapshot semantics, commit across ranks, retention, every backend."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from resilient_slurm.checkpoint import layout, writers  # noqa: E402
from resilient_slurm.checkpoint.checkpointer import Checkpointer, CheckpointError  # noqa: E402


def _nvrx_unusable() -> str | None:
    """Why NVRx's async checkpointing cannot be used here (None: it can)."""
    if writers.nvrx_available():
        return None
    try:
        from nvidia_resiliency_ext.checkpointing.async_ckpt import core  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - the reason is the point
        return f"NVRx async checkpointing not importable ({type(exc).__name__}: {exc})"
    return ("NVRx async checkpointing lacks AsyncCallsQueue, AsyncRequest or "
            "maybe_finalize_async_calls(no_dist)")


NVRX_UNUSABLE = _nvrx_unusable()
# The NVRx variants are always collected: where NVRx is unusable they skip with the reason
# (a failure under the skip policy, tests/skip_policy.py), never vanish from the run.
NEEDS_NVRX = pytest.mark.skipif(NVRX_UNUSABLE is not None, reason=NVRX_UNUSABLE or "")
NVRX = pytest.param("nvrx", marks=NEEDS_NVRX)
BACKENDS = ["sync", "fork", NVRX]


@pytest.mark.parametrize("backend", BACKENDS)
def test_roundtrip_and_snapshot_semantics(tmp_path, backend) -> None:
    ck = Checkpointer(str(tmp_path), every=2, keep=2, backend=backend)
    assert ck.backend == backend
    assert ck.latest() is None and ck.load() is None
    t = torch.zeros(256, 256)
    for step in range(1, 7):
        t.fill_(step)
        if ck.due(step):
            ck.save(step, {"t": t, "step": step, "py": [step, "x"]})
            t.fill_(-1)  # training keeps mutating: the save must hold the value at save time
        ck.poll()
    ck.close()
    assert ck.latest() == 6
    step, state = ck.load()
    assert step == 6 and state["step"] == 6 and state["py"] == [6, "x"]
    assert torch.equal(state["t"], torch.full((256, 256), 6.0))
    assert layout.describe(str(tmp_path))["committed"] == [4, 6]  # keep=2
    assert ck.load(4)[1]["step"] == 4


def test_due() -> None:
    ck = Checkpointer.__new__(Checkpointer)
    ck.every = 5
    assert [s for s in range(12) if ck.due(s)] == [5, 10]
    ck.every = 0
    assert not any(ck.due(s) for s in range(12))


@pytest.mark.parametrize("backend", BACKENDS)
def test_commit_waits_for_every_rank(tmp_path, backend) -> None:
    r0 = Checkpointer(str(tmp_path), backend=backend, rank=0, world_size=2, session="s1")
    r1 = Checkpointer(str(tmp_path), backend=backend, rank=1, world_size=2, session="s1")
    r0.save(3, {"rank": 0})
    r0.wait()
    assert r0.latest() is None  # rank 1 has not written yet
    r1.save(3, {"rank": 1})
    r1.close()
    assert r0.wait_committed(3, timeout=10)
    assert r0.latest() == 3
    assert r0.load()[1] == {"rank": 0} and r1.load()[1] == {"rank": 1}
    assert r0.load(rank=1)[1] == {"rank": 1}
    r0.close()


def test_world_size_change_needs_load_all(tmp_path) -> None:
    for rank in (0, 1):
        with Checkpointer(str(tmp_path), backend="sync", rank=rank, world_size=2,
                          session="a") as ck:
            ck.save(1, {"rank": rank})
    one = Checkpointer(str(tmp_path), backend="sync", rank=0, world_size=1, session="b")
    with pytest.raises(CheckpointError, match="2 ranks"):
        one.load()
    assert one.load_all() == (1, [{"rank": 0}, {"rank": 1}])
    with pytest.raises(CheckpointError):
        one.load(99)


def test_resumed_save_is_never_deleted(tmp_path) -> None:
    with Checkpointer(str(tmp_path), backend="sync", keep=1) as ck:
        ck.save(1, {"s": 1})
    ck = Checkpointer(str(tmp_path), backend="sync", keep=1)
    assert ck.load()[0] == 1
    for step in (2, 3, 4):
        ck.save(step, {"s": step})
        ck.poll()
    ck.close()
    assert layout.describe(str(tmp_path))["committed"] == [1, 4]


@pytest.mark.parametrize("backend", ["fork", NVRX])
def test_failed_write_is_never_committed(tmp_path, backend) -> None:
    ck = Checkpointer(str(tmp_path), backend=backend)
    ck.save(1, {"bad": lambda: None})  # unpicklable: the background write fails
    ck.close()
    assert ck.latest() is None and ck.failed == [1]
    assert not any(n.endswith(".pt") for n in os.listdir(layout.step_dir(str(tmp_path), 1)))


def test_sync_write_failure_raises(tmp_path) -> None:
    ck = Checkpointer(str(tmp_path), backend="sync")
    with pytest.raises(Exception):  # noqa: B017 - pickling error type varies
        ck.save(1, {"bad": lambda: None})
    assert ck.latest() is None


def test_already_committed_step_is_not_rewritten(tmp_path) -> None:
    with Checkpointer(str(tmp_path), backend="sync", session="first") as ck:
        ck.save(5, {"v": 1})
    with Checkpointer(str(tmp_path), backend="sync", session="second") as ck:
        ck.save(5, {"v": 2})
        assert ck.load()[1] == {"v": 1}


def test_heartbeat_called_while_waiting(tmp_path) -> None:
    beats: list[int] = []
    ck = Checkpointer(str(tmp_path), backend="fork", heartbeat=lambda: beats.append(1))
    ck.save(1, {"t": torch.randn(2_000_000)})
    ck.close()
    ck.load()
    assert beats


def test_nvrx_cpu_compat_is_scoped() -> None:
    sync, get_rank = torch.cuda.synchronize, torch.distributed.get_rank
    with writers._cpu_compat():
        if not torch.cuda.is_available():
            torch.cuda.synchronize()  # would raise on a CPU-only build
    assert torch.cuda.synchronize is sync and torch.distributed.get_rank is get_rank


@NEEDS_NVRX
def test_nvrx_writer_uses_the_fork_caller() -> None:
    """The persistent caller crashes on a CPU-only torch (NVRx 0.6: ``rank %
    torch.cuda.device_count()``) and leaves saves and the rank's exit hanging."""
    writer = writers.NvrxWriter()
    try:
        assert writer._queue.persistent is False
    finally:
        writer.close()


def test_unknown_backend() -> None:
    with pytest.raises(ValueError):
        writers.make_writer("carrier-pigeon")

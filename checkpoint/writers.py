"""How one rank's save reaches the disk: synchronously, through NVRx's async engine, or a fork.

Every writer runs :func:`write_rank` (temp file, fsync, rename, ``.done`` marker, commit
attempt; see ``layout.py``), either in the caller (``sync``) or in a forked child that holds a
copy-on-write snapshot of the state taken at the moment of the call (``nvrx``, ``fork``). The
training loop only pays for the device-to-host copy (GPU) and the fork.

``nvrx`` drives ``nvidia_resiliency_ext.checkpointing.async_ckpt.core.AsyncCallsQueue`` (the
engine under ``TorchAsyncCheckpoint``) with its non-persistent caller. NVRx calls
``torch.cuda.synchronize()`` and ``torch.distributed.get_rank()`` while scheduling; on a
CPU-only torch, or without a process group, those two calls are replaced by harmless stand-ins
for the duration of the call only, so the GPU path runs NVRx unchanged. Features are detected
(``persistent`` and ``no_dist`` parameters), not inferred from the version; when NVRx is
missing or lacks them, ``auto`` falls back to ``fork``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from resilient_slurm.checkpoint import layout


@dataclass(frozen=True)
class SaveJob:
    directory: str
    step: int
    rank: int
    world_size: int
    session: str


def write_rank(state: Any, job: SaveJob) -> None:
    """Write ``state`` as ``job.rank``'s file of the save, publish its marker, try to commit."""
    os.makedirs(job.directory, exist_ok=True)
    final = layout.rank_file(job.directory, job.rank, job.session)
    tmp = f"{final}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    layout.write_done(job.directory, job.rank, job.session, job.step, job.world_size)
    layout.try_commit(job.directory, job.step, job.session, job.world_size)


def write_rank_background(state: Any, job: SaveJob) -> None:
    """:func:`write_rank` at lower CPU priority: the training process keeps its cores."""
    with contextlib.suppress(OSError):
        os.nice(10)
    write_rank(state, job)


def to_host(state: Any) -> Any:
    """Copy device tensors to host memory (no-op for CPU tensors); waits for the copies."""
    moved = False

    def conv(x: Any) -> Any:
        nonlocal moved
        if isinstance(x, torch.Tensor):
            if x.device.type != "cpu":
                moved = True
                return x.detach().to("cpu", non_blocking=True)
            return x.detach()
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x

    out = conv(state)
    if moved and torch.cuda.is_available():
        torch.cuda.synchronize()
    return out


class Writer(Protocol):
    name: str

    def start(self, state: Any, job: SaveJob) -> None: ...

    def poll(self) -> list[SaveJob]:
        """Jobs whose local write has ended (successfully or not); never blocks."""
        ...

    def in_flight(self) -> int: ...

    def close(self) -> None: ...


class SyncWriter:
    name = "sync"

    def __init__(self) -> None:
        self._ended: list[SaveJob] = []

    def start(self, state: Any, job: SaveJob) -> None:
        write_rank(to_host(state), job)
        self._ended.append(job)

    def poll(self) -> list[SaveJob]:
        ended, self._ended = self._ended, []
        return ended

    def in_flight(self) -> int:
        return 0

    def close(self) -> None:
        pass


class ForkWriter:
    """Plain ``os.fork`` writer: the fallback when NVRx's async engine is unusable."""

    name = "fork"

    def __init__(self) -> None:
        self._children: dict[int, SaveJob] = {}

    def start(self, state: Any, job: SaveJob) -> None:
        host = to_host(state)
        pid = os.fork()
        if pid == 0:  # child: write and leave without running any parent cleanup
            code = 1
            try:
                write_rank_background(host, job)
                code = 0
            finally:
                os._exit(code)
        self._children[pid] = job

    def poll(self) -> list[SaveJob]:
        ended = []
        for pid in list(self._children):
            with contextlib.suppress(ChildProcessError):
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done == 0:
                    continue
            ended.append(self._children.pop(pid))
        return ended

    def in_flight(self) -> int:
        return len(self._children)

    def close(self) -> None:
        for pid in list(self._children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._children.clear()


def _nvrx_core() -> Any | None:
    try:
        from nvidia_resiliency_ext.checkpointing.async_ckpt import core
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return None
    needed = ("AsyncCallsQueue", "AsyncRequest")
    if not all(hasattr(core, n) for n in needed):
        return None
    finalize = inspect.signature(core.AsyncCallsQueue.maybe_finalize_async_calls)
    if "no_dist" not in finalize.parameters:
        return None
    return core


def nvrx_available() -> bool:
    return _nvrx_core() is not None


@contextlib.contextmanager
def _cpu_compat() -> Iterator[None]:
    """Stand-ins for the CUDA / process-group calls NVRx makes, only where they would fail."""
    saved: list[tuple[Any, str, Any]] = []
    if not torch.cuda.is_available():
        saved.append((torch.cuda, "synchronize", torch.cuda.synchronize))
        torch.cuda.synchronize = lambda *a, **k: None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        saved.append((dist, "get_rank", dist.get_rank))
        dist.get_rank = lambda *a, **k: 0
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


class NvrxWriter:
    """NVRx async engine with the fork-based (non-persistent) caller and local finalization."""

    name = "nvrx"

    def __init__(self) -> None:
        core = _nvrx_core()
        if core is None:
            raise RuntimeError("nvidia-resiliency-ext async checkpointing is not usable here")
        self._core = core
        # Non-persistent caller is chosen on purpose (fork snapshot; the persistent queue
        # misbehaves on CPU): silence NVRx's deprecation notice about it.
        logging.getLogger(core.__name__).setLevel(logging.ERROR)
        # __init__'s own parameters: NVRx 0.6 gives the class a metaclass whose __call__
        # takes (*args, **kwargs), which is all inspect.signature(class) would show.
        params = inspect.signature(core.AsyncCallsQueue.__init__).parameters
        self._queue = core.AsyncCallsQueue(persistent=False) if "persistent" in params \
            else core.AsyncCallsQueue()
        self._ended: list[SaveJob] = []

    def start(self, state: Any, job: SaveJob) -> None:
        host = to_host(state)
        request = self._core.AsyncRequest(write_rank_background, (host, job),
                                          [lambda: self._ended.append(job)])
        with _cpu_compat():
            self._queue.schedule_async_request(request)

    def poll(self) -> list[SaveJob]:
        self._queue.maybe_finalize_async_calls(blocking=False, no_dist=True)
        ended, self._ended = self._ended, []
        return ended

    def in_flight(self) -> int:
        return int(self._queue.get_num_unfinalized_calls())

    def close(self) -> None:
        self._queue.maybe_finalize_async_calls(blocking=True, no_dist=True)


def make_writer(backend: str) -> Writer:
    """``sync`` | ``fork`` | ``nvrx`` | ``auto`` (nvrx when usable, else fork)."""
    if backend == "auto":
        backend = "nvrx" if nvrx_available() else "fork"
    makers: dict[str, Callable[[], Writer]] = {
        "sync": SyncWriter, "fork": ForkWriter, "nvrx": NvrxWriter}
    if backend not in makers:
        raise ValueError(f"unknown checkpoint backend {backend!r}; use auto, nvrx, fork or sync")
    return makers[backend]()


def wait_all(writer: Writer, tick: Callable[[], None] | None = None,
             interval: float = 0.05) -> list[SaveJob]:
    """Poll until nothing is in flight, calling ``tick`` (e.g. a heartbeat) between polls."""
    ended = writer.poll()
    while writer.in_flight():
        if tick is not None:
            tick()
        time.sleep(interval)
        ended += writer.poll()
    return ended

"""The three tiers behind :func:`resilient_slurm.checkpoint.save` and ``load``.

``save(state_dict, step)`` (every rank, every step if wanted) lays out the rank's tensors in one
host buffer (:class:`flat.Stager`; the copy runs off the training's path, the next optimizer
step waits for it) and returns; a background thread publishes the tier-1 snapshot on this node
(:mod:`store`, overwriting the oldest kept file in place) and sends the same bytes to the
rank's peer on the next node (tier 2, :mod:`peers`). The writer thread makes the gloo group, so
gloo's I/O threads inherit its CPU priority (``nice``, default 0: a starved writer holding the
GIL stalls the training thread too). The memory the tiers take is bounded by a cap
(:mod:`budget`). At every step that is a multiple of ``durable_every`` (and on a stop signal,
:mod:`signals`) the state also goes to shared storage (tier 3, :mod:`durable`). At most one save
is in flight: a save waits for the previous one's background work (the stall it returns).
``load(state_dict)`` (collective) restores the newest step some tier holds (:mod:`restore`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from resilient_slurm.checkpoint import budget, flat, peers, restore, signals, store
from resilient_slurm.checkpoint.durable import Durable

CheckpointError = store.CheckpointError  # a save or load that cannot be done
default_job = store.default_job  # the job's folder name under the node-memory root


@dataclass
class Timings:
    """Seconds of the last save, per part (the background ones overlap training)."""

    stall: float = 0.0
    stage: float = 0.0
    tier1: float = 0.0
    tier2: float = 0.0
    saves: int = 0
    stall_total: float = 0.0
    copy_wait_total: float = 0.0  # optimizer steps held for the side copy (CPU)


@dataclass
class _Job:
    step: int
    world: int
    staged: flat.Staged
    done: threading.Event = field(default_factory=threading.Event)
    copied: threading.Event = field(default_factory=threading.Event)


class Tiers:
    """Memory tiers with an optional durable tier. Construct on every rank after
    ``init_process_group``; the first ``save`` or ``load`` is a collective (it learns the
    node layout and makes the gloo groups).

    Args:
        durable_dir: shared directory of tier 3 (None: no durable saves).
        durable_every: a durable save at every step that is a multiple of this (0: none),
            counted by step number, so a job that restarts often still reaches disk.
        flush_signals: with a durable tier, SIGTERM and SIGUSR1 make the next ``save`` write
            its step to the durable tier and wait for the commit before the signal takes its
            course (:mod:`signals`).
        keep: snapshots kept per rank in each node's memory (own and each peer copy).
        durable_keep: committed durable saves kept.
        root: node-memory directory (``RESILIENT_TIER1_DIR``, else ``/dev/shm``): one per
            node, as every node has memory of its own (two nodes given one folder fail at the
            first save, :func:`store.claim`).
        job: name of this job's folder under ``root`` (``RESILIENT_CKPT_JOB``,
            ``SLURM_JOB_ID``, ``TORCHELASTIC_RUN_ID``, else ``local``).
        replicate: keep a copy on the peer node (tier 2) when the layout allows one.
        timeout_s: timeout of the gloo groups the tiers use.
        max_bytes: cap on the memory the tiers take per rank (bytes, or text like ``8GiB``;
            ``RESILIENT_TIER_MAX_BYTES``; None: no cap): over it ``keep`` is lowered to 2,
            then tier 2 is turned off on every rank, then saving is refused (CheckpointError).
        checksum: CRC-32 every snapshot (default); False records its size only (a torn or
            partial file is still never used; a damaged byte would be): ~4 ms less CPU per
            save of 12 MiB, measured by ``bench/tier_bench.py --no-checksum``.
        nice: CPU priority of the background writer and its gloo threads (0-19; 0: the
            process's own). See the module docstring for why 0 is the default.
        reshard_max_bytes: above this many bytes resharded onto one rank, a change of world
            size restores from the durable tier instead of resharding node memory
            (``RESILIENT_RESHARD_MAX_BYTES``; None: no limit).
        side_copy: copy the state off the training's path (CUDA: a side stream; CPU: the
            writer thread), the next optimizer step of any optimizer waiting for the copy
            (torch's global step pre-hook); False copies inside ``save``.
    """

    def __init__(self, durable_dir: str | None = None, durable_every: int = 0, keep: int = 2,
                 durable_keep: int = 2, root: str | None = None, job: str | None = None,
                 replicate: bool = True, timeout_s: float = 300.0,
                 max_bytes: int | str | None = None, nice: int = 0,
                 checksum: bool = True, reshard_max_bytes: int | str | None = None,
                 flush_signals: bool = True, side_copy: bool = True) -> None:
        if keep < 1 or durable_keep < 1 or durable_every < 0:
            raise ValueError("keep and durable_keep must be >= 1, durable_every >= 0")
        if not 0 <= nice <= 19:
            raise ValueError(f"nice must be 0-19, got {nice}")
        self.max_bytes, self.nice, self.checksum = max_bytes, nice, checksum
        cap = max_bytes if max_bytes is not None else os.environ.get("RESILIENT_TIER_MAX_BYTES")
        self.cap = budget.parse_size(cap) if isinstance(cap, str) else cap
        self.cap_why = ""
        if self.cap is not None and self.cap < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.cap}")
        self.keep_asked = keep
        self.flush_signals, self.side_copy = flush_signals, side_copy
        self._hook: Any = None
        self._flush: signals.SignalFlush | None = None
        limit = (reshard_max_bytes if reshard_max_bytes is not None
                 else os.environ.get("RESILIENT_RESHARD_MAX_BYTES"))
        self.reshard_max_bytes = budget.parse_size(limit) if isinstance(limit, str) else limit
        if durable_every and not durable_dir:
            raise ValueError("durable_every needs durable_dir")
        self.keep, self.durable_keep = keep, durable_keep
        self.durable_dir, self.durable_every = durable_dir, durable_every
        self.root = root or os.environ.get("RESILIENT_TIER1_DIR") or "/dev/shm"
        self.job = job or default_job()
        self.job_dir = os.path.join(self.root, self.job)
        self.replicate, self.timeout_s = replicate, timeout_s
        self.timings = Timings()
        self.last_load: dict[str, Any] = {}
        self._ready = False
        self._stager = flat.Stager()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._last: _Job | None = None
        self._error: BaseException | None = None
        self._blob_bytes, self.peer_bytes = 0, 0  # one snapshot's; the peer copy's
        self._thread: threading.Thread | None = None
        self._recv: torch.Tensor | None = None
        self.memory: budget.Plan | None = None
        self.durable: Durable | None = None

    # -- set-up (collective) --------------------------------------------------------------
    def _setup(self) -> None:
        if self._ready:
            return
        if not (dist.is_available() and dist.is_initialized()):
            raise CheckpointError("resilient_slurm.checkpoint needs init_process_group first")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.topo = peers.gather_topology()
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self.peer = self.topo.peer[self.rank] if self.replicate else None
        self.source = self.topo.source(self.rank) if self.replicate else None
        made = threading.Event()
        self._thread = threading.Thread(target=self._work, args=(timeout, made),
                                        name="tier-writer", daemon=True)
        self._thread.start()  # makes self.group (collective; this thread waits meanwhile)
        while not made.wait(0.5):
            if not self._thread.is_alive():
                break
        if self._error is not None or not made.is_set():
            raise CheckpointError(f"memory tier group failed: {self._error}") from self._error
        if self.durable_dir:
            session: list[Any] = [f"{int(time.time())}.{os.getpid()}"]
            dist.broadcast_object_list(session, src=0)
            self.durable = Durable(self.durable_dir, self.durable_every, self.durable_keep,
                                   peers.tier_group(timeout)[0],
                                   self.rank, self.world, str(session[0]))
            if self.flush_signals and self._flush is None:
                self._flush = signals.SignalFlush(peers.tier_group(timeout)[0])
        os.makedirs(self.job_dir, mode=0o700, exist_ok=True)
        clash = store.claim(self.job_dir, peers.node_name())
        flag = torch.tensor([1 if clash else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)  # every rank or none
        if int(flag[0]):
            raise store.shared(clash)  # a configuration error: no restart can fix it
        self._ready = True

    # -- saving ---------------------------------------------------------------------------
    def save(self, state_dict: Any, step: int) -> float:
        """Snapshot ``state_dict`` as ``step``; returns the seconds the caller was held."""
        self._setup()
        t0 = time.perf_counter()
        self._wait_last()
        staged = self._stager.stage(state_dict, defer=self.side_copy)
        if self.side_copy and self._hook is None:  # the next optimizer step waits for the copy
            self._hook = register_optimizer_step_pre_hook(self._before_step)
        if self.memory is None or self.memory.snapshot != staged.nbytes:
            self._fit(staged.nbytes)
        t1 = time.perf_counter()
        job = _Job(step, self.world, staged)
        self._last = job
        self._queue.put(job)
        if self.durable is not None:
            flush = self._flush.agreed() if self._flush is not None else 0
            if self.durable.due(step) or flush:
                self.durable.save(state_dict, step)
            self.durable.poll()
            if flush and self._flush is not None:
                self.wait()  # the memory tiers and the durable commit of this step
                print(f"[resilient-checkpoint] rank {self.rank}: signal {flush}: step {step} "
                      "committed to the durable tier", flush=True)
                self._flush.finish(flush)
        t = self.timings
        t.stage, t.stall = t1 - t0, time.perf_counter() - t0
        t.saves += 1
        t.stall_total += t.stall
        return t.stall

    def _before_step(self, *_: Any) -> None:
        """Any optimizer's step waits for the last save's copy of the state: on CUDA the
        compute stream waits for the side stream's event (the host does not), on CPU the
        host waits for the writer thread's copy."""
        job = self._last
        if job is None or job.copied.is_set():
            return
        if job.staged.event is not None:
            torch.cuda.current_stream().wait_event(job.staged.event)
            return
        t0 = time.perf_counter()
        while not job.copied.wait(0.5):
            if self._thread is None or not self._thread.is_alive():
                break
        self.timings.copy_wait_total += time.perf_counter() - t0

    def _wait_last(self, timeout_s: float | None = None) -> bool:
        """Wait for the last save's background work; False if ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._last is not None:
            while not self._last.done.wait(0.5):
                if self._thread is None or not self._thread.is_alive():
                    break
                if deadline is not None and time.monotonic() > deadline:
                    return False
        if self._error is not None:
            raise CheckpointError(f"memory tier write failed: {self._error}") from self._error
        return True

    def _fit(self, size: int) -> None:
        """Collective on the tier group (nothing in flight): fit the tiers under the cap, the
        same way on every rank (the worst rank's verdict), and print what they take."""
        peer_size = size if (self.peer is not None or self.source is not None) else 0
        cap, self.cap_why = self.cap, "max_bytes"
        if cap is None:  # what the node can hold: cgroup headroom, tmpfs free space
            local = next(len(n) for n in self.topo.nodes if self.rank in n)
            cap, self.cap_why = budget.default_cap(self.root, local,
                                                   store.bytes_used(self.job_dir))
        mine = budget.plan(size, peer_size, self.keep_asked, cap)
        code = torch.tensor([mine.code], dtype=torch.int64)
        dist.all_reduce(code, op=dist.ReduceOp.MAX, group=self.group)
        worst = int(code[0])
        if worst == budget.REFUSE:
            raise CheckpointError(
                f"rank {self.rank}: memory tiers do not fit max_bytes: "
                + (mine.degraded if mine.code == budget.REFUSE else "another rank's tiers "
                   f"do not fit its cap (this rank needs {budget.mib(mine.total)})"))
        if worst == budget.NO_PEER and peer_size:
            why = (mine.degraded if mine.code == budget.NO_PEER else
                   "tier 2 off on every rank: another rank's tiers do not fit its cap")
            self.peer = self.source = None
            mine = dataclasses.replace(budget.plan(size, 0, self.keep_asked, cap),
                                       degraded=why)
        self.memory = mine
        self.keep = mine.keep
        if self.rank == 0 or mine.degraded:
            print(budget.describe(mine, self.rank, self.job_dir, self.source)
                  + f" (cap: {self.cap_why})", flush=True)
        if mine.degraded:
            restore.note(0, None, "memory tiers", f"rank {self.rank}: {mine.degraded} "
                         f"(cap: {self.cap_why})", f"keep {mine.keep}, tier 2 "
                         + ("on" if mine.tier2 else "off"))

    def _work(self, timeout: datetime.timedelta, made: threading.Event) -> None:
        if self.nice:
            tid = threading.get_native_id()
            try:  # only ever lowered: raising a priority needs privilege
                os.setpriority(os.PRIO_PROCESS, tid, max(self.nice, os.getpriority(
                    os.PRIO_PROCESS, tid)))
            except OSError:
                pass
        try:
            self.group, self.network = peers.tier_group(timeout)
        except BaseException as exc:  # noqa: BLE001 - raised by _setup
            self._error = exc
            return
        made.set()
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                if self._error is None:
                    self._write(job)
            except BaseException as exc:  # noqa: BLE001 - surfaced by the next save or load
                self._error = exc
            finally:
                job.copied.set()
                job.done.set()

    def _write(self, job: _Job) -> None:
        t0 = time.perf_counter()
        staged = job.staged
        staged.finish_copy()
        job.copied.set()
        own = store.write(self.job_dir, self.rank, job.step, job.world, staged.parts(),
                          recycle_keep=self.keep, checksum=self.checksum)
        store.prune(self.job_dir, self.rank, self.keep)
        self._blob_bytes = staged.nbytes
        t1 = time.perf_counter()
        if self.peer is not None or self.source is not None:
            got = peers.exchange(self.group, self.peer, staged.prefix, staged.data, self.source,
                                 job.step, own.crc32, self._recv)
            if got is not None and self.source is not None:
                prefix, data, crc = got
                self._recv = data
                store.write(self.job_dir, self.source, job.step, job.world,
                            [prefix, flat.as_bytes(data)], recycle_keep=self.keep, crc=crc)
                store.prune(self.job_dir, self.source, self.keep)
                self.peer_bytes = len(prefix) + data.numel()
        self.timings.tier1, self.timings.tier2 = t1 - t0, time.perf_counter() - t1

    def wait(self) -> None:
        """Block until the last save is in node memory and on its peer (and durable saves
        in flight are committed)."""
        self._wait_last()
        if self.durable is not None:
            self.durable.finish()

    # -- loading --------------------------------------------------------------------------
    def load(self, state_dict: Any, newer_than: int | None = None,
             check: Callable[[], bool] | None = None) -> int | None:
        """Collective: fill ``state_dict`` in place from the newest step every rank can get
        (newer than ``newer_than``); its step, or None when no tier holds one (fresh start;
        ``state_dict`` untouched). Only the chosen snapshot is read and verified; a corrupt
        one, a layout that cannot be resharded, or a state ``check`` rejects on any rank falls
        back to the next source (:mod:`restore`)."""
        self._setup()
        self.wait()
        return restore.load(self, state_dict, newer_than, check)

    def reset(self, timeout_s: float = 10.0) -> bool:
        """Forget the process groups (an in-process restart rebuilt them): the writer stops,
        the next ``save`` or ``load`` sets up on the new group, the snapshots stay. False when
        the old writer did not stop within ``timeout_s`` (left behind with its own queue)."""
        stopped = True
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)
            stopped = not self._thread.is_alive()
        if self._flush is not None:
            self._flush.restore()
        self._flush = None
        self._ready, self._thread, self._error, self._last = False, None, None, None
        self._queue = queue.Queue()
        self._recv, self.memory, self.durable = None, None, None
        return stopped

    # -- reporting and shutdown -------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """What the tiers hold and cost on this rank (bytes, seconds)."""
        t = self.timings
        return {
            "tier1_bytes": self._blob_bytes * self.keep, "tier2_bytes": self.peer_bytes * self.keep,
            "node_dir_bytes": store.bytes_used(self.job_dir),
            "staging_pinned_bytes": self._stager.pinned_bytes,
            "snapshot_bytes": self._blob_bytes, "keep": self.keep,
            "peer": getattr(self, "peer", None),
            "peer_why": self.topo.why if hasattr(self, "topo") else None,
            "network": getattr(self, "network", None),
            "stall_s": t.stall, "stage_s": t.stage, "tier1_s": t.tier1, "tier2_s": t.tier2,
            "saves": t.saves, "stall_total_s": t.stall_total,
            "copy_wait_total_s": t.copy_wait_total,
            "durable_committed": list(self.durable.committed if self.durable else []),
            "durable_failed": list(self.durable.failed if self.durable else []),
            "memory": self.memory.as_dict() if self.memory else None,
        }

    def close(self, timeout_s: float | None = None) -> bool:
        """Finish in-flight saves and stop the writer. With ``timeout_s`` (at exit, where a
        dead peer must not hold a failing process back) it gives up after that long and
        returns False; unfinished saves are then simply not in the tiers. Idempotent."""
        if not self._ready:
            return True
        self._ready = False
        try:
            done = self._wait_last(timeout_s)
        except CheckpointError:
            done = False
        self._queue.put(None)
        if not done:
            return False
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)
        if self.durable is not None:
            if timeout_s is None:
                self.durable.close()
            else:
                self.durable.poll()
                done = not self.durable.pending()
        return done

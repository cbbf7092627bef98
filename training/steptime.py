"""Per-rank step timing: compute separated from time spent waiting in collectives.

A gang moves at the pace of its slowest rank, and every other rank waits for it inside the
collectives; so the slowest rank is the one that waits least. :class:`StepTimer` measures, per
rank and per step, the wall time of the step, the time spent blocked in synchronous
``torch.distributed`` collectives (FSDP2's all-gathers and reduce-scatters on CPU/gloo, ours,
anyone's), and their difference, the rank's own compute. Every ``every`` steps the ranks
all-gather these sums (one small collective) and rank 0 emits one event:

``kind=step_timing``: ``step`` (the last step of the window), ``steps`` (steps in it),
``world_size``, ``step_s`` (mean wall time per step), ``timing``: the compute figure's origin
(``sections``: our timing; ``nvrx-cupti``: NVRx's straggler detector), ``cost_s`` (time this
module spent, its own collective included, per step), and ``nodes``: node -> ``compute_s``
(per step, the node's slowest rank), ``wait_s`` (per step, the node's least-waiting rank),
``ranks``.

On a GPU with ``nvidia_resiliency_ext.straggler`` importable, the step runs inside NVRx's
``Detector.detection_section`` and the compute figure is the rank's CUDA kernel time per step
(CUPTI, NCCL kernels excluded by NVRx), with ``gpu_score`` (NVRx's relative performance score,
1 = the fastest rank) added per node; without a GPU (or NVRx) the section timing is used.

Asynchronous collectives (``async_op=True``) count only their launch; on a GPU the host-side
figure is not used. Disabled (a no-op) when ``every`` is 0.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from resilient_slurm.events import EventKind, EventLog, StepTiming

TIMED_COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast",
    "barrier", "reduce", "gather", "scatter", "all_gather_object", "broadcast_object_list")
FIELDS = 5  # compute, wait, wall, steps, gpu score (nan: none) per rank


def aggregate(rows: Sequence[Sequence[float]], nodes: Sequence[str]) -> dict[str, Any]:
    """Per node: the slowest rank's compute and the least-waiting rank's wait, per step.

    ``rows[r]`` = (compute_sum, wait_sum, wall_sum, steps, gpu_score) of rank ``r``, whose node
    is ``nodes[r]``. Pure."""
    out: dict[str, dict[str, Any]] = {}
    for (compute, wait, _wall, steps, score), node in zip(rows, nodes, strict=True):
        n = max(steps, 1.0)
        cur = out.setdefault(node, {"compute_s": 0.0, "wait_s": math.inf, "ranks": 0})
        cur["compute_s"] = max(cur["compute_s"], compute / n)
        cur["wait_s"] = min(cur["wait_s"], wait / n)
        cur["ranks"] += 1
        if not math.isnan(score):
            cur["gpu_score"] = min(cur.get("gpu_score", 1.0), score)
    for cur in out.values():
        cur["compute_s"] = round(cur["compute_s"], 6)
        cur["wait_s"] = round(cur["wait_s"], 6)
        if "gpu_score" in cur:
            cur["gpu_score"] = round(cur["gpu_score"], 4)
    return out


def kernel_seconds(kernel_summaries: Mapping[str, Mapping[Any, float]]) -> float:
    """Total CUDA kernel time (seconds) in NVRx's per-kernel summaries (times in ms)."""
    total_ms = 0.0
    for stats in kernel_summaries.values():
        num = avg = None
        for key, value in stats.items():
            name = str(getattr(key, "name", key)).upper()
            if name.endswith("NUM"):
                num = value
            elif name.endswith("AVG"):
                avg = value
        if num is not None and avg is not None and math.isfinite(num * avg):
            total_ms += num * avg
    return total_ms / 1e3


def _nvrx_detector() -> Any | None:
    if not torch.cuda.is_available():
        return None
    try:
        from nvidia_resiliency_ext.straggler import Detector
    except Exception:  # noqa: BLE001 - any import failure: use our own section timing
        return None
    return Detector


class StepTimer:
    """Times each step of this rank; every ``every`` steps rank 0 emits ``step_timing``."""

    def __init__(self, every: int, node: str, events: EventLog | None,
                 use_nvrx: bool = True, detector: Any | None = None) -> None:
        """``detector``: NVRx's ``straggler.Detector`` or a stand-in (default: NVRx's on a
        GPU when importable and ``use_nvrx``)."""
        self.every, self.node, self.events = every, node, events
        self.comm = 0.0  # seconds blocked in collectives in the current step
        self.sums = [0.0, 0.0, 0.0, 0.0]  # compute, wait, wall, steps since the last report
        self.cost = 0.0  # seconds spent here since the last report
        self.cost_total = self.wall_total = 0.0
        self._t0 = 0.0
        self._active = False
        self._nodes: list[str] | None = None
        self._saved: dict[str, Callable[..., Any]] = {}
        if detector is None and use_nvrx and every > 0:
            detector = _nvrx_detector()
        self.detector = detector
        self.source = "nvrx-cupti" if self.detector is not None else "sections"
        self._section: contextlib.AbstractContextManager[Any] | None = None

    @property
    def enabled(self) -> bool:
        return self.every > 0

    # -- collectives ---------------------------------------------------------------------
    def install(self) -> None:
        """Time every synchronous ``torch.distributed`` collective while a step runs."""
        if not self.enabled or self._saved:
            return
        if self.detector is not None:
            try:
                self.detector.initialize(scores_to_compute=["relative_perf_scores"],
                                         gather_on_rank0=False, node_name=self.node)
            except Exception as exc:  # noqa: BLE001 - CUPTI unusable: our own timing instead
                print(f"step timing: NVRx straggler detector unusable ({exc}); using section "
                      "timing", flush=True)
                self.detector, self.source = None, "sections"
        for name in TIMED_COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is not None:
                self._saved[name] = fn
                setattr(dist, name, self._wrap(fn))

    def uninstall(self) -> None:
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self._saved.clear()
        if self.detector is not None and self.detector.initialized:
            self.detector.shutdown()

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self._active or kwargs.get("async_op"):
                return fn(*args, **kwargs)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.comm += time.perf_counter() - t
        return timed

    # -- steps ---------------------------------------------------------------------------
    def start_step(self) -> None:
        if not self.enabled:
            return
        self.comm = 0.0
        self._active = True
        if self.detector is not None:
            self._section = self.detector.detection_section("step", profile_cuda=True)
            self._section.__enter__()
        self._t0 = time.perf_counter()

    def compute_so_far(self) -> float:
        """This step's compute until now (wall minus collective waits), in seconds."""
        if not self.enabled:
            return 0.0
        return max(0.0, time.perf_counter() - self._t0 - self.comm)

    def end_step(self) -> None:
        if not self.enabled:
            return
        wall = time.perf_counter() - self._t0
        if self._section is not None:
            self._section.__exit__(None, None, None)
            self._section = None
        self._active = False
        c = time.perf_counter()
        self.sums[0] += max(0.0, wall - self.comm)
        self.sums[1] += self.comm
        self.sums[2] += wall
        self.sums[3] += 1
        self.wall_total += wall
        self.cost += time.perf_counter() - c

    def maybe_report(self, step: int, force: bool = False) -> None:
        """Every ``every`` steps (or ``force``, the same call on every rank): gather, emit."""
        if not self.enabled or self.sums[3] == 0 or not (force or step % self.every == 0):
            return
        c = time.perf_counter()
        world = dist.get_world_size()
        if self._nodes is None:
            names: list[Any] = [None] * world
            self._saved.get("all_gather_object", dist.all_gather_object)(names, self.node)
            self._nodes = [str(n) for n in names]
        score = math.nan
        if self.detector is not None:
            report = self.detector.generate_report()  # collective on every rank
            kernel_s = kernel_seconds(report.local_kernel_summaries)
            if kernel_s > 0:  # GPU compute: CUDA kernel time; the rest of the step is waiting
                self.sums[0], self.sums[1] = kernel_s, max(0.0, self.sums[2] - kernel_s)
            score = float(next(iter(report.gpu_relative_perf_scores.values()), math.nan))
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        mine = torch.tensor([*self.sums, score], dtype=torch.float64, device=device)
        rows = [torch.empty_like(mine) for _ in range(world)]
        self._saved.get("all_gather", dist.all_gather)(rows, mine)
        steps = int(self.sums[3])
        wall = self.sums[2] / steps
        self.sums = [0.0, 0.0, 0.0, 0.0]
        self.cost += time.perf_counter() - c
        cost, self.cost = self.cost, 0.0
        self.cost_total += cost
        if self.events is not None:
            self.events.emit(EventKind.STEP_TIMING, **StepTiming(
                step=step, steps=steps, world_size=world, step_s=round(wall, 6),
                cost_s=round(cost / steps, 6), timing=self.source,
                nodes=aggregate([r.cpu().tolist() for r in rows], self._nodes)))

    def cost_fraction(self) -> float:
        """Share of the measured step time this module cost (its own gathers included)."""
        return self.cost_total / self.wall_total if self.wall_total > 0 else 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[StepTimer]:
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

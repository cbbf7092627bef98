"""The payloads of the events written from inside the job's steps: the per-node shim (what it
reads from ft_launcher's output) and the training. As :mod:`resilient_slurm.payloads` (the
hooks' and the launcher's): one ``TypedDict`` per kind, every field optional, built by the
emitters; this module imports nothing of the project (the training imports it).
"""

from __future__ import annotations

from typing import Any, TypedDict

# -- the per-node shim, from ft_launcher's output (job log) -------------------------------------


class Relayed(TypedDict, total=False):
    """What the shim's relay adds to each event it records (launcher/shim/relay.py)."""

    dropped: int | None  # events it could not record before this one
    # a failure report's: the node's ranks seen stopped (SIGSTOP, process state T) lately
    stopped_ranks: list[int] | None


class RankEvent(Relayed, total=False):
    """``worker_exception``, ``peer_lost``, ``rank_disconnected``, ``first_heartbeat``."""

    rank: int


class WorkerFailed(Relayed, total=False):
    """``worker_failed``: ft_launcher saw a dead worker."""

    local_rank: int
    exitcode: int
    signal: str | None
    pid: int


class Rendezvous(Relayed, total=False):
    """``rendezvous``: a node joined a rendezvous round (no ``round`` on NVRx 0.6/0.7)."""

    round: int | None
    group_rank: int
    world: int


class HangDetected(Relayed, total=False):
    """``hang_detected``: a rank missed its heartbeats (``local_rank`` when the monitor knows
    only that)."""

    rank: int | None
    heartbeat: str  # initial | subsequent
    waited_s: float
    local_rank: int | None


class WorkerRestart(Relayed, total=False):
    """``worker_restart``: ft_launcher restarts the worker group (an in-job restart)."""

    state: str
    attempts_left: int


class StepSignal(TypedDict, total=False):
    """``step_signal``: a step's task got SIGUSR1/2 (sbatch --signal without B:)."""

    signal: str
    detail: str


class StandbyStopped(TypedDict, total=False):
    """``standby_stopped``: an NVRx standby's ft_launcher stopped (or never started) because
    its node's published verdict is not ``ok`` (``launcher/shim/standby.py``)."""

    reason: str
    started: bool
    detail: str


# -- the training (job log) ---------------------------------------------------------------------


class Progress(TypedDict, total=False):
    """``progress``: a step done (``report_step`` may add the caller's own fields)."""

    step: int
    rank: int
    loss: float
    step_time: float
    peer_copy_s: float | None
    durable: str  # the memory tiers' durable commit: its directory


class TierFallback(TypedDict, total=False):
    """``tier_fallback``: a memory-tier restore passed over a source (a snapshot that failed its
    digest, a layout that cannot be resharded, a restored state that failed the caller's
    check) and took the next (``then``)."""

    step: int | None
    tier: str
    reason: str
    then: str
    rank: int


class Checkpoint(TypedDict, total=False):
    """``checkpoint``: a save committed (the training: ``step``, and ``save_s``, the seconds
    its saves since the last such event blocked training); a newer complete checkpoint the
    launcher found (``step``, ``layout``, ``path``)."""

    step: int
    save_s: float
    layout: str
    path: str


class TrainingResume(TypedDict, total=False):
    """``resume`` of the training: it started or resumed (``iteration``, ``level`` ... after an
    in-process restart)."""

    step: int
    fresh: bool
    rank: int
    world_size: int
    node: str | None
    virtual_dp: int
    tier: str | None
    restart: str | None  # TORCHELASTIC_RESTART_COUNT
    requeue: str | None  # SLURM_RESTART_COUNT
    iteration: int
    level: str | None
    source_state: str  # memory | disk | fresh
    lost_ranks: list[int] | None  # initial ranks no longer active
    lost_nodes: list[str] | None
    standby_nodes: list[str] | None  # in-process hot spares (--inprocess --spares) waiting


class Recovered(TypedDict, total=False):
    """``recovered``: the first step done after an in-process restart."""

    step: int
    iteration: int
    world_size: int


class StepTiming(TypedDict, total=False):
    """``step_timing``: per-node step times, for the straggler detector."""

    step: int
    steps: int
    world_size: int
    step_s: float
    cost_s: float
    timing: str  # nvrx-cupti | sections
    nodes: dict[str, Any]


class Stopped(TypedDict, total=False):
    """``stopped``: the training saved and stopped on a signal."""

    step: int
    signal: int
    loss: float


class ConfigErrorEvent(TypedDict, total=False):
    """``config_error``: a configuration error no retry can fix (``resilient_slurm/fatal.py``);
    the launcher ends the job with it."""

    message: str
    rank: int
    node: str


class Complete(TypedDict, total=False):
    """``complete``: the training finished."""

    step: int
    digest: str
    loss: float
    iteration: int

"""The payload of every event kind: one ``TypedDict`` per kind (or per shape, where one kind
is written in two shapes, as ``verdict`` is by a hook and by the launcher). The emitters build
their fields through these (``log.emit(EventKind.BLAME, **Blame(cycle=...))``), so mypy checks
each field's name and type where it is written; :data:`resilient_slurm.events.PAYLOADS` maps
each :class:`~resilient_slurm.events.EventKind` to its types, and tests/test_docs_tables.py
checks that docs/events.md names every field. This module: the hooks' and the launcher's;
:mod:`resilient_slurm.payloads_job`: what the job's steps write (the node shim, the training).

Every field is optional (``total=False``): a field whose value is None is left out of the line.
The common fields (``ts``, ``time``, ``kind``, ``source``, and the log's defaults ``node``,
``job``) are the :class:`~resilient_slurm.events.EventLog`'s, not listed here. This module
imports nothing of the project, so every writer (the hooks included) may import it.
"""

from __future__ import annotations

from typing import Any, TypedDict

# -- the hooks (node log) -----------------------------------------------------------------------


class NodeAction(TypedDict, total=False):
    """``drain``, ``reboot``, ``resume`` (the hooks, node log)."""

    reason: str  # the drain reason (``rhc:XID79 gpu3 +1``)
    cause: str
    previous_state: str


class Precursor(TypedDict, total=False):
    """``precursor``: a check found a precursor of a failure on the node (``hooks/precursor.py``):
    still usable; ``action``: ``published`` (a job runs there: in the verdict file, for its
    launcher), ``drain`` (no job runs there: drained for repair)."""

    codes: list[str]
    devices: list[str]
    evidence: list[dict[str, Any]]  # the precursor results
    action: str
    cause: str


class HookVerdict(TypedDict, total=False):
    """``verdict`` of a prolog, epilog or health run (node log)."""

    status: str  # ok | warn | fail | unknown
    check: str | None
    code: str | None
    reason: str
    evidence: list[dict[str, Any]] | None  # the failing results
    simulated: bool
    check_set: str
    duration_s: float
    results: int
    job_exit_code: int | None  # the epilog's: the job's exit code
    precursors: list[str] | None  # precursor codes (hooks/precursor.py)


class HookNote(TypedDict, total=False):
    """``hook_error`` (a configuration the hook needs is bad), ``health_yielded`` (a health run
    gave way to a starting job), ``health_skipped`` (another health run holds the lock)."""

    cause: str


class DrainSkipped(TypedDict, total=False):
    """``drain_skipped``: unhealthy, but the node is already drained (``cause`` says by whom)."""

    reason: str
    cause: str


class ActionFailed(TypedDict, total=False):
    """``action_failed``: a Slurm call of the hook failed."""

    cause: str  # Slurm's message
    status: str  # the run's status


class Hold(TypedDict, total=False):
    """``hold``: a failing check now keeps the node drained until it passes again."""

    check: str | None
    code: str | None
    device: Any
    gpus: Any
    once: bool | None
    until: str  # what releases it, in words


class HoldReleased(TypedDict, total=False):
    """``hold_released``: a hold ended (its check passed, a reboot, an admin)."""

    check: str | None
    code: str | None
    cause: str
    by: str  # hook | admin


class FleetGuard(TypedDict, total=False):
    """``fleet_guard``: many nodes fail alike: this one is kept up, not drained."""

    cause: str  # the code
    same: int
    total: int
    recent: int
    why: str
    reason: str
    undone: bool  # True: our drain of this node was undone


class Repair(TypedDict, total=False):
    """``repair``: a step of the repair loop's ladder taken on a node (``resilient-slurm
    repair``: reboot, replace, power_up, isolate, ...; the node's health program: reset_gpu)."""

    node: str
    step: str  # restart_app | reset_gpu | reboot | replace | power_up | isolate
    cause: str  # the failure's code (XID79)
    reason: str  # the drain reason the step left (``rhc:XID79 gpu3 [reboot]``)
    why: str
    repair_class: str
    ladder: list[str]


class RepairBudget(TypedDict, total=False):
    """``repair_budget``: nodes held back from a reboot or replacement by the budgets."""

    held: list[str]
    in_progress: int
    last_hour: int
    why: str


class Validation(TypedDict, total=False):
    """``validation``: the return-to-service validation of a node drained by us (started,
    passed or failed)."""

    outcome: str  # started | passed | failed
    status: str  # the validation run's status (ok | warn | fail | unknown)
    codes: list[str]
    reason: str
    duration_s: float


# -- the launcher (job log) -------------------------------------------------------------------


class LaunchVerdict(TypedDict, total=False):
    """``verdict`` the launcher ends with (job log)."""

    verdict: str
    exit_code: int
    message: str
    cycles: int
    requeues: int
    restart_count: int
    committed_step: int | None
    fit: dict[str, object]  # cannot-fit: the partition check
    excluded: list[str]
    wanted: str


class Fault(TypedDict, total=False):
    """``fault``: the launcher's (``type``: signal, cycle-failed, node-flagged, shared) or the
    fault injector's (``type``: exception, hang, sigkill, node, slow, ...)."""

    type: str
    signal: str
    rc: int
    step: int | None
    committed_step: int | None
    detail: str
    node: str | None
    state: str  # node-flagged: Slurm's state of the node
    rank: int
    index: int
    pid: int
    factor: float


class Blame(TypedDict, total=False):
    """``blame``: what a failed cycle's evidence blamed."""

    cycle: int
    blamed: dict[str, list[str]] | None  # node -> reasons
    strikes: dict[str, int] | None  # node -> strikes after this cycle
    shared_fault: str | None
    evidence: list[dict[str, object]]


class Recovery(TypedDict, total=False):
    """``recovery``: an elastic relaunch on the survivors (a restart of the cycle)."""

    by: str
    nodes: list[str]
    excluded: list[str]
    cycle: int


class Requeue(TypedDict, total=False):
    """``requeue``: the job is requeued (then ``done``/``warning`` when an update failed)."""

    reason: str
    excluded: list[str]
    readmitted: list[str] | None
    restart_count: int
    requeues: int
    fit: dict[str, object]
    done: bool
    warning: str
    took_s: float  # a time-limit requeue: seconds its call took (a stalled controller: more)


class StopCycle(TypedDict, total=False):
    """``stop_cycle``: the launcher stopped a running cycle (``signalled``: False when the
    step signal was refused)."""

    reason: str
    signalled: bool


class Evacuate(TypedDict, total=False):
    """``evacuate``: the launcher moves the job off a node whose hooks publish a precursor
    (``launcher/recovery/evacuate.py``). ``outcome``: ``stopping`` (a healthy spare waits: the step
    stops, the spare takes the node's place), ``no spare`` (the job goes on there; a fault or
    the next checkpoint decides), ``spare busy`` (..., no healthy standby now)."""

    node: str
    codes: list[str]
    outcome: str
    spares: list[str] | None  # the spare that takes the node's place
    detail: str


class LaunchStart(TypedDict, total=False):
    """``launch_start``: the batch script started (first run or after a requeue)."""

    restart_count: int  # Slurm's
    spares: list[str] | None
    requeues: int  # the launcher's own
    pid: int
    allocation: list[str]
    nodes: list[str]
    excluded: list[str]
    nvrx: str | None
    min_nodes: int
    max_requeues: int
    kill_wait: float
    end_time: float | None  # the job's time limit ends it then (epoch s); None: unknown
    committed_step: int | None


class CycleStart(TypedDict, total=False):
    """``cycle_start``: one srun of ft_launcher on every node started."""

    cycle: int
    nodes: list[str]
    endpoint: str
    rdzv_id: str
    committed_step: int | None
    argv: list[str]
    nproc_per_node: str


class CycleEnd(TypedDict, total=False):
    """``cycle_end``: the cycle's srun ended."""

    cycle: int
    rc: int
    stopped: str | None  # why the launcher stopped it
    duration_s: float
    straggler_ratio_max: float | None
    node_rc: dict[str, Any]  # node -> its shim's exit code


class Exclude(TypedDict, total=False):
    """``exclude``: a blamed node leaves the job."""

    node: str
    mode: str  # elastic | spare
    survivors: list[str]
    reason: list[str]


class ExclusionReview(TypedDict, total=False):
    """``exclusion_review``: before a requeue, exclusions readmitted or renewed."""

    readmitted: dict[str, str] | None  # node -> why it is back
    renewed: dict[str, str] | None  # node -> what re-confirmed it
    ttl_s: float | None


class LeftOut(TypedDict, total=False):
    """``left_out``: --inprocess: a bad node level 0 already left out; the step goes on."""

    node: str
    by: str
    reason: str


class Release(TypedDict, total=False):
    """``release``: blamed nodes given back to Slurm (``done`` False: not, and why)."""

    nodes: list[str]
    done: bool
    reason: str
    allocation: list[str]  # what the job kept


class Spare(TypedDict, total=False):
    """``spare``: a healthy standby swapped in for a blamed node; without ``node``: blamed
    nodes no healthy spare was left for."""

    out: str | None
    node: str | None
    reason: list[str]
    health: str
    spares_left: list[str]
    skipped: dict[str, str] | None  # standby -> why it was not used
    unswapped: list[str]
    cycle: int
    via: str  # "standby": NVRx promoted a running standby in the same step (no new cycle)


class VerdictUnread(TypedDict, total=False):
    """``verdict_unread``: the hooks' published verdict of ``nodes`` (node -> why) could not
    be read, here or on the node, for ``purpose`` (``blame``, ``spares``)."""

    pattern: str
    nodes: dict[str, str]
    purpose: str
    cycle: int


class NoProgressSignal(TypedDict, total=False):
    """``no_progress_signal``: no way to see progress: the no-progress verdict is off."""

    detail: str


class Straggler(TypedDict, total=False):
    """``straggler``: a node is slower than its peers (launcher/recovery/straggler.py)."""

    action: str
    factor: float
    window: int
    node: str
    ratio: float
    steps: int
    first_step: int
    last_step: int
    compute_s: float
    median_s: float
    wait_s: float
    median_wait_s: float
    evidence: str


class StragglerCause(TypedDict, total=False):
    """``straggler_cause``: the hooks' verdict for a straggler (``drained``: they found a cause)."""

    node: str
    drained: bool
    cause: str | None
    detail: str

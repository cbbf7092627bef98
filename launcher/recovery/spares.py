"""Hot spares (``resilient-launch --spares K``): train on N of the allocation's N+K nodes and
swap a healthy standby in for a blamed node, inside the allocation.

Contract:

* :func:`split` picks the training nodes once per batch script run: the allocation's first
  N usable nodes in allocation order, the batch host always among them (it cannot leave the
  allocation); the other usable nodes stand by, idle (no task runs there).
* After a failed cycle, the supervisor's blame names the nodes at fault. :func:`choose` pairs
  each blamed training node with the first standby whose health (:func:`health`) is good: a
  **fresh published verdict ``ok``** from the hooks (``--verdict-path``; ``warn``, ``fail``,
  ``unknown``, a stale or missing verdict never qualify: fail closed) and Slurm calling the
  node available. A spare that does not qualify stays a standby (it may be healthy later)
  and is named, with why, in the ``spare`` event.
* A swapped-in spare takes the blamed node's place in the node list (the same world size:
  the same number of ranks, so the script's math is unchanged); the blamed node is excluded
  and given back to Slurm as an elastic relaunch would. The spare's ranks restore from the
  peers' tier-2 copies (``resilient_slurm.checkpoint``), the survivors' from their node
  memory (tier 1).
* Blamed nodes with no spare left for them fall back to the launcher's behaviour without
  spares: the policy shrinks (``--min-nodes``) or requeues.

Nothing here starts processes; :func:`health` reads the published verdicts (the file, or on
the node through ``evidence.verdicts``) and asks Slurm about all spares in one batched query.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from resilient_slurm.events import EventKind, EventLog, Spare
from resilient_slurm.launcher.recovery import evidence
from resilient_slurm.slurm import SlurmBackend, SlurmError


class SpareError(ValueError):
    """A ``--spares`` value the allocation cannot honour (a usage error)."""


def check(spares: int, allocated: int, min_nodes: int | None) -> int:
    """The training size N for ``spares`` standbys in an allocation of ``allocated`` nodes.

    Raises :class:`SpareError` (exit 2) when ``spares`` < 0, when it leaves no training
    node, or when ``--min-nodes`` asks for more nodes than the training runs on."""
    if spares < 0:
        raise SpareError(f"--spares {spares}: must be >= 0")
    train = allocated - spares
    if train < 1:
        raise SpareError(f"--spares {spares} leaves {max(train, 0)} training node(s) in an "
                         f"allocation of {allocated}: at least 1 must train (ask sbatch "
                         f"--nodes={spares + 1} or more)")
    if min_nodes is not None and min_nodes > train:
        raise SpareError(f"--min-nodes {min_nodes} > {allocated} allocated node(s)"
                         if not spares else f"--min-nodes {min_nodes} > {train} training "
                         f"node(s) ({allocated} allocated - {spares} spare(s))")
    return train


def split(usable: Sequence[str], train: int, batch: str | None) -> tuple[list[str], list[str]]:
    """``(training nodes, standbys)``: the first ``train`` of ``usable`` (allocation order),
    with ``batch`` among them when it is usable; the rest stand by."""
    chosen: list[str] = [batch] if batch is not None and batch in usable and train > 0 else []
    for n in usable:
        if len(chosen) >= train:
            break
        if n not in chosen:
            chosen.append(n)
    keep = set(chosen)
    return [n for n in usable if n in keep], [n for n in usable if n not in keep]


@dataclass(frozen=True)
class Health:
    ok: bool
    why: str  # "verdict ok, IDLE" or why it does not qualify


def judge(verdict_status: str | None, slurm_state: str | None, available: bool) -> Health:
    """One spare's fitness from its fresh published verdict's status (None: none fresh) and
    Slurm's view (None: the controller did not answer). Only ``ok`` and available qualify."""
    if verdict_status is None:
        return Health(False, "no fresh health verdict from the hooks")
    if verdict_status != "ok":
        return Health(False, f"health verdict {verdict_status}")
    if slurm_state is None:
        return Health(False, "Slurm did not answer about the node")
    if not available:
        return Health(False, f"Slurm: {slurm_state}")
    return Health(True, f"verdict ok, Slurm {slurm_state}")


def health(slurm: SlurmBackend, nodes: Sequence[str], verdict_path: str, since: float,
           max_age: float, job_id: int, env: Mapping[str, str], out_dir: str,
           timeout: float, unread: dict[str, str] | None = None) -> dict[str, Health]:
    """Each standby's :class:`Health` now. No ``verdict_path``: none qualifies (the hooks'
    verdict is what gates a spare). ``unread`` gets node -> why for each verdict that could
    not be read (``evidence.verdicts``); that node's ``why`` says so."""
    if not nodes:
        return {}
    lost: dict[str, str] = {}
    found = evidence.verdicts(verdict_path, nodes, since, max_age, job_id, env, out_dir,
                              timeout, lost) if verdict_path else {}
    if unread is not None:
        unread.update(lost)
    try:
        seen = slurm.nodes_in(list(nodes), timeout=timeout)  # one query for every standby
    except SlurmError:
        seen = {}
    out: dict[str, Health] = {}
    for n in nodes:
        v, node = found.get(n), seen.get(n)
        out[n] = judge(v.status if v is not None else None,
                       node.describe() if node is not None else None,
                       node is not None and node.available)
        if n in lost:
            out[n] = Health(False, f"its health verdict could not be read ({lost[n]})")
    return out


@dataclass(frozen=True)
class Swap:
    out: str  # the blamed training node
    spare: str  # the standby that takes its place
    why: tuple[str, ...]  # blame's reasons for ``out``
    spare_health: str


@dataclass
class Choice:
    swaps: list[Swap] = field(default_factory=list)
    unswapped: list[str] = field(default_factory=list)  # blamed, no healthy spare left
    skipped: dict[str, str] = field(default_factory=dict)  # standby -> why it was not used
    unread: dict[str, str] = field(default_factory=dict)  # standby -> why its verdict was unread

    def nodes(self, survivors_in_order: Sequence[str], before: Sequence[str]) -> list[str]:
        """The next cycle's nodes: ``before`` with each swapped node replaced in place by its
        spare, unswapped blamed nodes dropped (``survivors_in_order``: ``before`` less the
        blamed)."""
        into = {s.out: s.spare for s in self.swaps}
        keep = set(survivors_in_order)
        return [into.get(n, n) for n in before if n in keep or n in into]


def choose(blamed: Mapping[str, Sequence[str]], standby: Sequence[str],
           fit: Mapping[str, Health]) -> Choice:
    """Pair blamed nodes (sorted by name) with healthy standbys (in standby order)."""
    c = Choice()
    free = [n for n in standby if fit.get(n, Health(False, "not checked")).ok]
    for n in standby:
        if n not in free:
            c.skipped[n] = fit.get(n, Health(False, "not checked")).why
    for node in sorted(blamed):
        if free:
            spare = free.pop(0)
            c.swaps.append(Swap(node, spare, tuple(blamed[node]), fit[spare].why))
        else:
            c.unswapped.append(node)
    return c


def for_blamed(slurm: SlurmBackend, standby: Sequence[str], blamed: Mapping[str, Sequence[str]],
               cfg: evidence.EvidenceSettings, job_id: int, env: Mapping[str, str], cycle_dir: str
               ) -> Choice | None:
    """Healthy standbys for the blamed nodes (None: no standby, or nothing blamed); the
    on-node checks write under ``cycle_dir/spares``."""
    if not standby or not blamed:
        return None
    unread: dict[str, str] = {}
    fit = health(slurm, standby, cfg.verdict_path, time.time(), cfg.verdict_max_age, job_id,
                 env, os.path.join(cycle_dir, "spares"), cfg.health_timeout, unread)
    found = choose(blamed, standby, fit)
    found.unread = unread
    return found


def nvrx_note(version: str | None, native: bool = False) -> str:
    """What ``--spares`` asks of the installed NVRx (the dry-run plan and docs/launcher.md);
    ``native``: it has hot spares of its own (``launcher/shim/standby.py``)."""
    if native:
        return (f"nvidia-resiliency-ext {version or '?'}: NVRx's own standbys, gated: one step "
                "on all N+K nodes, ft_launcher --nnodes=N:N+K, a standby's agent runs only "
                "while its node's verdict is ok; NVRx promotes one in its next rendezvous "
                "round (no new cycle)")
    return (f"nvidia-resiliency-ext {version or '?'}: ft_launcher --nnodes=N on the N "
            "training nodes only; the K standbys run nothing until resilient-launch swaps "
            "one in (a new cycle, same world size; this NVRx has no hot spares of its own)")


def commit(log: EventLog, standby: list[str], swap: Choice | None, cycle: int) -> dict[str, str]:
    """The next cycle runs with ``swap``: one ``spare`` event per swap (which node out, which
    spare in, why), the spares used leave ``standby`` (in place); then :func:`unused`.
    Returns swapped-out node -> ``"spare"`` (the mode of its ``exclude`` event)."""
    if swap is None:
        return {}
    for s in swap.swaps:
        standby.remove(s.spare)
        log.emit(EventKind.SPARE, **Spare(
            out=s.out, node=s.spare, reason=list(s.why), health=s.spare_health,
            spares_left=list(standby), skipped=swap.skipped or None, cycle=cycle))
    unused(log, standby, swap, cycle)
    return {s.out: "spare" for s in swap.swaps}


def unused(log: EventLog, standby: list[str], swap: Choice | None, cycle: int) -> None:
    """A ``spare`` event without ``node`` naming the blamed nodes no healthy spare was left
    for, with why each standby was skipped: also when the job then requeues or stops instead
    of going on (no swap is made then)."""
    if swap is not None and swap.unswapped:
        log.emit(EventKind.SPARE, **Spare(
            out=None, node=None, unswapped=swap.unswapped, skipped=swap.skipped or None,
            spares_left=list(standby), cycle=cycle,
            reason=["no healthy spare left: shrink (--min-nodes) or requeue"]))

"""Exclusions come back, and a requeue is only asked for when the job can still start.

Reviewed before every requeue (the moment ``ExcNodeList`` is rewritten), never on a watch tick:

* **readmission**: an excluded node that Slurm calls available and whose published health
  verdict is ``ok`` and newer than its exclusion is usable again. The verdict is read where it
  can be read: the file itself when this host sees it (shared storage, or this node's own),
  else, for an excluded node still in the allocation, on that node through one ``srun
  --overlap`` that only reads (``evidence.verdicts``: the hooks' verdict directory is local
  to each node and root-owned, so the batch host cannot see another node's file). A node
  outside the allocation (released, or excluded by an earlier run) has no readable verdict
  from here: it comes back by expiry.
* **expiry**: an exclusion older than ``ttl`` seconds (``--exclusion-ttl``; 0: never) ends
  unless something re-confirms it: Slurm still reports the node drained, down, failing or not
  responding, or a verdict newer than the exclusion says ``fail`` or ``unknown``. A
  re-confirmed exclusion starts a new TTL. A node Slurm did not answer about is neither
  readmitted nor expired (unknown is never ok).
* **fit**: before the requeue, one query of the job's partition (``sinfo -h -N -p PART``; and
  of its reservation, if any) tells whether the request (the job's original node count) can
  still be met outside every exclusion, ours and the user's. If it cannot, the job would pend
  forever: the launcher ends with the ``cannot-fit`` verdict instead (exit 6). A query that
  fails says so and the requeue goes ahead (``Fit.ok`` None).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from resilient_slurm import verdict_file
from resilient_slurm.events import EventKind, EventLog, ExclusionReview, Release
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.recovery import evidence, ledger
from resilient_slurm.slurm import Node, SlurmBackend, SlurmError
from resilient_slurm.status import FAIL, OK, UNKNOWN

DEFAULT_TTL_S = 12 * 3600.0


@dataclass
class Review:
    readmitted: dict[str, str] = field(default_factory=dict)  # node -> why it is back
    renewed: dict[str, str] = field(default_factory=dict)  # node -> what re-confirmed it


def review(excluded_at: Mapping[str, float], states: Mapping[str, Node],
           verdicts: Mapping[str, verdict_file.Verdict | None], now: float,
           ttl: float) -> Review:
    """Which exclusions end (readmitted) and which expired ones hold (renewed); pure.

    ``states``: Slurm's view of the excluded nodes (a node missing: not known now);
    ``verdicts``: the latest published verdict per node, None where none could be read."""
    out = Review()
    for node, at in sorted(excluded_at.items()):
        st = states.get(node)
        v = verdicts.get(node)
        if st is None:
            continue
        fresh = v if v is not None and v.ts > at else None
        if st.available and fresh is not None and fresh.status == OK:
            out.readmitted[node] = (f"healthy since its exclusion: verdict ok at "
                                    f"{fresh.ts:.0f}, slurm state {st.describe()}")
            continue
        if ttl <= 0 or now - at < ttl:
            continue
        if not st.available:
            out.renewed[node] = f"slurm still reports {st.describe()}"
        elif fresh is not None and fresh.status in (FAIL, UNKNOWN):
            out.renewed[node] = (f"health verdict {fresh.status} at {fresh.ts:.0f}: "
                                 + (", ".join(fresh.codes) or "no code"))
        else:
            out.readmitted[node] = (f"exclusion expired after {ttl:g}s (--exclusion-ttl) "
                                    "and nothing re-confirmed it")
    return out


def reconsider(slurm: SlurmBackend, led: ledger.Ledger, verdict_path: str,
               alloc: plan.Allocation, env: Mapping[str, str], out_dir: str, timeout: float,
               ttl: float, log: EventLog | None = None,
               query_timeout: float | None = None) -> Review:
    """Review ``led``'s exclusions now and apply the outcome to it: readmitted nodes leave it
    (clean slate), renewed ones start a new TTL (an ``exclusion_review`` event in ``log``).
    Slurm is asked about the excluded nodes only; verdicts are read as ``latest_verdicts``
    says; ``query_timeout``: the node query's (None: the backend's)."""
    if not led.excluded:
        return Review()
    now = time.time()
    states = node_states(slurm, sorted(led.excluded), query_timeout)
    got = latest_verdicts(verdict_path, states, alloc.nodes, alloc.job_id, env, out_dir,
                          timeout)
    r = review({n: led.excluded_at.setdefault(n, now) for n in sorted(led.excluded)}, states,
               got, now, ttl)
    for node in r.renewed:
        led.excluded_at[node] = now
    for node in r.readmitted:
        led.readmit(node)
    if log is not None and (r.renewed or r.readmitted):
        log.emit(EventKind.EXCLUSION_REVIEW, **ExclusionReview(
            readmitted=r.readmitted or None, renewed=r.renewed or None, ttl_s=ttl))
    return r


def user_excluded(slurm: SlurmBackend, alloc: plan.Allocation) -> list[str] | None:
    """The job's own ExcNodeList, read before we ever change it (None: unknown)."""
    if alloc.restart_count > 0:
        return None  # an earlier run may have added ours already: keep all of it
    try:
        return sorted(slurm.job(alloc.job_id).excluded)
    except SlurmError:
        return None


def node_states(slurm: SlurmBackend, nodes: Iterable[str],
                timeout: float | None = None) -> dict[str, Node]:
    """Slurm's view of ``nodes`` from one batched query (``SlurmBackend.nodes_in``); a node
    the controller did not answer about is left out."""
    try:
        return slurm.nodes_in(list(nodes), timeout=timeout)
    except SlurmError:
        return {}


def latest_verdicts(pattern: str, states: Mapping[str, Node], allocation: Iterable[str],
                    job_id: int, env: Mapping[str, str], out_dir: str,
                    timeout: float) -> dict[str, verdict_file.Verdict | None]:
    """The latest published verdict of each node in ``states``: from the file where this host
    sees it, else (an available node of the ``allocation``) read on the node itself; None
    where neither works. ``pattern`` empty: none."""
    if not pattern:
        return {}
    got = {n: verdict_file.read(verdict_file.path_for(pattern, n)) for n in states}
    alloc = set(allocation)
    remote = [n for n, v in got.items() if v is None and n in alloc and states[n].available]
    if remote:
        got.update(evidence.verdicts(pattern, remote, 0.0, 0.0, job_id, env, out_dir, timeout))
    return got


@dataclass(frozen=True)
class Fit:
    ok: bool | None  # None: could not tell (the query failed or the job record lacks it)
    needed: int
    where: str = ""  # "partition P" or "partition P, reservation R"
    candidates: tuple[str, ...] = ()  # nodes there outside every exclusion
    available: int = 0  # ... of them usable now (not drained, down, not responding)
    detail: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "needed": self.needed, "where": self.where or None,
                "candidates": len(self.candidates), "available": self.available,
                "detail": self.detail or None}


def fit(slurm: SlurmBackend, job_id: int, excluded: Iterable[str], needed: int,
        user_excluded: Iterable[str] | None = None, timeout: float = 10.0) -> Fit:
    """Can ``needed`` nodes of the job's partition (and reservation) be found outside
    ``excluded`` plus the user's own exclusions (``user_excluded``; None: the job's current
    ``ExcNodeList``, as the requeue keeps it)? One job query, one partition query (one more
    for a reservation)."""
    try:
        job = slurm.job(job_id, timeout=timeout)
        parts = [p for p in job.extra.get("partition", "").split(",") if p]
        if not parts:
            return Fit(None, needed, detail="the job record names no partition")
        resv = job.extra.get("reservation", "")
        keep = set(job.excluded if user_excluded is None else user_excluded)
        out = set(excluded) | keep
        in_resv = set(slurm.reservation_nodes(resv, timeout=timeout)) if resv else None
        best: Fit | None = None
        for part in parts:
            nodes = [n for n in slurm.partition_nodes(part, timeout=timeout)
                     if n.name not in out and (in_resv is None or n.name in in_resv)]
            where = f"partition {part}" + (f", reservation {resv}" if resv else "")
            cand = Fit(len(nodes) >= needed, needed, where, tuple(sorted(n.name for n in nodes)),
                       sum(1 for n in nodes if n.available))
            if best is None or len(cand.candidates) > len(best.candidates):
                best = cand
    except SlurmError as exc:
        return Fit(None, needed, detail=f"cannot tell: {exc.message}")
    assert best is not None
    return best


def verdict_message(f: Fit, excluded: Iterable[str]) -> str:
    """The ``cannot-fit`` verdict's words."""
    return (f"the job needs {f.needed} node(s) but {f.where} has only {len(f.candidates)} "
            f"outside the exclusions ({','.join(sorted(excluded)) or '-'} and the job's own "
            "--exclude): a requeue would pend forever, so the job ends here; readmit nodes "
            "(repair them, or wait for --exclusion-ttl) or submit to a larger partition")


def release(slurm: SlurmBackend, alloc: plan.Allocation, blamed: Iterable[str],
            excluded: Iterable[str], env: Mapping[str, str], log: EventLog
            ) -> tuple[plan.Allocation, dict[str, str]]:
    """Give excluded nodes back to Slurm (shrink the running allocation), so they can be
    repaired instead of idling in this job: the allocation and the job's environment after.
    The batch host cannot leave; a refusal is recorded and the job goes on without the node
    either way."""
    batch, gone = alloc.batch_node, set(excluded)
    if batch in set(blamed):
        log.emit(EventKind.RELEASE, **Release(
            nodes=[batch], done=False, reason="the batch host cannot leave the allocation"))
    keep = [n for n in alloc.nodes if n not in gone or n == batch]
    drop = [n for n in alloc.nodes if n not in keep]
    if not drop:
        return alloc, dict(env)
    try:
        slurm.shrink(alloc.job_id, keep)
    except SlurmError as exc:
        log.emit(EventKind.RELEASE, **Release(nodes=drop, done=False, reason=str(exc)))
        return alloc, dict(env)
    log.emit(EventKind.RELEASE, **Release(nodes=drop, done=True, allocation=keep))
    return replace(alloc, nodes=tuple(keep)), plan.resized_env(env, alloc.nodes, keep)

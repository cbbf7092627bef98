"""Gathering evidence after (or during) a cycle: Slurm node states, the per-node start and
exit records of the cycle's step, torchelastic error files and the health verdicts the hooks
published for each node. No root check runs here: the launcher runs as the job's user.

Everything here reads; the verdict is ``blame.decide``'s.
"""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from resilient_slurm import verdict_file
from resilient_slurm.events import EventKind, EventLog, VerdictUnread
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.recovery import blame
from resilient_slurm.slurm import Node, SlurmBackend, SlurmError
from resilient_slurm.status import FAIL


class EvidenceSettings(Protocol):
    """What the evidence and the spares read of the supervisor's settings
    (``launcher/settings.py``'s ``SupervisorSettings``, which imports the exclusions, which
    import this module)."""

    verdict_path: str
    verdict_max_age: float
    health_timeout: float
    verdict_wait: float
    max_strikes: int
    max_blame_share: float


def node_addresses(slurm: SlurmBackend, nodes: Sequence[str]) -> dict[str, str]:
    """Each node's NodeAddr (``Node.addr`` from the seam, else DNS); "" when none is known.
    One batched query for the job's nodes (``SlurmBackend.nodes_in``), never one per node."""
    try:
        found = slurm.nodes_in(list(nodes))
    except SlurmError:
        found = {}
    addrs = {name: n.addr for name, n in found.items() if n.addr}
    for name in nodes:
        if name not in addrs:
            try:
                addrs[name] = socket.gethostbyname(name)
            except OSError:
                addrs[name] = ""
    return addrs


def node_states(slurm: SlurmBackend, nodes: Sequence[str]) -> dict[str, tuple[str, str]]:
    """node -> ("STATE+FLAGS", reason); empty when the controller does not answer. Reads the
    whole node table: only for blame after a failed cycle, never in the watch loop."""
    try:
        return {n.name: (_state_flags(n), n.reason) for n in slurm.nodes(list(nodes))}
    except SlurmError:
        return {}


def states_now(slurm: SlurmBackend, nodes: Sequence[str]) -> dict[str, str]:
    """Each node's "STATE+FLAGS" from one batched query (a node Slurm did not answer about is
    absent)."""
    try:
        return {name: _state_flags(n) for name, n in slurm.nodes_in(list(nodes)).items()}
    except SlurmError:
        return {}


def _state_flags(n: Node) -> str:
    return "+".join([n.state, *sorted(n.flags)])


def _read_records(paths: list[str]) -> dict[str, dict[str, Any]]:
    """node -> record for the node shims' JSON records among ``paths`` (unreadable ones skipped)."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and "node" in rec:
            out[str(rec["node"])] = rec
    return out


def exit_records(record_dir: str) -> dict[str, dict[str, Any]]:
    return _read_records([p for p in glob.glob(os.path.join(record_dir, "*.json"))
                          if not p.endswith(".started.json")])


def step_records(record_dir: str) -> dict[str, dict[str, Any]]:
    """The node shims' ``<node>.started.json`` records of one cycle: node -> record."""
    return _read_records(glob.glob(os.path.join(record_dir, "*.started.json")))


def step_id(record_dir: str) -> str | None:
    """This cycle's Slurm step id, as its tasks saw it (None before any task started)."""
    for rec in step_records(record_dir).values():
        sid = str(rec.get("step") or "")
        if sid.isdigit():
            return sid
    return None


def error_files(cycle_dir: str) -> dict[str, list[str]]:
    """torchelastic error files under ``<cycle>/torchelastic/<node>/``: node -> summaries."""
    out: dict[str, list[str]] = {}
    base = os.path.join(cycle_dir, "torchelastic")
    for path in glob.glob(os.path.join(base, "*", "**", "error.json"), recursive=True):
        node = os.path.relpath(path, base).split(os.sep)[0]
        try:
            with open(path, encoding="utf-8") as fh:
                msg = json.load(fh).get("message", {})
            text = msg.get("message", "") if isinstance(msg, dict) else str(msg)
        except (OSError, ValueError, AttributeError):
            text = "unreadable error file"
        out.setdefault(node, []).append(text.strip().splitlines()[-1][:200] if text else "?")
    return out


def verdicts(pattern: str, nodes: Sequence[str], since: float, max_age: float,
             job_id: int, env: Mapping[str, str], out_dir: str,
             timeout: float, unread: dict[str, str] | None = None
             ) -> dict[str, verdict_file.Verdict]:
    """Each node's published verdict, fresh ones only (time >= ``since - max_age``): read
    here where the file is visible (shared storage), else on the node itself through one
    ``srun --overlap`` that only reads (no root check runs as the user). ``unread`` gets
    node -> why for each node whose verdict could not be read at all, here or there (a stale
    verdict was read: it is not there; a node read since leaves it)."""
    got = {n: verdict_file.read(verdict_file.path_for(pattern, n)) for n in nodes}
    missing = [n for n, v in got.items() if v is None]
    why: dict[str, str] = {}
    if missing and pattern:
        found, why = _read_remote(pattern, missing, job_id, env, out_dir, timeout)
        got.update(found)
    if unread is not None:
        for n in nodes:
            if n in why:
                unread[n] = why[n]
            elif got.get(n) is not None:
                unread.pop(n, None)
    return {n: v for n, v in got.items() if v is not None and v.ts >= since - max_age}


def report_unread(log: EventLog, pattern: str, unread: Mapping[str, str], purpose: str,
                  cycle: int) -> None:
    """A ``verdict_unread`` event (and its job-log line) for the nodes whose published verdict
    could not be read for ``purpose`` (``blame``, ``spares``); nothing when there are none."""
    if unread:
        log.emit(EventKind.VERDICT_UNREAD, **VerdictUnread(
            pattern=pattern, nodes=dict(unread), purpose=purpose, cycle=cycle))


def _read_remote(pattern: str, nodes: Sequence[str], job_id: int, env: Mapping[str, str],
                 out_dir: str, timeout: float
                 ) -> tuple[dict[str, verdict_file.Verdict | None], dict[str, str]]:
    cmd = [sys.executable, "-m", "resilient_slurm.launcher.recovery.published", pattern]
    argv = plan.srun_command(nodes, [*plan.node_wrapper(out_dir), *cmd],
                             ["--overlap", f"--time={max(1, int(timeout // 60) + 1)}"], job_id)
    argv = [a.replace("--kill-on-bad-exit=1", "--kill-on-bad-exit=0") for a in argv]
    argv.insert(argv.index("--"), "--capture")
    try:
        subprocess.run(argv, env=dict(env), timeout=timeout, check=False,  # noqa: S603
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, OSError):
        pass
    recs = exit_records(out_dir)
    found = {n: verdict_file.parse(str(recs.get(n, {}).get("stdout", ""))) for n in nodes}
    return found, {n: _why_unread(recs.get(n), pattern, n) for n in nodes if found[n] is None}


def _why_unread(rec: Mapping[str, Any] | None, pattern: str, node: str) -> str:
    """Why a node's on-node read gave no verdict, from its record (``published.py``)."""
    path = verdict_file.path_for(pattern, node)
    if rec is None:
        return f"{path}: the read on the node did not report (srun failed or timed out)"
    try:
        said = json.loads(str(rec.get("stdout") or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        said = None
    if isinstance(said, dict) and isinstance(said.get("unreadable"), str):
        return said["unreadable"][:300]
    return f"{path}: not a verdict (exit {rec.get('rc')})"


def reader(cfg: EvidenceSettings, nodes: Sequence[str], since: float, job_id: int,
           env: Mapping[str, str], out_dir: str, unread: dict[str, str] | None = None
           ) -> Callable[[float | None], Mapping[str, verdict_file.Verdict]] | None:
    """The published verdicts of ``nodes`` (:func:`verdicts`) as ``read(after)``: those taken
    at ``after`` or later, or with None those fresh for a cycle begun at ``since``; None
    without a verdict path. ``unread``: as :func:`verdicts`', over every read."""
    if not cfg.verdict_path:
        return None

    def read(after: float | None) -> Mapping[str, verdict_file.Verdict]:
        return verdicts(cfg.verdict_path, nodes, since if after is None else after,
                        cfg.verdict_max_age if after is None else 0.0, job_id, env, out_dir,
                        cfg.health_timeout, unread)
    return read


def assess(slurm: SlurmBackend, nodes: Sequence[str], cycle_dir: str,
           read: Callable[[float | None], Mapping[str, verdict_file.Verdict]] | None,
           cfg: EvidenceSettings, strikes: Mapping[str, int], slow: Mapping[str, str],
           lost: Mapping[str, str] | None = None
           ) -> tuple[blame.Decision, list[blame.NodeEvidence]]:
    """Gather the evidence and judge it (:func:`blame.decide`); when that blames nobody, wait
    for the nodes' next published verdicts (:func:`await_fresh`, ``read(after)``;
    ``read(None)``: the verdicts fresh for this cycle) and judge once more."""
    def judge() -> tuple[blame.Decision, list[blame.NodeEvidence]]:
        evs = gather(slurm, nodes, cycle_dir, read(None) if read else {}, slow, lost)
        return blame.decide(evs, strikes, cfg.max_strikes, cfg.max_blame_share), evs

    return judged_after_wait(judge, read, nodes, cfg.verdict_wait)


Judged = tuple[blame.Decision, list[blame.NodeEvidence]]


def judged_after_wait(judge: Callable[[], Judged],
                      read: Callable[[float | None], Mapping[str, verdict_file.Verdict]] | None,
                      nodes: Sequence[str], wait_s: float,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> Judged:
    """``judge()``; when it blames nobody, :func:`await_fresh` for at most ``wait_s`` and judge
    again, whether or not a new verdict came: Slurm's view may have changed in the wait (the
    hooks drained the node, Slurm flagged it DOWN) also where the verdicts cannot be read."""
    decision, evs = judge()
    if not decision.blamed and read is not None and wait_s > 0:
        print(f"resilient-launch: no node to blame; waiting up to {wait_s:.0f} s for "
              "the hooks' next verdicts", flush=True)
        await_fresh(read, nodes, time.time(), wait_s, clock=clock, sleep=sleep)
        decision, evs = judge()
    return decision, evs


def await_fresh(read: Callable[[float], Mapping[str, verdict_file.Verdict]],
                nodes: Sequence[str], after: float, wait_s: float, every: float = 5.0,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> bool:
    """A failed cycle that blamed nobody: wait, at most ``wait_s``, until every node has
    published a verdict taken after the failure (``after``, wall clock; ``read(after)``: the
    verdicts at least that new) or one of them fails. A node whose GPU was lost a moment before
    its restarts ran out has no verdict saying so yet (the HealthCheckProgram runs every
    HealthCheckInterval, 30 s by default): a requeue on the older ones would requeue the job
    onto the same bad node instead of leaving it out. True when a new verdict came."""
    if wait_s <= 0 or not nodes:
        return False
    got: Mapping[str, verdict_file.Verdict] = {}

    def answered() -> bool:
        nonlocal got
        got = read(after)
        return len(got) >= len(nodes) or any(v.status == FAIL for v in got.values())

    _poll(answered, wait_s, every, clock, sleep)
    return bool(got)


def vanished(record_dir: str, nodes: Sequence[str]) -> list[str]:
    """Nodes whose launcher started, was never asked to stop and never wrote its exit record:
    after the step ended, a node that went away (its shim died with it), not yet proven."""
    recs, starts = exit_records(record_dir), step_records(record_dir)
    return [n for n in nodes
            if n in starts and n not in recs and not starts[n].get("signalled")]


def unreachable(slurm: SlurmBackend, nodes: Sequence[str], timeout: float) -> dict[str, str]:
    """Vanished ``nodes`` whose slurmd does not answer: a TCP connection to its NodeAddr and
    port (one batched query for both) refused, or not accepted within ``timeout``
    (MessageTimeout: what Slurm itself gives a daemon). node -> why. A node whose slurmd
    accepts, or whose address Slurm did not give, is not judged here (Slurm's flag decides)."""
    try:
        found = slurm.nodes_in(list(nodes))
    except SlurmError:
        return {}
    out = {}
    for n in nodes:
        node = found.get(n)
        if node is None or not node.addr or not node.port:
            continue
        try:
            socket.create_connection((node.addr, node.port), timeout=timeout).close()
        except OSError as exc:
            out[n] = (f"its launcher vanished and its slurmd at {node.addr}:{node.port} does not "
                      f"answer ({exc.strerror or type(exc).__name__} within {timeout:g} s)")
    return out


def await_lost(states_of: Callable[[Sequence[str]], Mapping[str, str]], nodes: Sequence[str],
               wait_s: float, every: float = 5.0, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Slurm's view of vanished ``nodes`` (``states_of``: one batched query, node ->
    "STATE+FLAGS"), polled every ``every`` s until each is NOT_RESPONDING, DOWN or FAIL, or
    ``wait_s`` passed: node -> the last state seen. A cycle can end before Slurm's next ping
    notices a lost node (NVRx >= 0.6 stops the survivors at once when a peer is lost; Slurm
    pings every SlurmdTimeout/3, 100 s by default): blame then finds it ALLOCATED and blames
    nobody."""
    seen: dict[str, str] = {}

    def all_flagged() -> bool:
        ask = [n for n in nodes if not _flagged(seen.get(n, ""))]
        if ask:
            now = states_of(ask)
            seen.update({n: now.get(n, "") for n in ask})
        return all(_flagged(seen[n]) for n in nodes)

    _poll(all_flagged, wait_s, every, clock, sleep)
    return seen


def _poll(done: Callable[[], bool], wait_s: float, every: float,
          clock: Callable[[], float], sleep: Callable[[float], None]) -> None:
    """Call ``done`` now and every ``every`` s until it is true or ``wait_s`` passed."""
    deadline = clock() + wait_s
    while not done() and clock() < deadline:
        sleep(every)


def _flagged(state: str) -> bool:
    words = set(state.upper().split("+"))
    return bool(words & (blame.LOST_STATES | {"NOT_RESPONDING"}))


def gather(slurm: SlurmBackend, nodes: Sequence[str], cycle_dir: str,
           found: Mapping[str, verdict_file.Verdict],
           slow: Mapping[str, str] | None = None,
           lost: Mapping[str, str] | None = None) -> list[blame.NodeEvidence]:
    """Evidence per node; ``slow``: node -> the straggler verdict's evidence, if any;
    ``lost``: node -> why it is lost (:func:`unreachable`)."""
    states = node_states(slurm, nodes)
    rec_dir = os.path.join(cycle_dir, "nodes")
    recs = exit_records(rec_dir)
    starts = step_records(rec_dir)
    errs = error_files(cycle_dir)
    out = []
    for n in nodes:
        state, reason = states.get(n, ("", ""))
        v = found.get(n)
        rc = recs.get(n, {}).get("rc")
        st = starts.get(n)
        out.append(blame.NodeEvidence(
            node=n, slurm_state=state, drain_reason=reason if "DRAIN" in state else "",
            verdict=v.status if v else "", verdict_codes=v.codes if v else (),
            started=(st is not None or n in recs) if starts or recs else None,
            signalled=bool(st and st.get("signalled")),
            exit_code=rc if isinstance(rc, int) else None, error_files=tuple(errs.get(n, ())),
            slow=(slow or {}).get(n, ""), lost=(lost or {}).get(n, "")))
    return out

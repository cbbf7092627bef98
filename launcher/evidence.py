"""Gathering evidence after (or during) a cycle: Slurm node states, exit records, training
fault events, torchelastic error files and a parallel health sweep over ``srun``.

Everything here reads; the verdict is ``blame.decide``'s.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from resilient_slurm.events import read_events
from resilient_slurm.launcher import blame, plan
from resilient_slurm.slurm import SlurmError

NODE_FAULT_TYPES = frozenset({"node", "xid", "gpu", "node_fault"})


def node_addresses(slurm: Any, nodes: Sequence[str]) -> dict[str, str]:
    """Each node's NodeAddr (``Node.addr`` from the seam, else DNS); "" when none is known."""
    addrs: dict[str, str] = {}
    try:
        for n in slurm.nodes(list(nodes)):
            if n.addr:
                addrs[n.name] = n.addr
    except SlurmError:
        pass
    for n in nodes:
        if n not in addrs:
            try:
                addrs[n] = socket.gethostbyname(n)
            except OSError:
                addrs[n] = ""
    return addrs


def node_states(slurm: Any, nodes: Sequence[str]) -> dict[str, tuple[str, str]]:
    """node -> ("STATE+FLAGS", reason); empty when the controller does not answer."""
    try:
        return {n.name: ("+".join([n.state, *sorted(n.flags)]), n.reason)
                for n in slurm.nodes(list(nodes))}
    except SlurmError:
        return {}


def exit_records(record_dir: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(record_dir, "*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and "node" in rec:
            out[str(rec["node"])] = rec
    return out


def is_node_fault(ev: Mapping[str, Any]) -> bool:
    if ev.get("kind") != "fault" or ev.get("source") == "launcher" or not ev.get("node"):
        return False
    kinds = {str(ev.get(k, "")).lower() for k in ("fault_type", "type", "fault")}
    return bool(kinds & NODE_FAULT_TYPES)


def node_faults(events_path: str, since: float) -> dict[str, list[str]]:
    """Node faults the training reported (``fault`` events naming a node) since ``since``."""
    out: dict[str, list[str]] = {}
    for ev in read_events(events_path):
        if float(ev.get("ts", 0)) >= since and is_node_fault(ev):
            what = ev.get("detail") or ev.get("xid") or ev.get("fault_type") or ev.get("type")
            out.setdefault(str(ev["node"]), []).append(f"{what} at step {ev.get('step', '?')}")
    return out


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


def health_program() -> str:
    local = os.path.join(os.path.dirname(sys.executable), "resilient-health")
    return local if os.access(local, os.X_OK) else (shutil.which("resilient-health")
                                                     or "resilient-health")


def parse_health(rec: Mapping[str, Any] | None) -> tuple[str, tuple[str, ...]]:
    """(status, reasons) from one node's ``resilient-health check --json`` record."""
    if rec is None:
        return blame.NO_ANSWER, ()
    if rec.get("rc") == 127 or rec.get("error"):
        return "", ()  # the tool is not installed there: no evidence either way
    try:
        data = json.loads(str(rec.get("stdout", "")))
    except ValueError:
        return blame.UNKNOWN, (f"unparseable output, exit {rec.get('rc')}",)
    status = str(data.get("status", "")).lower()
    if status not in (blame.HEALTHY, blame.UNHEALTHY, blame.UNKNOWN):
        status = {0: blame.HEALTHY, 1: blame.UNHEALTHY}.get(int(rec.get("rc", 3)), blame.UNKNOWN)
    reasons = tuple(f"{r.get('check')}: {r.get('reason') or r.get('code')}"
                    for r in data.get("results", []) if isinstance(r, dict)
                    and str(r.get("status", "")).lower() not in ("ok", "pass", "healthy"))
    return status, reasons


def health_argv(nodes: Sequence[str], out_dir: str, job_id: int, config: str | None,
                timeout: float) -> list[str]:
    """The sweep's srun line: every node at once, a failing node does not stop the others."""
    cmd = [health_program(), "check", "--json", *(["--config", config] if config else [])]
    argv = plan.srun_command(nodes, [*plan.node_wrapper(out_dir, {}), *cmd],
                             ["--overlap", f"--time={max(1, int(timeout // 60) + 1)}"], job_id)
    argv = [a.replace("--kill-on-bad-exit=1", "--kill-on-bad-exit=0") for a in argv]
    argv.insert(argv.index("--"), "--capture")
    return argv


def health_sweep(nodes: Sequence[str], out_dir: str, job_id: int, env: Mapping[str, str],
                 config: str | None, timeout: float) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Run ``resilient-health check --json`` on every node at once; no answer -> no-answer."""
    argv = health_argv(nodes, out_dir, job_id, config, timeout)
    try:
        subprocess.run(argv, env=dict(env), timeout=timeout, check=False,  # noqa: S603
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pass
    recs = exit_records(out_dir)
    return {n: parse_health(recs.get(n)) for n in nodes}


def gather(slurm: Any, nodes: Sequence[str], cycle_dir: str, events_path: str, since: float,
           health: Mapping[str, tuple[str, tuple[str, ...]]]) -> list[blame.NodeEvidence]:
    states = node_states(slurm, nodes)
    recs = exit_records(os.path.join(cycle_dir, "nodes"))
    faults = node_faults(events_path, since)
    errs = error_files(cycle_dir)
    out = []
    for n in nodes:
        state, reason = states.get(n, ("", ""))
        status, reasons = health.get(n, ("", ()))
        rc = recs.get(n, {}).get("rc")
        out.append(blame.NodeEvidence(
            node=n, slurm_state=state, drain_reason=reason if "DRAIN" in state else "",
            health=status, health_reasons=reasons, exit_code=rc if isinstance(rc, int) else None,
            node_faults=tuple(faults.get(n, ())), error_files=tuple(errs.get(n, ()))))
    return out

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
from collections.abc import Mapping, Sequence
from typing import Any

from resilient_slurm.launcher import blame, plan, published
from resilient_slurm.slurm import SlurmBackend, SlurmError


def node_addresses(slurm: SlurmBackend, nodes: Sequence[str]) -> dict[str, str]:
    """Each node's NodeAddr (``Node.addr`` from the seam, else DNS); "" when none is known."""
    addrs: dict[str, str] = {}
    try:
        for n in slurm.nodes(list(nodes)):
            if n.addr:
                addrs[n.name] = n.addr
    except SlurmError:
        pass
    for name in nodes:
        if name not in addrs:
            try:
                addrs[name] = socket.gethostbyname(name)
            except OSError:
                addrs[name] = ""
    return addrs


def node_states(slurm: SlurmBackend, nodes: Sequence[str]) -> dict[str, tuple[str, str]]:
    """node -> ("STATE+FLAGS", reason); empty when the controller does not answer."""
    try:
        return {n.name: ("+".join([n.state, *sorted(n.flags)]), n.reason)
                for n in slurm.nodes(list(nodes))}
    except SlurmError:
        return {}


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
             timeout: float) -> dict[str, published.Verdict]:
    """Each node's published verdict, fresh ones only (time >= ``since - max_age``): read
    here where the file is visible (shared storage), else on the node itself through one
    ``srun --overlap`` that only reads (no root check runs as the user)."""
    got = {n: published.read(published.path_for(pattern, n)) for n in nodes}
    missing = [n for n, v in got.items() if v is None]
    if missing and pattern:
        got.update(_read_remote(pattern, missing, job_id, env, out_dir, timeout))
    return {n: v for n, v in got.items() if v is not None and v.ts >= since - max_age}


def _read_remote(pattern: str, nodes: Sequence[str], job_id: int, env: Mapping[str, str],
                 out_dir: str, timeout: float) -> dict[str, published.Verdict | None]:
    cmd = [sys.executable, "-m", "resilient_slurm.launcher.published", pattern]
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
    return {n: published.parse(str(recs.get(n, {}).get("stdout", ""))) for n in nodes}


def gather(slurm: SlurmBackend, nodes: Sequence[str], cycle_dir: str,
           found: Mapping[str, published.Verdict],
           slow: Mapping[str, str] | None = None) -> list[blame.NodeEvidence]:
    """Evidence per node; ``slow``: node -> the straggler verdict's evidence, if any."""
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
            slow=(slow or {}).get(n, "")))
    return out

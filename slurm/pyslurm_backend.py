"""The pyslurm backend: used when pyslurm imports and matches the running Slurm's version.

It reads through pyslurm's objects API and falls back to the CLI backend for the actions
pyslurm does not expose the same way (reboot ASAP, ExcNodeList update, submit). CI cannot build
a matching pyslurm (see README), so its real-cluster tests are skipped there with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from resilient_slurm.slurm.cli_backend import (
    CliSlurm,
    _check_name,
    _job_id,
    _words,
    sanitize_reason,
    split_state,
)
from resilient_slurm.slurm.hostlist import expand
from resilient_slurm.slurm.model import Job, Node, SlurmError
from resilient_slurm.slurm.parse import _end_time


class PySlurm(CliSlurm):
    """Reads nodes and jobs and drains/resumes/requeues through pyslurm."""

    name = "pyslurm"

    def __init__(self, module: Any, cli: CliSlurm) -> None:
        super().__init__(conf=cli.conf, timeout=cli.timeout, env=cli.env)
        self.search = cli.search
        self.mod = module

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - pyslurm raises RPCError and friends
            raise SlurmError(f"pyslurm: {exc}") from None

    def nodes(self, names: Iterable[str] | None = None) -> list[Node]:
        loaded = self._call(self.mod.Nodes.load)
        result = []
        for name, n in dict(loaded).items():
            base, flags = split_state(_words(getattr(n, "state", ""))
                                      + _words(getattr(n, "state_flags", None) or []))
            result.append(Node(str(name), base, flags,
                               str(getattr(n, "reason", "") or ""),
                               str(getattr(n, "reason_user", "") or ""),
                               str(getattr(n, "address", "") or "")))
        if names is None:
            return result
        by_name = {n.name: n for n in result}
        wanted = list(names)
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise SlurmError(f"unknown node(s): {','.join(unknown)}")
        return [by_name[n] for n in wanted]

    def job(self, job_id: int | str, timeout: float | None = None) -> Job:
        jid = _job_id(job_id)
        j = self._call(self.mod.Job.load, jid)
        try:
            return self._job(jid, j)
        except Exception as exc:  # noqa: BLE001 - any unreadable field: one clear SlurmError
            raise SlurmError(f"job {jid}: unreadable record ({exc})") from None

    def _job(self, jid: int, j: Any) -> Job:
        nodes = getattr(j, "allocated_nodes", None) or getattr(j, "nodes", None) or ""
        excluded = getattr(j, "excluded_nodes", None) or ""
        required = getattr(j, "required_nodes", None) or ""
        return Job(
            job_id=jid,
            name=str(getattr(j, "name", "") or ""),
            state=str(getattr(j, "state", "UNKNOWN")).upper(),
            nodes=tuple(expand(nodes)) if nodes else (),
            restart_count=int(getattr(j, "requeue_count", 0) or 0),
            excluded=tuple(expand(excluded)) if excluded else (),
            requeue=bool(getattr(j, "is_requeueable", False)),
            reason=str(getattr(j, "state_reason", "") or ""),
            held=int(getattr(j, "priority", 1) or 0) == 0,
            required=tuple(expand(required)) if required else (),
            end_time=_end_time(getattr(j, "end_time", None)),
        )

    def drain(self, node: str, reason: str) -> None:
        _check_name(node)
        n = self.mod.Node(state="DRAIN", reason=sanitize_reason(reason))
        self._call(self.mod.Node(node).modify, n)

    def resume(self, node: str) -> None:
        _check_name(node)
        self._call(self.mod.Node(node).modify, self.mod.Node(state="RESUME"))

    def requeue(self, job_id: int | str, hold: bool = False,
                timeout: float | None = None) -> None:
        self._call(self.mod.Job(_job_id(job_id)).requeue, hold)

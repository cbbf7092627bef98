"""The Slurm CLI backend: ``scontrol``/``sinfo``/``squeue``/``sbatch`` with argv lists and timeouts.

Works against Slurm 22.05 and newer. Node state comes from JSON (``scontrol --json show nodes``
where the installed Slurm has it, else ``sinfo --json``); job detail from ``scontrol -o show
job`` (one line per job, same on every version). Every failure raises ``SlurmError`` carrying
Slurm's message: a dead controller, an unknown node or job, or a command that hangs.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from resilient_slurm import proc
from resilient_slurm.slurm.hostlist import compress, expand
from resilient_slurm.slurm.model import NODE_FLAGS, Job, Node, SlurmError

DEFAULT_SEARCH = "/usr/bin:/usr/local/bin:/opt/slurm/bin:/usr/sbin:/usr/local/sbin"
_SAFE_REASON = re.compile(r"[^A-Za-z0-9 _.,:;/@+=#()\[\]-]")


def sanitize_reason(text: str, limit: int = 64) -> str:
    """A reason Slurm stores verbatim: printable, no quotes or newlines, bounded."""
    cleaned = _SAFE_REASON.sub("_", " ".join(str(text).split()))
    return cleaned[:limit] or "unspecified"


class CliSlurm:
    """Reads and changes Slurm through its command-line tools."""

    name = "cli"

    def __init__(
        self,
        conf: str | None = None,
        timeout: float = 15.0,
        bin_dir: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.conf = conf
        self.timeout = timeout
        base = dict(os.environ if env is None else env)
        if conf:
            base["SLURM_CONF"] = conf
        self.env = base
        self.search = bin_dir or (base.get("PATH", "") + ":" + DEFAULT_SEARCH)
        self._version: tuple[int, int] | None = None

    # -- plumbing -------------------------------------------------------------------------
    def _run(self, argv: Sequence[str], timeout: float | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
        exe = proc.resolve(argv[0], self.search)
        if exe is None:
            raise SlurmError(f"{argv[0]} not found (searched {self.search}); install slurm-client",
                             tuple(argv))
        out = proc.run([exe, *argv[1:]], timeout or self.timeout,
                       env=self.env if env is None else env, cwd=cwd)
        if out.kind == proc.TIMEOUT:
            raise SlurmError(f"{' '.join(argv[:3])}: no answer within {out.duration_s:.1f}s "
                             "(is slurmctld running?)", tuple(argv))
        if out.kind != proc.OK:
            msg = " ".join((out.stderr.strip() or out.stdout.strip()).split()) or "failed"
            raise SlurmError(f"{' '.join(argv[:3])}: {msg}", tuple(argv), out.returncode)
        return out.stdout

    def _json(self, argv: Sequence[str]) -> dict[str, Any]:
        text = self._run(argv)
        try:
            data = json.loads(text)
        except ValueError:
            raise SlurmError(f"{' '.join(argv[:3])}: output is not JSON", tuple(argv)) from None
        errors = data.get("errors") or []
        if errors:
            first = errors[0]
            msg = first.get("description") or first.get("error") or str(first)
            raise SlurmError(f"{' '.join(argv[:3])}: {msg}", tuple(argv))
        return data

    def version(self) -> tuple[int, int]:
        """(major, minor) of the installed Slurm client tools."""
        if self._version is None:
            text = self._run(["scontrol", "--version"])
            m = re.search(r"(\d+)\.(\d+)", text)
            if not m:
                raise SlurmError(f"cannot read Slurm version from {text!r}")
            self._version = (int(m.group(1)), int(m.group(2)))
        return self._version

    # -- reading --------------------------------------------------------------------------
    def ping(self) -> bool:
        """True when the primary controller answers; SlurmError when it does not."""
        text = self._run(["scontrol", "ping"])
        if "UP" not in text:
            raise SlurmError(f"scontrol ping: {' '.join(text.split())}")
        return True

    def nodes(self, names: Iterable[str] | None = None) -> list[Node]:
        """Nodes with base state, flags and reason; ``names`` restricts (unknown -> SlurmError)."""
        if self.version() >= (23, 2):
            data = self._json(["scontrol", "--json", "show", "nodes"])
        else:
            data = self._json(["sinfo", "--json"])
        result = [_node_from_json(n) for n in data.get("nodes", [])]
        if names is None:
            return result
        wanted = list(names)
        by_name = {n.name: n for n in result}
        unknown = [n for n in wanted if n not in by_name]
        if unknown:
            raise SlurmError(f"unknown node(s): {compress(unknown)}")
        return [by_name[n] for n in wanted]

    def node(self, name: str) -> Node:
        return self.nodes([name])[0]

    def jobs(self) -> list[Job]:
        """Every job the controller still knows (pending, running, finished within MinJobAge)."""
        if self.version() >= (23, 2):
            data = self._json(["scontrol", "--json", "show", "jobs"])
        else:
            data = self._json(["squeue", "--json"])  # 22.05 lists every job it knows
        return [_job_from_json(j) for j in data.get("jobs", [])]

    def job(self, job_id: int | str) -> Job:
        """One job by id; SlurmError if the controller does not know it."""
        jid = _job_id(job_id)
        for job in self.jobs():
            if job.job_id == jid:
                return job
        raise SlurmError(f"job {jid}: no such job (unknown, or finished longer ago than MinJobAge)")

    # -- acting ---------------------------------------------------------------------------
    def drain(self, node: str, reason: str) -> None:
        self._update_node(node, "DRAIN", sanitize_reason(reason))

    def resume(self, node: str) -> None:
        """Return a drained or down node to service; a no-op for a node already in service."""
        try:
            self._update_node(node, "RESUME")
        except SlurmError as exc:
            if "Invalid node state" not in exc.message:
                raise
            current = self.node(node)
            if current.drain or current.state == "DOWN":
                raise

    def down(self, node: str, reason: str) -> None:
        self._update_node(node, "DOWN", sanitize_reason(reason))

    def reboot_asap(self, node: str, reason: str) -> None:
        """``scontrol reboot ASAP nextstate=RESUME reason=...``: drain, reboot when idle, resume."""
        _check_name(node)
        self._run(["scontrol", "reboot", "ASAP", "nextstate=RESUME",
                   f"reason={sanitize_reason(reason)}", node])

    def cancel_reboot(self, node: str) -> None:
        _check_name(node)
        self._run(["scontrol", "cancel_reboot", node])

    def requeue(self, job_id: int | str, hold: bool = False) -> None:
        self._run(["scontrol", "requeuehold" if hold else "requeue", str(_job_id(job_id))])

    def release(self, job_id: int | str) -> None:
        self._run(["scontrol", "release", str(_job_id(job_id))])

    def set_excluded(self, job_id: int | str, nodes: Iterable[str]) -> None:
        """Set a job's ``ExcNodeList`` (only while the job is pending, held or requeued)."""
        names = _checked(nodes)
        self._run(["scontrol", "update", f"JobId={_job_id(job_id)}",
                   f"ExcNodeList={compress(names) if names else ''}"])

    def set_request(self, job_id: int | str, *, required: Iterable[str] | None = None,
                    num_nodes: int | None = None) -> None:
        """Rewrite a pending or held job's request: ``ReqNodeList`` (empty: none) and an exact
        node count (``NumNodes=N-N``; a bare ``N`` would only lower the minimum)."""
        argv = ["scontrol", "update", f"JobId={_job_id(job_id)}"]
        if required is not None:
            names = _checked(required)
            argv.append(f"ReqNodeList={compress(names) if names else ''}")
        if num_nodes is not None:
            if num_nodes < 1:
                raise SlurmError(f"node count must be >= 1, got {num_nodes}")
            argv.append(f"NumNodes={num_nodes}-{num_nodes}")
        if len(argv) > 3:
            self._run(argv)

    def shrink(self, job_id: int | str, keep: Iterable[str]) -> None:
        """Release a running job's other nodes back to Slurm (``scontrol update NodeList=``).

        Slurm refuses to drop the batch host, kills the job's steps on the released nodes, and
        does not touch the job's environment: callers run later steps with explicit node lists.
        Inside a job, scontrol writes ``slurm_job_<id>_resize.{sh,csh}`` into its working
        directory; it runs in a private temporary directory, removed afterwards."""
        names = _checked(keep)
        if not names:
            raise SlurmError("a job cannot shrink to no node")
        with tempfile.TemporaryDirectory(prefix="rs-resize-") as scratch:
            self._run(["scontrol", "update", f"JobId={_job_id(job_id)}",
                       f"NodeList={compress(names)}"], cwd=scratch)

    def cancel(self, job_id: int | str, signal: str | None = None) -> None:
        argv = ["scancel"]
        if signal:
            argv.append(f"--signal={signal}")
        self._run([*argv, str(_job_id(job_id))])

    def submit(self, script: str, options: Sequence[str] = (), args: Sequence[str] = (),
               env: Mapping[str, str] | None = None) -> int:
        """``sbatch --parsable [options] script [args]``; returns the job id."""
        job_env = None
        if env is not None:
            job_env = {**dict(env), **({"SLURM_CONF": self.conf} if self.conf else {})}
        out = self._run(["sbatch", "--parsable", *options, script, *args], env=job_env)
        try:
            return int(out.strip().split(";")[0])
        except ValueError:
            raise SlurmError(f"sbatch: unexpected output {out.strip()!r}") from None

    def _update_node(self, node: str, state: str, reason: str | None = None) -> None:
        _check_name(node)
        argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        self._run(argv)


# -- parsing helpers (pure, tested without Slurm) -------------------------------------------
def _checked(nodes: Iterable[str]) -> list[str]:
    """``nodes`` as a list, every name validated (SlurmError on a bad one)."""
    names = list(nodes)
    for n in names:
        _check_name(n)
    return names


def _check_name(node: str) -> None:
    if not node or not re.fullmatch(r"[A-Za-z0-9._\-\[\],]+", node):
        raise SlurmError(f"invalid node name {node!r}")


def _job_id(job_id: int | str) -> int:
    text = str(job_id).strip()
    if not text.isdigit():
        raise SlurmError(f"invalid job id {job_id!r}")
    return int(text)


def _words(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [w for w in re.split(r"[+,\s]+", value.upper()) if w]
    return [str(w).upper() for w in value]


def split_state(words: list[str]) -> tuple[str, frozenset[str]]:
    """Base state and flags from Slurm's state words; DRAINED/DRAINING both mean DRAIN."""
    base = next((w for w in words if w not in NODE_FLAGS), "UNKNOWN")
    flags = {w for w in words if w in NODE_FLAGS}
    if flags & {"DRAINED", "DRAINING"}:
        flags = (flags - {"DRAINED", "DRAINING"}) | {"DRAIN"}
    return base, frozenset(flags)


def _node_from_json(raw: Mapping[str, Any]) -> Node:
    base, flags = split_state(_words(raw.get("state")) + _words(raw.get("state_flags")))
    return Node(
        name=str(raw.get("name", "")),
        state=base,
        flags=flags,
        reason=str(raw.get("reason") or ""),
        reason_user=str(raw.get("reason_set_by_user") or ""),
        addr=str(raw.get("address") or ""),
    )


def _num(value: Any, default: int = 0) -> int:
    """Slurm >= 23.02 wraps numbers as {"set": bool, "number": n}."""
    if isinstance(value, dict):
        return int(value.get("number", default)) if value.get("set", True) else default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _nodes_field(value: Any) -> tuple[str, ...]:
    if not value or value == "(null)":
        return ()
    return tuple(expand(str(value)))


def _exit_code(value: Any) -> int:
    """The job's return code (22.05: a number; >= 23.02: {"return_code": {...}, ...})."""
    if isinstance(value, dict) and "return_code" in value:
        return _num(value["return_code"])
    return _num(value)


# Job state flags in the order Slurm's job_state_string() reports them (what squeue's %T and
# 22.05's squeue --json show); >= 23.02 JSON lists the base state and its flags instead, e.g.
# ["COMPLETED", "COMPLETING"] while the epilog still runs.
JOB_FLAG_ORDER = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
                  "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD",
                  "SIGNALING")
JOB_BASES = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT",
             "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")


def job_state(words: Sequence[str]) -> str:
    """One state word as Slurm itself names the job: a reported flag wins over the base."""
    for flag in JOB_FLAG_ORDER:
        if flag in words:
            return flag
    return next((w for w in words if w in JOB_BASES), words[0] if words else "UNKNOWN")


def _job_from_json(raw: Mapping[str, Any]) -> Job:
    states = _words(raw.get("job_state"))
    reason = str(raw.get("state_reason") or "")
    priority = _num(raw.get("priority"), default=1)
    return Job(
        job_id=_num(raw.get("job_id")),
        name=str(raw.get("name") or ""),
        state=job_state(states),
        nodes=_nodes_field(raw.get("nodes")),
        restart_count=_num(raw.get("restart_cnt")),
        excluded=_nodes_field(raw.get("excluded_nodes")),
        requeue=bool(raw.get("requeue")),
        reason="" if reason == "None" else reason,
        held=priority == 0 or reason.startswith("JobHeld"),
        exit_code=_exit_code(raw.get("exit_code")),
        required=_nodes_field(raw.get("required_nodes")),
        extra={k: str(raw[k]) for k in ("batch_host", "comment", "partition", "user_name")
               if k in raw},
    )

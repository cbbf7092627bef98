"""The Slurm CLI backend: ``scontrol``/``sinfo``/``squeue``/``sbatch`` with argv lists and timeouts.

Works against Slurm 22.05 and newer. The node table comes from JSON (``scontrol --json show
nodes`` where the installed Slurm has it, else ``sinfo --json``); one node from ``sinfo -n NODE``
(a single-node RPC, what the hooks use); one job from ``scontrol --json show job ID``
(>= 23.02) or ``scontrol -o show job ID`` (22.05), never the whole job table. Every failure
raises ``SlurmError`` carrying Slurm's message: a dead controller, an unknown node or job, or
a command that hangs.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from resilient_slurm import proc
from resilient_slurm.slurm import version_cache
from resilient_slurm.slurm.hostlist import HostlistError, compress
from resilient_slurm.slurm.model import Job, Node, SlurmError
from resilient_slurm.slurm.parse import (
    _SINFO_BRIEF,
    _SINFO_FORMAT,
    _job_from_json,
    _job_from_oneliner,
    _job_id,
    _node_from_json,
    _nodes_field,
    _num,
    _words,
    job_records,
    node_from_brief,
    node_from_sinfo,
    parse_oneliner,
    split_state,
)

__all__ = ["CliSlurm", "_words", "sanitize_reason", "split_state"]

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
        version_file: str | None = None,
    ) -> None:
        self.conf = conf
        self.version_file = version_file
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
        """(major, minor) of the installed Slurm client tools (cached in ``version_file``,
        keyed by the scontrol binary's path and mtime, when one is given)."""
        if self._version is None and self.version_file:
            self._version = version_cache.cached(self.version_file, self.search)
        if self._version is None:
            text = self._run(["scontrol", "--version"])
            m = re.search(r"(\d+)\.(\d+)", text)
            if not m:
                raise SlurmError(f"cannot read Slurm version from {text!r}")
            self._version = (int(m.group(1)), int(m.group(2)))
            if self.version_file:
                version_cache.save(self.version_file, self.search, self._version)
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
        """One node, asking the controller about that node only.

        ``sinfo -n NAME -N -O ...`` is answered with REQUEST_NODE_INFO_SINGLE (measured with
        sdiag on 22.05), whereas ``scontrol show node NAME`` and ``sinfo --json`` fetch the
        whole node table (REQUEST_NODE_INFO) and filter it on the client.
        """
        _check_name(name)
        out = self._run(["sinfo", "-n", name, "-N", "-h", "-O", _SINFO_FORMAT])
        for line in out.splitlines():
            node = node_from_sinfo(line)
            if node is not None and node.name == name:
                return node
        raise SlurmError(f"unknown node(s): {name}")

    def nodes_in(self, names: Sequence[str], timeout: float | None = None) -> dict[str, Node]:
        """The named nodes from one query, whatever their number (``sinfo -n HOSTLIST -N``:
        two RPCs for 4 or 4,000 nodes; ``node()`` costs two per node): name -> node, a name
        the controller does not know absent. What a job asks about its own nodes."""
        wanted = _checked(names)
        out = self._run(["sinfo", "-n", compress(wanted), "-N", "-h", "-O", _SINFO_FORMAT],
                        timeout) if wanted else ""
        found = (node_from_sinfo(line) for line in out.splitlines())
        return {n.name: n for n in found if n is not None and n.name in set(wanted)}

    def nodes_brief(self) -> list[Node]:
        """Every node's name, state, reason and the time the reason was set, from one
        ``sinfo -N -h -O`` call (one node-table RPC, a line per node and partition: a node in
        two partitions appears twice). What the hooks' fleet guard reads, once per drain."""
        out = self._run(["sinfo", "-N", "-h", "-O", _SINFO_BRIEF])
        return [n for n in (node_from_brief(line) for line in out.splitlines()) if n]

    def jobs(self) -> list[Job]:
        """Every job the controller still knows (pending, running, finished within MinJobAge)."""
        if self.version() >= (23, 2):
            data = self._json(["scontrol", "--json", "show", "jobs"])
        else:
            data = self._json(["squeue", "--json"])  # 22.05 lists every job it knows
        return [_job_from_json(j) for j in data.get("jobs", [])]

    def job(self, job_id: int | str, timeout: float | None = None) -> Job:
        """One job by id, asking the controller about that job only (``scontrol --json show
        job ID`` on >= 23.02, ``scontrol -o show job ID`` on 22.05). SlurmError if the
        controller does not know it, does not answer, or answers with something unreadable."""
        jid = _job_id(job_id)
        try:
            return self._job(jid, timeout)
        except SlurmError as exc:  # name the job: scontrol's "Invalid job id specified" does not
            if str(jid) in exc.message:
                raise
            raise SlurmError(f"job {jid}: {exc.message}", exc.command, exc.returncode) from None

    def _job(self, jid: int, timeout: float | None) -> Job:
        if self.version() >= (23, 2):
            text = self._run(["scontrol", "--json", "show", "job", str(jid)], timeout)
            try:
                data = json.loads(text)
                raw = [j for j in data.get("jobs", []) if _num(j.get("job_id")) == jid]
                if raw:
                    return _job_from_json(raw[0])
            except (ValueError, TypeError, AttributeError, HostlistError) as exc:
                raise SlurmError(f"job {jid}: unreadable record ({exc})") from None
        else:
            text = self._run(["scontrol", "-o", "show", "job", str(jid)], timeout)
            for line in job_records(text):
                fields = parse_oneliner(line)
                if fields.get("JobId") == str(jid):
                    return _job_from_oneliner(fields)
        raise SlurmError(f"job {jid}: no such job (unknown, or finished longer ago than MinJobAge)")

    def kill_wait(self, default: float = 30.0) -> float:
        """The cluster's ``KillWait`` (seconds between a step's SIGTERM and SIGKILL)."""
        return self._config_seconds("KillWait", default)

    def message_timeout(self, default: float = 10.0) -> float:
        """The cluster's ``MessageTimeout`` (how long a daemon may take to answer)."""
        return self._config_seconds("MessageTimeout", default)

    def _config_seconds(self, key: str, default: float) -> float:
        try:
            m = re.search(rf"^{key}\s*=\s*(\d+)", self._run(["scontrol", "show", "config"]), re.M)
        except SlurmError:
            return default
        return float(m.group(1)) if m else default

    def partition_nodes(self, partition: str, timeout: float | None = None) -> list[Node]:
        """The nodes of one partition with their states (``sinfo -h -N -p PART -O ...``; one
        query, for a decision that needs it, never a polling loop)."""
        _check_name(partition)
        out = self._run(["sinfo", "-h", "-N", "-p", partition, "-O", _SINFO_FORMAT], timeout)
        found = {n.name: n for n in map(node_from_sinfo, out.splitlines()) if n is not None}
        return list(found.values())

    def reservation_nodes(self, name: str, timeout: float | None = None) -> list[str]:
        """The nodes of reservation ``name`` (``scontrol -o show reservation NAME``)."""
        _check_name(name)
        for line in self._run(["scontrol", "-o", "show", "reservation", name],
                              timeout).splitlines():
            fields = parse_oneliner(line)
            if fields.get("ReservationName") == name:
                return list(_nodes_field(fields.get("Nodes")))
        raise SlurmError(f"no reservation {name}")

    def signal_step(self, job_id: int | str, step: int | str, signal: str,
                    timeout: float | None = None) -> None:
        """Send ``signal`` (a name, e.g. ``TERM``) to every task of one step
        (``scancel --signal=SIG JOB.STEP``); ``srun`` itself is not signalled, so the tasks
        may save before they exit."""
        if not re.fullmatch(r"[A-Z0-9]{1,8}", signal):
            raise SlurmError(f"invalid signal name {signal!r}")
        sid = str(step).strip()
        if not sid.isdigit():
            raise SlurmError(f"invalid step id {step!r}")
        self._run(["scancel", f"--signal={signal}", f"{_job_id(job_id)}.{sid}"], timeout)

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

    def reboot_asap(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        """``scontrol reboot ASAP nextstate=STATE reason=...``: drain, reboot when idle, then
        ``RESUME`` (back in service) or ``DOWN`` (kept out with the reason, for a validation
        before it takes work)."""
        _check_name(node)
        if nextstate not in ("RESUME", "DOWN"):
            raise SlurmError(f"invalid reboot nextstate {nextstate!r}")
        self._run(["scontrol", "reboot", "ASAP", f"nextstate={nextstate}",
                   f"reason={sanitize_reason(reason)}", node])

    def power_down(self, node: str, reason: str) -> None:
        """Power the node down once its jobs end (``State=POWER_DOWN_ASAP``; Slurm runs the
        site's SuspendProgram): a replacement, in a cloud a new instance at the next power up.
        Needs power saving configured (SuspendProgram, ResumeProgram, a finite SuspendTime)."""
        self._update_node(node, "POWER_DOWN_ASAP", sanitize_reason(reason))

    def power_up(self, node: str) -> None:
        """Power a powered-down node up (``State=POWER_UP``: Slurm runs the ResumeProgram)."""
        self._update_node(node, "POWER_UP")

    def cancel_reboot(self, node: str) -> None:
        _check_name(node)
        self._run(["scontrol", "cancel_reboot", node])

    def requeue(self, job_id: int | str, hold: bool = False,
                timeout: float | None = None) -> None:
        self._run(["scontrol", "requeuehold" if hold else "requeue", str(_job_id(job_id))],
                  timeout)

    def release(self, job_id: int | str, timeout: float | None = None) -> None:
        self._run(["scontrol", "release", str(_job_id(job_id))], timeout)

    def set_excluded(self, job_id: int | str, nodes: Iterable[str],
                     timeout: float | None = None) -> None:
        """Set a job's ``ExcNodeList`` (only while the job is pending, held or requeued)."""
        names = _checked(nodes)
        self._run(["scontrol", "update", f"JobId={_job_id(job_id)}",
                   f"ExcNodeList={compress(names) if names else ''}"], timeout)

    def set_request(self, job_id: int | str, *, required: Iterable[str] | None = None,
                    num_nodes: int | None = None, timeout: float | None = None) -> None:
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
            self._run(argv, timeout)

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

"""Pure parsing of Slurm's answers (JSON and ``scontrol -o`` lines) into the seam's types."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from resilient_slurm.slurm.hostlist import HostlistError, expand
from resilient_slurm.slurm.model import NODE_FLAGS, Job, Node, SlurmError


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


def _end_time(value: Any) -> float | None:
    """A job's EndTime as seconds since the epoch: 22.05's one-line record gives local time
    (``2026-12-05T01:50:00``, ``Unknown``), JSON a number or {"set", "infinite", "number"};
    None when unset, infinite or unreadable."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if value > 0 else None
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", value):
        try:
            return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
        except (ValueError, OverflowError):
            return None
    return None


def job_records(text: str) -> list[str]:
    """The records of ``scontrol -o show job`` output, one per job. A job's name or comment may
    hold a newline (user text): a line that does not start a record continues the one before."""
    records: list[str] = []
    for line in text.splitlines():
        if line.startswith("JobId=") or not records:
            records.append(line)
        else:
            records[-1] += " " + line
    return records


def parse_oneliner(line: str) -> dict[str, str]:
    """``Key=value Key2=value2 ...`` (``scontrol -o show job``) as a dict; a value runs to the
    next `` Key=``, so values holding spaces (``Comment=a b``) stay whole."""
    parts = re.split(r"\s+(?=[A-Za-z][A-Za-z0-9_:/]*=)", line.strip())
    out: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if sep:
            out.setdefault(key, value)
    return out


def _job_from_oneliner(f: Mapping[str, str]) -> Job:
    """A Job from ``scontrol -o show job`` fields (22.05; the same keys on later releases)."""
    try:
        reason = f.get("Reason", "")
        return Job(
            job_id=_job_id(f.get("JobId", "")),
            name=f.get("JobName", ""),
            state=(f.get("JobState") or "UNKNOWN").upper(),
            nodes=_nodes_field(f.get("NodeList")),
            restart_count=_num(f.get("Restarts")),
            excluded=_nodes_field(f.get("ExcNodeList")),
            requeue=f.get("Requeue") == "1",
            reason="" if reason == "None" else reason,
            held=f.get("Priority") == "0" or reason.startswith("JobHeld"),
            exit_code=_num(f.get("ExitCode", "0").split(":")[0]),
            required=_nodes_field(f.get("ReqNodeList")),
            end_time=_end_time(f.get("EndTime")),
            extra={k: v for k, v in (("batch_host", f.get("BatchHost")),
                                     ("partition", f.get("Partition")),
                                     ("reservation", f.get("Reservation", "").replace(
                                         "(null)", "")),
                                     ("user_name", f.get("UserId", "").split("(")[0])) if v},
        )
    except (HostlistError, ValueError) as exc:
        raise SlurmError(f"unreadable job record: {exc}") from None


# Job state flags in the order Slurm's job_state_string() reports them (what squeue's %T,
# ``scontrol show job``'s JobState= and 22.05's squeue --json show); >= 23.02 JSON lists the base
# state and its flags instead, e.g. ["COMPLETED", "COMPLETING"] while the epilog still runs.
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
        end_time=_end_time(raw.get("end_time")),
        extra={k: str(raw[k]) for k in ("batch_host", "comment", "partition", "reservation",
                                        "user_name") if k in raw},
    )


_SINFO_FORMAT = "NodeList:|,StateComplete:|,User:|,NodeAddr:|,Port:|,Reason:0"


def node_from_sinfo(line: str) -> Node | None:
    """A node from one line of ``sinfo -N -O`` with :data:`_SINFO_FORMAT` (the reason comes
    last and may hold ``|``; sinfo prints ``none``/``Unknown`` when no reason is set)."""
    parts = line.rstrip("\n").split("|", 5)
    if len(parts) != 6:
        return None
    name, state, user, addr, port, reason = (p.strip() for p in parts)
    if reason == "none" and user == "Unknown":
        reason, user = "", ""
    words = [w.rstrip("*~#!%$@^-") for w in _words(state)]  # sinfo's state suffixes
    base, flags = split_state([w for w in words if w])
    return Node(name=name, state=base, flags=flags, reason=reason, reason_user=user, addr=addr,
                port=int(port) if port.isdigit() else None)


_SINFO_BRIEF = "NodeList:|,StateComplete:|,TimeStamp:|,Reason:0"


def node_from_brief(line: str) -> Node | None:
    """A node from one line of ``sinfo -N -O`` with :data:`_SINFO_BRIEF` (the timestamp is
    the controller's local time, ``Unknown`` when no reason is set)."""
    import datetime as _dt

    parts = line.rstrip("\n").split("|", 3)
    if len(parts) != 4 or not parts[0].strip():
        return None
    name, state, stamp, reason = (p.strip() for p in parts)
    try:
        when: float | None = _dt.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        when = None
    if reason == "none":
        reason = ""
    words = [w.rstrip("*~#!%$@^-") for w in _words(state)]
    base, flags = split_state([w for w in words if w])
    return Node(name=name, state=base, flags=flags, reason=reason, reason_time=when)

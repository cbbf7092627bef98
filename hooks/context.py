"""What a hook may learn from its environment, validated.

Slurm gives hooks root and an environment that mixes controller facts with job-controlled
text. We read only values with a strict shape (node name, job id, GPU indices, exit code) and
never read, execute or trust as a path the job's name, comment, or the user's environment
(``SLURM_JOB_COMMENT``, ``SLURM_JOB_NAME`` are deliberately ignored).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_GPUS = re.compile(r"^\d{1,3}(,\d{1,3}){0,63}$")


class ContextError(ValueError):
    """The environment lacks a value the hook cannot work without."""


@dataclass(frozen=True)
class HookContext:
    node: str
    job_id: int | None = None
    gpus: tuple[int, ...] | None = None
    exit_code: int | None = None
    restart_count: int = 0


def _int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key, "").strip()
    if raw.lstrip("-").isdigit() and len(raw) < 12:
        return int(raw)
    return None


def node_name(env: Mapping[str, str], override: str | None = None) -> str:
    name = override or env.get("SLURMD_NODENAME", "")
    if not _NODE.match(name):
        raise ContextError("SLURMD_NODENAME is missing or not a node name "
                           "(the hook must run under slurmd, or pass --node)")
    return name


def from_env(env: Mapping[str, str], node: str | None = None) -> HookContext:
    """The hook's context from Slurm's environment (see module docstring)."""
    gpus_raw = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    gpus = tuple(int(g) for g in gpus_raw.split(",")) if _GPUS.match(gpus_raw) else None
    job = _int(env, "SLURM_JOB_ID")
    return HookContext(
        node=node_name(env, node),
        job_id=job if job is not None and job > 0 else None,
        gpus=gpus,
        exit_code=_int(env, "SLURM_JOB_EXIT_CODE"),
        restart_count=max(0, _int(env, "SLURM_JOB_RESTART_COUNT") or 0),
    )

"""What NVRx's in-process restart requires of NCCL and torch, set and checked.

NVRx documents in-process restart as supported only with ``NCCL_NVLS_ENABLE=0`` (NVLink
SHARP's multicast objects are not released by an abort), ``TORCH_NCCL_RETHROW_CUDA_ERRORS=0``
(a CUDA error must reach the Wrapper as a restartable fault, not tear the process down), NCCL
>= 2.26.2 and torch >= 2.5.1.

* :data:`NCCL_ENV`: the two variables ``resilient-launch --inprocess`` sets for the ranks
  when the job did not set them (``launcher/cycle/inprocess_plan.worker_env``; the user's value is
  kept, and then checked here).
* :func:`check`: one :class:`Requirement` per item, status ``ok``/``fail``/``unknown`` with
  its reason and evidence. Without CUDA (a CPU torch: gloo, no NCCL) the NCCL version is
  ``unknown`` and reported as such, never a failure; :func:`refusals` is what must stop an
  in-process run: a ``fail``, or an ``unknown`` where CUDA runs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from resilient_slurm.status import FAIL, OK, UNKNOWN

__all__ = ["FAIL", "OK", "UNKNOWN", "Requirement", "RequirementError", "check", "describe",
           "enforce", "refusals"]

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0"}
MIN_NCCL = (2, 26, 2)
MIN_TORCH = (2, 5, 1)


@dataclass(frozen=True)
class Requirement:
    name: str
    status: str  # ok / fail / unknown
    reason: str
    evidence: str = ""


def _version(text: str) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    return tuple(int(x) for x in m.groups(default="0")) if m else None


def _dotted(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


def check_env(env: Mapping[str, str]) -> list[Requirement]:
    """The NCCL variables, as the ranks see them."""
    out = []
    for key, want in NCCL_ENV.items():
        got = env.get(key)
        if got == want:
            out.append(Requirement(key, OK, f"{key}={want}", f"{key}={got}"))
        else:
            out.append(Requirement(key, FAIL, f"{key} must be {want} for in-process restart "
                                   "(NVRx)", f"{key}={got!r}" if got is not None else "unset"))
    return out


def check_versions(torch_version: str, nccl_version: tuple[int, ...] | None,
                   cuda: bool) -> list[Requirement]:
    """torch's and NCCL's versions (``nccl_version`` None: not readable here)."""
    out = []
    tv = _version(torch_version)
    if tv is None:
        out.append(Requirement("torch", UNKNOWN, "torch's version is unreadable", torch_version))
    elif tv < MIN_TORCH:
        out.append(Requirement("torch", FAIL, f"torch >= {_dotted(MIN_TORCH)} needed",
                               torch_version))
    else:
        out.append(Requirement("torch", OK, f"torch >= {_dotted(MIN_TORCH)}", torch_version))
    if nccl_version is None:
        why = ("NCCL version unreadable" if cuda else
               "no CUDA here (a CPU torch, gloo): NCCL not checked")
        out.append(Requirement("nccl", UNKNOWN, why, "cuda" if cuda else "no cuda"))
    elif nccl_version < MIN_NCCL:
        out.append(Requirement("nccl", FAIL, f"NCCL >= {_dotted(MIN_NCCL)} needed",
                               _dotted(nccl_version)))
    else:
        out.append(Requirement("nccl", OK, f"NCCL >= {_dotted(MIN_NCCL)}",
                               _dotted(nccl_version)))
    return out


def _torch_facts() -> tuple[str, tuple[int, ...] | None, bool]:
    import torch

    cuda = bool(torch.cuda.is_available())
    nccl: tuple[int, ...] | None = None
    if cuda:
        try:
            raw = torch.cuda.nccl.version()
            nccl = tuple(int(x) for x in raw) if isinstance(raw, tuple) else None
        except (AttributeError, RuntimeError):
            nccl = None
    return str(torch.__version__), nccl, cuda


def check(env: Mapping[str, str],
          facts: Callable[[], tuple[str, tuple[int, ...] | None, bool]] = _torch_facts,
          ) -> tuple[list[Requirement], bool]:
    """Every requirement (the environment, torch, NCCL) and whether CUDA runs here."""
    torch_version, nccl, cuda = facts()
    return check_env(env) + check_versions(torch_version, nccl, cuda), cuda


def refusals(found: list[Requirement], cuda: bool) -> list[Requirement]:
    """What must stop an in-process run: any ``fail`` where CUDA runs (NCCL is what these
    requirements are for), an ``unknown`` there too; on CPU (gloo) nothing."""
    if not cuda:
        return []
    return [r for r in found if r.status != OK]


def describe(r: Requirement) -> str:
    return f"{r.name}: {r.status}: {r.reason} ({r.evidence})" if r.evidence else \
        f"{r.name}: {r.status}: {r.reason}"


class RequirementError(ValueError):
    """NVRx's requirements for in-process restart are not met where CUDA runs."""


def enforce(env: Mapping[str, str] | None = None) -> None:
    """Each requirement not met is printed with its reason; where CUDA runs, any of them
    raises :class:`RequirementError` (NVRx does not support in-process restart there); on a
    CPU torch (gloo) they are reported only."""
    found, cuda = check(dict(os.environ) if env is None else env)
    for r in found:
        if r.status != OK:
            print(f"[inprocess] requirement {describe(r)}", flush=True)
    refused = refusals(found, cuda)
    if refused:
        raise RequirementError("in-process restart unsupported here: " + "; ".join(
            describe(r) for r in refused))

"""One declaration per check, beside its evaluator.

``@declare(name, source, sets, fields=..., context=...)`` on an evaluate function registers the
check: which gatherer feeds it (``nvml``, ``kernlog``, ``rdma``, ``fi_info``, ``dcgm_diag``,
``dcgm_health``, ``storage``, ``services``), which NVML fields it needs, which check sets run
it (``prolog``, ``periodic``, ``epilog``; ``validate``: the return-to-service proof; none:
only on demand with ``--only``), and which
context its evaluator takes as second argument (``gpu``: ``checks_gpu.GpuContext``, ``log``:
``checks_log.LogContext``, ``profile``: the ``ProfileSpec``, ``run``: :class:`RunContext`).
The engine derives its tables from :data:`REGISTRY`; nothing else lists the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from resilient_slurm.healthcheck.config import HealthConfig, ProfileSpec

from .model import Result

PROLOG, PERIODIC, EPILOG, VALIDATE = "prolog", "periodic", "epilog", "validate"
SET_NAMES = (PROLOG, PERIODIC, EPILOG, VALIDATE)
EVERY_SET = (PROLOG, PERIODIC, EPILOG)  # the passive sets; ``validate`` is active, on demand
F = TypeVar("F", bound=Callable[..., list[Result]])


@dataclass(frozen=True)
class RunContext:
    """What a check that needs neither GPU nor log context may read."""

    cfg: HealthConfig
    profile: ProfileSpec


@dataclass(frozen=True)
class CheckDecl:
    name: str
    source: str
    sets: tuple[str, ...]
    fields: tuple[str, ...]
    context: str
    evaluate: Callable[[Any, Any], list[Result]]


REGISTRY: dict[str, CheckDecl] = {}


def declare(name: str, source: str, sets: tuple[str, ...], *, fields: tuple[str, ...] = (),
            context: str = "run") -> Callable[[F], F]:
    """Register the decorated ``evaluate(value, context) -> list[Result]`` as check ``name``."""
    if context not in ("gpu", "log", "profile", "run"):
        raise ValueError(f"check {name}: unknown context {context!r}")
    unknown = set(sets) - set(SET_NAMES)
    if unknown:
        raise ValueError(f"check {name}: unknown check set(s) {sorted(unknown)}")

    def deco(fn: F) -> F:
        if name in REGISTRY:
            raise ValueError(f"check {name} declared twice")
        REGISTRY[name] = CheckDecl(name, source, tuple(sets), tuple(fields), context, fn)
        return fn

    return deco

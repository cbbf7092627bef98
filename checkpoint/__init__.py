"""Memory-tier checkpoints: two calls where ``dcp.save`` and ``dcp.load`` stood.

::

    from resilient_slurm import checkpoint

    step = checkpoint.load(state, durable_dir=ckpt_dir, durable_every=100) or 0
    for step in range(step + 1, steps + 1):
        ...
        checkpoint.save(state, step)      # every step: node memory + a peer node's memory

``state`` is what ``dcp.save`` took (e.g. ``{"model": msd, "optim": osd}`` from
``get_state_dict``); ``load`` fills it in place like ``dcp.load`` and returns the step it
restored, or None (fresh start). Keyword arguments configure the tiers on the first call
(:class:`Tiers`); later calls use the same instance. See docs/checkpointing.md.

The package also holds the launcher's torch-free view of a checkpoint directory (``layout``):
importing the package imports no torch; ``Tiers`` and ``CheckpointError`` (torch) are loaded
on first use.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resilient_slurm.checkpoint.tiers import CheckpointError, Tiers

__all__ = ["CheckpointError", "Tiers", "close", "configure", "load", "save", "stats"]

_default: Tiers | None = None


def configure(**options: Any) -> Tiers:
    """The tiers :func:`save` and :func:`load` use, made on the first call from ``options``
    (see :class:`Tiers`). Options given again later must not differ."""
    global _default
    if _default is None:
        from resilient_slurm.checkpoint.tiers import Tiers

        _default = Tiers(**options)
        atexit.register(_at_exit)
    elif options:
        given = {k: getattr(_default, "keep_asked" if k == "keep" else k) for k in options}
        if given != options:
            from resilient_slurm.checkpoint.tiers import CheckpointError

            raise CheckpointError(f"checkpoint already configured with {given}, not {options}")
    return _default


def save(state_dict: Any, step: int, **options: Any) -> float:
    """Snapshot ``state_dict`` as ``step`` on every tier due; the seconds the caller waited."""
    return configure(**options).save(state_dict, step)


def load(state_dict: Any, newer_than: int | None = None,
         check: Callable[[], bool] | None = None, **options: Any) -> int | None:
    """Collective: restore the newest step every rank can get (newer than ``newer_than``);
    its step, or None. ``check`` (every rank, after the state is in place: e.g. the loss on
    a probe batch is finite) rejecting it on any rank falls back to the next tier."""
    return configure(**options).load(state_dict, newer_than=newer_than, check=check)


def stats() -> dict[str, Any]:
    return configure().stats()


def close() -> None:
    """Finish in-flight saves."""
    if _default is not None:
        _default.close()


AT_EXIT_WAIT_S = 10.0


def _at_exit() -> None:
    """At interpreter exit: finish what is in flight, but never hold a failing process (a
    dead peer) back for more than ``AT_EXIT_WAIT_S``; the launcher restarts on its exit."""
    if _default is not None:
        _default.close(timeout_s=AT_EXIT_WAIT_S)


def __getattr__(name: str) -> Any:
    """``Tiers`` and ``CheckpointError``, imported (with torch) on first use."""
    if name in ("Tiers", "CheckpointError"):
        from resilient_slurm.checkpoint import tiers

        return getattr(tiers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

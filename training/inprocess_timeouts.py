"""Level 0's timeouts (in-process restart): NVRx's own unless the user sets them.

The five timeouts of NVRx's ``inprocess.Wrapper`` (:data:`NAMES`) are passed to it only when
the user set them, in code (``InprocessSettings(soft_timeout=...)``), with ``train_fsdp.py``'s
flags or in the environment (``RESILIENT_INPROCESS_SOFT_TIMEOUT`` etc., :func:`env_name`:
seconds, read by the ranks and by ``resilient-launch --inprocess`` for its level-1 check);
otherwise the Wrapper uses its own defaults. :data:`NVRX_DEFAULTS` are those defaults as
NVRx 0.4.1, 0.5.0, 0.6.0 and 0.7.0 declare them (the same in each release; a test compares
them with the installed Wrapper's signature): the launcher uses them without importing torch.

torch-free: the launcher imports this module; only :func:`installed_defaults` imports NVRx.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping

NAMES = ("soft_timeout", "hard_timeout", "heartbeat_timeout", "barrier_timeout",
         "completion_timeout")
# NVRx's inprocess.Wrapper defaults, seconds (wrap.py at tags v0.4.1, v0.5.0, v0.6.0, v0.7.0)
NVRX_DEFAULTS: dict[str, float] = {"soft_timeout": 60.0, "hard_timeout": 90.0,
                                   "heartbeat_timeout": 30.0, "barrier_timeout": 120.0,
                                   "completion_timeout": 120.0}
MEANING = {
    "soft_timeout": "seconds without progress before the ranks restart in-process",
    "hard_timeout": "seconds without progress before a rank is killed",
    "heartbeat_timeout": "seconds without a rank's monitor heartbeat before it is unresponsive",
    "barrier_timeout": "seconds a restart's barriers wait for every rank",
    "completion_timeout": "seconds the ranks wait for each other to finish",
}


def env_name(name: str) -> str:
    """``soft_timeout`` -> ``RESILIENT_INPROCESS_SOFT_TIMEOUT``."""
    return "RESILIENT_INPROCESS_" + name.upper()


def from_env(env: Mapping[str, str]) -> dict[str, float]:
    """The timeouts the environment sets (seconds > 0); ValueError naming the variable for a
    value that is not one."""
    out: dict[str, float] = {}
    for name in NAMES:
        raw = env.get(env_name(name), "").strip()
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{env_name(name)}={raw!r}: expected seconds > 0 "
                             f"({MEANING[name]}; unset: NVRx's own)")
        out[name] = value
    return out


def installed_defaults() -> dict[str, float]:
    """The installed NVRx Wrapper's own defaults, seconds, read from its signature (imports
    NVRx and torch)."""
    from nvidia_resiliency_ext import inprocess as nvrx

    params = inspect.signature(nvrx.Wrapper).parameters
    return {name: params[name].default.total_seconds() for name in NAMES}


def effective(given: Mapping[str, float | None], defaults: Mapping[str, float]
              ) -> dict[str, float]:
    """Each timeout: the given one, else the default."""
    out: dict[str, float] = {}
    for name in NAMES:
        value = given.get(name)
        out[name] = defaults[name] if value is None else value
    return out


def check(values: Mapping[str, float]) -> None:
    """NVRx's own order of the timeouts (its Wrapper asserts it without a message), with one:
    ValueError saying which."""
    soft, hard, hb, barrier, completion = (values[n] for n in NAMES)
    if not 0 < soft < hard < barrier:
        raise ValueError(f"need 0 < soft_timeout ({soft:g}) < hard_timeout ({hard:g}) < "
                         f"barrier_timeout ({barrier:g})")
    if not 0 < hb < barrier or completion <= 0:
        raise ValueError(f"need 0 < heartbeat_timeout ({hb:g}) < barrier_timeout "
                         f"({barrier:g}) and completion_timeout ({completion:g}) > 0")


def describe(given: Mapping[str, float | None], defaults: Mapping[str, float]) -> str:
    """``soft 60 s (NVRx's), hard 20 s (yours), ...`` for logs and dry runs."""
    return ", ".join(
        f"{n.removesuffix('_timeout')} {v:g} s ("
        + ("yours" if given.get(n) is not None else "NVRx's") + ")"
        for n, v in effective(given, defaults).items())

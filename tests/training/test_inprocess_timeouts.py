"""Level 0's timeouts are NVRx's own unless the user sets them (issue 37, item 9).

The defaults are read from the installed NVRx Wrapper's signature here, never written down:
the InprocessSettings nobody configured build a Wrapper whose timeouts are exactly those; the user's
(in code, ``RESILIENT_INPROCESS_*_TIMEOUT``, ``train_fsdp.py``'s flags) reach it instead."""

from __future__ import annotations

import datetime
import inspect

import pytest

pytest.importorskip("torch")
nvrx = pytest.importorskip("nvidia_resiliency_ext.inprocess")

from resilient_slurm.training import inprocess  # noqa: E402
from resilient_slurm.training import inprocess_timeouts as ip_timeouts  # noqa: E402
from resilient_slurm.training.gloo_abort import SocketAbort, Waker  # noqa: E402

NAMES = ("soft_timeout", "hard_timeout", "heartbeat_timeout", "barrier_timeout",
         "completion_timeout")


def signature_defaults() -> dict[str, datetime.timedelta]:
    params = inspect.signature(nvrx.Wrapper).parameters
    return {n: params[n].default for n in NAMES}


def built(settings: inprocess.InprocessSettings) -> dict[str, datetime.timedelta]:
    """The timeouts of the Wrapper ``inprocess.run`` would build from ``settings``."""
    w = inprocess.wrapper(settings, Waker(0.05), SocketAbort())
    return {n: getattr(w, n) for n in NAMES}


def test_default_settings_give_the_wrapper_nvrx_own_timeouts() -> None:
    s = inprocess.InprocessSettings.from_env({"RESILIENT_INPROCESS_STORE": "127.0.0.1:1"})
    assert built(s) == signature_defaults()
    assert s.timeouts() == {n: d.total_seconds() for n, d in signature_defaults().items()}
    s.check()  # NVRx's own are valid


def test_documented_defaults_are_the_installed_wrappers() -> None:
    """What --help and the launcher (torch-free) state is what the installed NVRx declares."""
    assert ip_timeouts.NVRX_DEFAULTS == {
        n: d.total_seconds() for n, d in signature_defaults().items()}
    assert ip_timeouts.installed_defaults() == ip_timeouts.NVRX_DEFAULTS


def test_users_timeouts_reach_the_wrapper_env_and_overrides() -> None:
    env = {"RESILIENT_INPROCESS_STORE": "127.0.0.1:1", "RESILIENT_INPROCESS_SOFT_TIMEOUT": "4",
           "RESILIENT_INPROCESS_HARD_TIMEOUT": "20", "RESILIENT_INPROCESS_HEARTBEAT_TIMEOUT": "60"}
    s = inprocess.InprocessSettings.from_env(env, hard_timeout=25.0, barrier_timeout=None)
    got = built(s)
    assert got["soft_timeout"] == datetime.timedelta(seconds=4)
    assert got["hard_timeout"] == datetime.timedelta(seconds=25)  # the override (a flag) wins
    assert got["heartbeat_timeout"] == datetime.timedelta(seconds=60)
    # None (a flag not given) leaves NVRx's own
    assert got["barrier_timeout"] == signature_defaults()["barrier_timeout"]
    assert got["completion_timeout"] == signature_defaults()["completion_timeout"]


@pytest.mark.parametrize("value", ["soon", "0", "-3", "nan", "inf"])
def test_bad_environment_value_names_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match="RESILIENT_INPROCESS_HARD_TIMEOUT"):
        inprocess.InprocessSettings.from_env({"RESILIENT_INPROCESS_STORE": "h:1",
                                     "RESILIENT_INPROCESS_HARD_TIMEOUT": value})


def test_order_checked_against_nvrx_defaults_with_a_clear_message() -> None:
    # a soft timeout above NVRx's own hard timeout: NVRx would only assert
    s = inprocess.InprocessSettings(store="h:1", soft_timeout=100.0)
    with pytest.raises(ValueError, match=r"soft_timeout \(100\) < hard_timeout \(90\)"):
        s.check()
    with pytest.raises(ValueError, match="heartbeat_timeout"):
        inprocess.InprocessSettings(store="h:1", heartbeat_timeout=500.0).check()


def test_train_fsdp_flags_default_to_unset() -> None:
    from resilient_slurm.sbatch import train_fsdp

    args = train_fsdp.parse_args(["--checkpoint-dir", "/x"])
    assert args.soft_timeout is None and args.hard_timeout is None
    args = train_fsdp.parse_args(["--checkpoint-dir", "/x", "--soft-timeout", "4"])
    assert args.soft_timeout == 4.0

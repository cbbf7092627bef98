"""The NVLink fabric's services: ``nvidia-fabricmanager`` and ``nvidia-imex``, per profile.

NVML's GPU fabric state (the ``fabric`` check) says whether each GPU registered with the
fabric; on A100 HGX the driver does not report it, and on every NVSwitch system a fabric
manager that has stopped breaks the next job that needs NVLink peers. So a profile with
``fabric_manager = true`` (HGX A100/H100/H200/B200: NVSwitches on the baseboard) needs the
``nvidia-fabricmanager`` service active, and one with ``imex = true`` (GB200/GB300 NVL72
compute trays, whose fabric manager runs on the NVLink switch trays) needs ``nvidia-imex``.

Probe: ``systemctl show --property=LoadState,ActiveState,SubState <unit>`` through the
command runner (one process per unit, timeout, argv list). Fail closed: systemctl missing,
hung or erroring is ``unknown``; a unit that is not installed, inactive or failed is ``fail``.
"""

from __future__ import annotations

from resilient_slurm.healthcheck.config import ProfileSpec
from resilient_slurm.proc import MISSING, TIMEOUT, Outcome

from .model import FAIL, OK, UNKNOWN, WARN, Result
from .registry import PERIODIC, PROLOG, RunContext, declare

FABRIC_MANAGER = "nvidia-fabricmanager.service"
IMEX = "nvidia-imex.service"
_CODE = {FABRIC_MANAGER: "FM", IMEX: "IMEX"}
PROPERTIES = ("LoadState", "ActiveState", "SubState")


def units_for(profile: ProfileSpec) -> list[str]:
    """The service units ``profile`` requires (``fabric_manager`` / ``imex``)."""
    return [u for u, need in ((FABRIC_MANAGER, profile.fabric_manager), (IMEX, profile.imex))
            if need]


def probe_argv(unit: str) -> list[str]:
    return ["systemctl", "show", "--no-pager", "--property=" + ",".join(PROPERTIES), unit]


def parse_show(stdout: str) -> dict[str, str]:
    """``Key=value`` lines of ``systemctl show`` (other lines ignored)."""
    out = {}
    for line in stdout.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in PROPERTIES:
            out[key] = value.strip()
    return out


def evaluate_unit(unit: str, out: Outcome) -> Result:
    check, code = "fabric_manager", _CODE.get(unit, "UNIT")
    if out.kind == MISSING:
        return Result(check, UNKNOWN, "SYSTEMCTL_MISSING", f"cannot tell whether {unit} runs: "
                      f"{out.describe()} (the profile requires the service)", out.describe())
    if out.kind == TIMEOUT:
        return Result(check, UNKNOWN, "SYSTEMCTL_TIMEOUT", f"{unit}: {out.describe()}",
                      out.describe())
    state = parse_show(out.stdout)
    if out.kind != "ok" or set(state) != set(PROPERTIES):
        return Result(check, UNKNOWN, "SYSTEMCTL_ERROR", f"{unit}: systemctl show gave no "
                      f"unit state ({out.describe()})", (out.stdout + out.stderr)[:200])
    seen = " ".join(f"{k}={state[k]}" for k in PROPERTIES)
    load, active, sub = state["LoadState"], state["ActiveState"], state["SubState"]
    if load == "not-found":
        return Result(check, FAIL, f"{code}_NOT_INSTALLED", f"{unit} is not installed; the "
                      "profile requires it", seen, action="drain")
    if active == "active" and sub == "running":
        return Result(check, OK, "OK", f"{unit} active (running)", seen)
    if active == "active":
        return Result(check, WARN, f"{code}_{sub.upper()}"[:32], f"{unit} active but {sub}",
                      seen)
    if active in ("activating", "reloading"):
        return Result(check, UNKNOWN, f"{code}_STARTING", f"{unit} is {active}: the fabric "
                      "is not ready yet", seen)
    sub_txt = f" ({sub})" if sub != active else ""
    return Result(check, FAIL, f"{code}_INACTIVE", f"{unit} is {active}{sub_txt}: NVLink peers "
                  "are unavailable to jobs", seen, action="drain")


@declare("fabric_manager", "services", (PROLOG, PERIODIC))
def check_fabric_manager(outs: dict[str, Outcome], run: RunContext) -> list[Result]:
    """One result per unit the profile requires (``outs``: unit -> probe outcome)."""
    units = units_for(run.profile)
    if not units:
        return [Result("fabric_manager", OK, "SKIPPED", "profile requires no fabric manager "
                       "or IMEX service")]
    return [evaluate_unit(u, outs[u]) if u in outs else
            Result("fabric_manager", UNKNOWN, "NOT_PROBED", f"{u} was not probed", u)
            for u in units]

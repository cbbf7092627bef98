"""Pure evaluation of a GPU snapshot: ``evaluate_<check>(snap, ctx) -> list[Result]``.

NVML unreachable (init failure, hang, error) makes every GPU check ``unknown`` (``GPU_IS_LOST``
makes it ``fail``); a per-field ``NOT_SUPPORTED`` is judged per check (retired pages on Ampere+
are not applicable; ECC counters missing mean ECC is off: a warning, a failure where the
profile has ``require_ecc``), and is ``unknown`` for any field the profile lists in
``nvml_required`` (the node class must answer it: silence is not health).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resilient_slurm.healthcheck.config import HealthConfig, ProfileSpec

from .gpu import GpuInfo, GpuSnapshot
from .gpu_judge import _field_error, _r, _unusable, per_gpu
from .model import FAIL, OK, UNKNOWN, WARN, Result
from .policy import RECOVERY_ACTIONS, generation_of
from .registry import EPILOG, EVERY_SET, PERIODIC, PROLOG, declare

# Clock-event reason bits (nvmlClocksEventReasons).
CLOCK_IDLE = 0x1
CLOCK_SW_POWER = 0x4
CLOCK_HW_SLOWDOWN = 0x8
CLOCK_SW_THERMAL = 0x20
CLOCK_HW_THERMAL = 0x40
CLOCK_HW_POWER_BRAKE = 0x80


@dataclass
class GpuContext:
    cfg: HealthConfig
    profile: ProfileSpec
    rates: Any = None  # checks_rates.RateHistory: earlier counter samples (None: none kept)


@declare("gpu_count", "nvml", EVERY_SET, fields=(), context="gpu")
def evaluate_gpu_count(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    """NVML answers and sees the profile's GPU count (node-wide, even in a scoped prolog:
    a vanished GPU shifts the indices jobs are given)."""
    check = "gpu_count"
    if not snap.usable:
        return _unusable(check, snap)
    out = []
    for g in snap.gpus:
        dev = f"gpu{g.index}"
        if g.lost:
            out.append(Result(check, FAIL, "GPU_LOST", f"{dev} is lost ({g.lost}): fell off "
                              "the bus or stopped answering", f"{dev} {g.pci} {g.lost}",
                              action="reboot", device=dev))
        elif "identity" in g.errors:
            out.append(_field_error(check, g, "identity", g.errors["identity"]))
    out.extend(_generation_mismatch(check, snap, ctx.profile))
    want, have = ctx.profile.gpus, snap.count or 0
    if want and have < want:
        out.append(Result(check, FAIL, "GPU_COUNT", f"{have} GPUs visible, profile expects "
                          f"{want}", f"nvml count={have} expected={want}", action="reboot"))
    elif want and have > want:
        out.append(Result(check, WARN, "GPU_COUNT_HIGH", f"{have} GPUs visible, profile "
                          f"expects {want}", f"nvml count={have} expected={want}"))
    return out or [Result(check, OK, "OK", f"{have} GPUs, NVML responsive "
                          f"(driver {snap.driver})", f"count={have}")]


def _generation_mismatch(check: str, snap: GpuSnapshot, profile: ProfileSpec) -> list[Result]:
    """``unknown`` (``GPU_GENERATION``) for each GPU whose generation, as NVML reports it,
    is not the profile's ``gpu_generation``: the profile's other expectations (counts, links,
    Xid column) were written for other hardware, so nothing it passes can be trusted. The
    Xids of such a GPU are judged by the column of the generation NVML reports."""
    want = profile.gpu_generation
    out = []
    for g in snap.gpus:
        have = generation_of(g.name, g.architecture)
        if want and have and have != want and not g.lost:
            dev = f"gpu{g.index}"
            out.append(Result(check, UNKNOWN, "GPU_GENERATION", f"{dev} is {have} by NVML "
                              f"({g.name or 'no name'}), the profile expects {want}: wrong "
                              f"profile for this node? (its Xids are judged as {have})",
                              f"{dev} name={g.name!r} architecture={g.architecture!r} "
                              f"profile gpu_generation={want}", device=dev))
    return out


@declare("ecc", "nvml", EVERY_SET, fields=("ecc", "ecc_mode"), context="gpu")
def evaluate_ecc(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    """Uncorrectable ECC counts; with ``require_ecc``, ECC mode must be on (current and
    pending: a pending change applies at the next reset)."""
    cfg, need = ctx.cfg, ctx.profile.require_ecc

    def judge(gpu: GpuInfo, value: tuple[int, int]) -> Result | None:
        vol, agg = value
        if vol < 0 or agg < 0:
            return _r("ecc", UNKNOWN, "ECC_IMPLAUSIBLE", gpu, f"impossible ECC counts "
                      f"({vol}, {agg}): the tool's answer cannot be trusted",
                      f"volatile={vol} aggregate={agg}")
        if vol > cfg.ecc_volatile_uncorrected_max:
            return _r("ecc", FAIL, "ECC_DBE", gpu, f"{vol} uncorrectable ECC errors since the "
                      "last reset", f"volatile={vol} aggregate={agg}", action="reset_gpu")
        if agg > cfg.ecc_aggregate_uncorrected_warn:
            return _r("ecc", WARN, "ECC_DBE_AGGREGATE", gpu, f"{agg} uncorrectable ECC errors "
                      "over its lifetime", f"volatile={vol} aggregate={agg}")
        return None

    off = (Result("ecc", FAIL, "ECC_DISABLED", "ECC is off (NVML has no ECC counters); the "
                  "profile requires ECC (nvidia-smi -e 1, then a GPU reset)", action="drain")
           if need else Result("ecc", WARN, "ECC_DISABLED", "ECC not enabled"))
    found = per_gpu("ecc", snap, "ecc", judge, "no uncorrectable ECC errors", not_supported=off,
                    profile=ctx.profile)
    if not need or not snap.usable:
        return found
    failed = {r.device for r in found if r.code == "ECC_DISABLED"}

    def mode(gpu: GpuInfo, value: tuple[bool, bool]) -> Result | None:
        current, pending = value
        if f"gpu{gpu.index}" in failed or (current and pending):
            return None
        return _r("ecc", FAIL, "ECC_DISABLED", gpu, "ECC mode is off" + (
            "" if not current else " after the next reset (pending)") + "; the profile "
            "requires ECC", f"ecc_mode current={current} pending={pending}", action="drain")

    modes = per_gpu("ecc", snap, "ecc_mode", mode, "", profile=ProfileSpec(
        nvml_required=["ecc_mode"]))  # require_ecc: an unreadable ECC mode is unknown
    extra = [r for r in modes if r.status != OK and r.device not in failed
             and r.code != "GPU_LOST"]  # a lost GPU is reported once, above
    if not extra:
        return found
    return [r for r in found if r.status != OK] + extra


@declare("row_remap", "nvml", EVERY_SET, fields=("remapped_rows",), context="gpu")
def evaluate_row_remap(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    def judge(gpu: GpuInfo, value: tuple[int, int, bool, bool]) -> Result | None:
        corr, unc, pending, failure = value
        detail = f"correctable={corr} uncorrectable={unc} pending={pending} failure={failure}"
        if failure:
            return _r("row_remap", FAIL, "ROW_REMAP_FAILURE", gpu, "row remapping failed "
                      "(no spare rows: replace the GPU)", detail, action="drain")
        if pending:
            return _r("row_remap", FAIL, "ROW_REMAP_PENDING", gpu, "row remap pending: a GPU "
                      "reset applies it", detail, action="reset_gpu")
        return None

    return per_gpu("row_remap", snap, "remapped_rows", judge, "no failed or pending row remaps",
                   profile=ctx.profile)


@declare("retired_pages", "nvml", (PERIODIC,), fields=("retired_pages",), context="gpu")
def evaluate_retired_pages(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    limit = ctx.cfg.retired_pages_max

    def judge(gpu: GpuInfo, value: tuple[int, bool]) -> Result | None:
        count, pending = value
        if pending:
            return _r("retired_pages", FAIL, "PAGE_RETIRE_PENDING", gpu, "retired pages pending: "
                      "a GPU reset applies them", f"dbe_pages={count}", action="reset_gpu")
        if count > limit:
            return _r("retired_pages", FAIL, "PAGES_RETIRED", gpu, f"{count} pages retired "
                      f"(limit {limit})", f"dbe_pages={count}", action="drain")
        return None

    return per_gpu("retired_pages", snap, "retired_pages", judge,
                   "no pending page retirement (not applicable where row remapping is used)",
                   profile=ctx.profile)


@declare("clocks", "nvml", (PERIODIC,), fields=("clock_reasons",), context="gpu")
def evaluate_clocks(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    def judge(gpu: GpuInfo, bits: int) -> Result | None:
        names = [n for b, n in ((CLOCK_HW_SLOWDOWN, "HW slowdown"),
                                (CLOCK_HW_THERMAL, "HW thermal slowdown"),
                                (CLOCK_HW_POWER_BRAKE, "HW power brake")) if bits & b]
        if names:
            return _r("clocks", FAIL, "CLOCK_HW_SLOWDOWN", gpu, "clocks held down: "
                      + ", ".join(names), f"reasons=0x{bits:x}", action="drain")
        if bits & CLOCK_SW_THERMAL:
            return _r("clocks", WARN, "CLOCK_SW_THERMAL", gpu, "software thermal slowdown",
                      f"reasons=0x{bits:x}")
        return None

    return per_gpu("clocks", snap, "clock_reasons", judge, "no hardware clock slowdown",
                   profile=ctx.profile)


@declare("temperature", "nvml", (PERIODIC,), fields=("temperature",), context="gpu")
def evaluate_temperature(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    cfg = ctx.cfg

    def judge(gpu: GpuInfo, temp: int) -> Result | None:
        if not isinstance(temp, (int, float)) or temp != temp or not -40 < temp < 200:
            return _r("temperature", UNKNOWN, "TEMP_IMPLAUSIBLE", gpu, f"impossible "
                      f"temperature {temp} C: the tool's answer cannot be trusted",
                      f"temp={temp}")
        if temp >= cfg.temperature_fail_c:
            return _r("temperature", FAIL, "GPU_TEMP", gpu, f"{temp} C (limit "
                      f"{cfg.temperature_fail_c:g} C)", f"temp={temp}C", action="drain")
        if temp >= cfg.temperature_warn_c:
            return _r("temperature", WARN, "GPU_TEMP_HIGH", gpu, f"{temp} C (warn at "
                      f"{cfg.temperature_warn_c:g} C)", f"temp={temp}C")
        return None

    return per_gpu("temperature", snap, "temperature", judge, "temperatures within limits",
                   profile=ctx.profile)


@declare("nvlink", "nvml", (PROLOG, PERIODIC), fields=("nvlink",), context="gpu")
def evaluate_nvlink(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    want = ctx.profile.nvlinks_per_gpu

    def judge(gpu: GpuInfo, states: list[bool]) -> Result | None:
        up = sum(1 for s in states if s)
        if want and up < want:
            down = [str(i) for i, s in enumerate(states) if not s]
            return _r("nvlink", FAIL, "NVLINK_DOWN", gpu, f"{up} of {want} NVLinks up",
                      f"down links: {','.join(down) or 'missing'}", action="drain")
        return None

    ns = Result("nvlink", FAIL, "NVLINK_DOWN", f"NVLink not supported, profile expects {want}")
    return per_gpu("nvlink", snap, "nvlink", judge, f"NVLinks up ({want or 'any'} per GPU)",
                   not_supported=ns if want else None, profile=ctx.profile)


@declare("pcie", "nvml", (PERIODIC,), fields=("pcie",), context="gpu")
def evaluate_pcie(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    """The link can do what the profile expects, and runs at its full width.

    An idle GPU drops the link's *generation* to save power, never its width (PCIe ASPM and
    the GPU's link-speed management change the rate; a narrower link is lanes that did not
    train), so a width below the maximum is a fault busy or idle: it fails (drain) on a
    profile that states ``pcie_width`` and warns on every other. A current generation below
    the maximum is not judged."""
    p = ctx.profile

    def judge(gpu: GpuInfo, value: tuple[int, int, int, int]) -> Result | None:
        cur_gen, cur_w, max_gen, max_w = value
        detail = f"current gen{cur_gen} x{cur_w}, max gen{max_gen} x{max_w}"
        if (p.pcie_gen and max_gen < p.pcie_gen) or (p.pcie_width and max_w < p.pcie_width):
            return _r("pcie", FAIL, "PCIE_DEGRADED", gpu, f"link capable of gen{max_gen} "
                      f"x{max_w}, profile expects gen{p.pcie_gen} x{p.pcie_width}", detail,
                      action="drain")
        if cur_w >= max_w:
            return None
        load = (f"{detail}; utilization={gpu.values.get('utilization')}% "
                f"clock_reasons={gpu.values.get('clock_reasons')}")
        reason = f"link running x{cur_w} of x{max_w} (lanes lost; idle GPUs lower only the gen)"
        if p.pcie_width:
            return _r("pcie", FAIL, "PCIE_WIDTH", gpu, reason, load, action="drain")
        return _r("pcie", WARN, "PCIE_WIDTH", gpu, reason, load)

    return per_gpu("pcie", snap, "pcie", judge, "PCIe links at their expected width",
                   profile=p)


@declare("fabric", "nvml", (PROLOG, PERIODIC), fields=("fabric",), context="gpu")
def evaluate_fabric(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    if not ctx.profile.nvswitch:
        return [Result("fabric", OK, "SKIPPED", "profile has no NVSwitch fabric")]

    def judge(gpu: GpuInfo, state: str) -> Result | None:
        if state != "completed":
            return _r("fabric", FAIL, "FABRIC_NOT_READY", gpu, f"GPU fabric state {state}",
                      f"fabric={state}", action="drain")
        return None

    ns = Result("fabric", FAIL, "FABRIC_NOT_READY", "fabric state not supported by the driver")
    return per_gpu("fabric", snap, "fabric", judge, "GPU fabric registration completed",
                   not_supported=ns, profile=ctx.profile)


@declare("recovery_action", "nvml", EVERY_SET, fields=("recovery_action",), context="gpu")
def evaluate_recovery_action(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    def judge(gpu: GpuInfo, value: int) -> Result | None:
        action, text = RECOVERY_ACTIONS.get(value, ("drain", f"unknown recovery action {value}"))
        if action == "ignore":
            return None
        return _r("recovery_action", FAIL, "GPU_RECOVERY", gpu, f"driver asks: {text}",
                  f"recovery_action={value}", action=action)

    return per_gpu("recovery_action", snap, "recovery_action", judge,
                   "driver requests no recovery action (or has no such field)", profile=ctx.profile)


@declare("gpu_procs", "nvml", (EPILOG,), fields=("processes",), context="gpu")
def evaluate_gpu_procs(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    def judge(gpu: GpuInfo, pids: list[int]) -> Result | None:
        if pids:
            return _r("gpu_procs", FAIL, "GPU_PROCS_LEFT", gpu, f"{len(pids)} process(es) "
                      "still on the GPU", "pids=" + ",".join(map(str, pids[:10])),
                      action="drain")
        return None

    return per_gpu("gpu_procs", snap, "processes", judge, "no processes left on the GPUs",
                   profile=ctx.profile)


@declare("gpu_memory", "nvml", (EPILOG,), fields=("memory",), context="gpu")
def evaluate_gpu_memory(snap: GpuSnapshot, ctx: GpuContext) -> list[Result]:
    limit = ctx.cfg.gpu_memory_used_max_mib

    def judge(gpu: GpuInfo, used: int) -> Result | None:
        if used > limit:
            return _r("gpu_memory", FAIL, "GPU_MEM_NOT_RELEASED", gpu, f"{used} MiB still in "
                      f"use (limit {limit} MiB)", f"used={used}MiB", action="reset_gpu")
        return None

    return per_gpu("gpu_memory", snap, "memory", judge, "GPU memory released", profile=ctx.profile)

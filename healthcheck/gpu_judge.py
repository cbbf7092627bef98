"""Shared parts of the GPU checks: run a judge per GPU, fail closed on NVML's errors.

:func:`per_gpu` is the contract every GPU check follows: NVML unusable is ``unknown`` (lost
is ``fail``); a per-field error is judged by :func:`_field_error`; ``NOT_SUPPORTED`` is the
check's own verdict, ``unknown`` where the profile requires the field, else not judged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from resilient_slurm.healthcheck.config import ProfileSpec

from .gpu import GpuInfo, GpuSnapshot
from .model import FAIL, OK, UNKNOWN, Result

Judge = Callable[[GpuInfo, Any], "Result | None"]


def _unusable(check: str, snap: GpuSnapshot) -> list[Result]:
    lost = "GPU_IS_LOST" in snap.error
    if snap.state == "timeout":
        return [Result(check, UNKNOWN, "NVML_TIMEOUT", snap.describe_failure(), snap.hung_call)]
    if snap.state == "init_error":
        code = "NVML_" + (snap.error.split(":")[0].split()[0] or "INIT")
        return [Result(check, UNKNOWN, code[:32], snap.describe_failure(), snap.error)]
    return [Result(check, FAIL if lost else UNKNOWN, "GPU_LOST" if lost else "NVML_ERROR",
                   snap.describe_failure(), snap.error, action="reboot" if lost else None)]


def _field_error(check: str, gpu: GpuInfo, field: str, error: str) -> Result:
    dev = f"gpu{gpu.index}"
    if error in ("GPU_IS_LOST", "GPU_NOT_FOUND"):
        return Result(check, FAIL, "GPU_LOST", f"{dev} is lost ({error} reading {field})",
                      f"{dev} {gpu.pci} {error}", action="reboot", device=dev)
    if error == "RESET_REQUIRED":
        return Result(check, FAIL, "GPU_RESET_REQUIRED", f"{dev} needs a reset (NVML)",
                      f"{dev} {gpu.pci} {error}", action="reset_gpu", device=dev)
    return Result(check, UNKNOWN, f"NVML_{error}"[:32], f"{dev}: NVML {error} reading {field}",
                  f"{dev} {gpu.pci} {field}: {error}", device=dev)


def per_gpu(check: str, snap: GpuSnapshot, field: str, judge: Judge, ok_reason: str,
            not_supported: Result | None = None,
            profile: ProfileSpec | None = None) -> list[Result]:
    """Run ``judge`` on each GPU's ``field``; one ok result when nothing was found.

    ``NOT_SUPPORTED`` for ``field``: ``not_supported``'s verdict when given, else ``unknown``
    if ``profile`` lists the field in ``nvml_required``, else not judged."""
    required = profile is not None and field in profile.nvml_required
    if not snap.usable:
        return _unusable(check, snap)
    found: list[Result] = []
    for gpu in snap.gpus:
        if gpu.lost:  # gpu_count fails it; here it simply could not be checked
            found.append(Result(check, UNKNOWN, "GPU_LOST", f"gpu{gpu.index}: not checked (lost)",
                                f"gpu{gpu.index} {gpu.pci} {gpu.lost}", device=f"gpu{gpu.index}"))
            continue
        err = gpu.errors.get(field)
        if err == "NOT_SUPPORTED":
            if not_supported is not None:
                found.append(Result(check, not_supported.status, not_supported.code,
                                    f"gpu{gpu.index}: {not_supported.reason}",
                                    f"gpu{gpu.index} {gpu.pci}", action=not_supported.action,
                                    device=f"gpu{gpu.index}"))
            elif required:
                found.append(Result(check, UNKNOWN, "NVML_NOT_SUPPORTED", f"gpu{gpu.index}: "
                                    f"NVML cannot read {field}, which the profile requires "
                                    "(nvml_required)", f"gpu{gpu.index} {gpu.pci} {field}: "
                                    "NOT_SUPPORTED", device=f"gpu{gpu.index}"))
            continue
        if err:
            found.append(_field_error(check, gpu, field, err))
            continue
        if field not in gpu.values:
            continue
        r = judge(gpu, gpu.values[field])
        if r is not None:
            found.append(r)
    return found or [Result(check, OK, "OK", ok_reason, values_seen(snap, field))]


_SHOW: dict[str, Callable[[Any], str]] = {
    "ecc": lambda v: f"volatile={v[0]} aggregate={v[1]}",
    "remapped_rows": lambda v: f"correctable={v[0]} uncorrectable={v[1]} pending={v[2]} "
                               f"failure={v[3]}",
    "retired_pages": lambda v: f"dbe_pages={v[0]} pending={v[1]}",
    "clock_reasons": lambda v: f"0x{int(v):x}",
    "temperature": lambda v: f"{v}C",
    "nvlink": lambda v: f"{sum(1 for up in v if up)}/{len(v)} up",
    "pcie": lambda v: f"gen{v[0]} x{v[1]} (max gen{v[2]} x{v[3]})",
}


def values_seen(snap: GpuSnapshot, field: str) -> str:
    """What NVML said for ``field`` on each GPU (``clock_reasons: gpu0 0x1; gpu1 0x1``): an ok
    result's evidence, so a report shows the values it judged, not only the verdict."""
    show = _SHOW.get(field, str)
    parts = []
    for gpu in snap.gpus:
        if field in gpu.values:
            parts.append(f"gpu{gpu.index} {show(gpu.values[field])}")
        elif field in gpu.errors:
            parts.append(f"gpu{gpu.index} {gpu.errors[field]}")
    return f"{field}: " + "; ".join(parts) if parts else ""


def _r(check: str, status: str, code: str, gpu: GpuInfo, reason: str, detail: str = "",
       action: str | None = None) -> Result:
    dev = f"gpu{gpu.index}"
    return Result(check, status, code, f"{dev}: {reason}", f"{dev} {gpu.pci} {detail}".strip(),
                  action=action, device=dev)

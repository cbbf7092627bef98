"""The real GPU backend: pynvml (nvidia-ml-py), imported only when this path is used.

Every NVML error becomes a :class:`~.gpu.GpuError` named after NVML's error constant
(``GPU_IS_LOST``, ``NOT_SUPPORTED``, ``DRIVER_NOT_LOADED`` ...); a missing library becomes
``LIBRARY_NOT_FOUND``; a call this nvidia-ml-py lacks or takes differently becomes
``BINDING_MISMATCH`` (that field only). Timeouts are the gather's job
(:func:`.gpu.gather_gpus`).
"""

from __future__ import annotations

import ctypes
import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from .gpu import GpuError

F = TypeVar("F", bound=Callable[..., Any])

_FABRIC = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


def _error_name(nv: Any, exc: Exception) -> str:
    value = getattr(exc, "value", None)
    for name in dir(nv):
        if name.startswith("NVML_ERROR_") and getattr(nv, name) == value:
            return name[len("NVML_ERROR_"):]
    return f"NVML_ERROR_{value}"


def _nvml(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(self: NvmlBackend, *args: Any) -> Any:
        try:
            return fn(self, *args)
        except GpuError:
            raise
        except self.nv.NVMLError as exc:
            raise GpuError(_error_name(self.nv, exc), str(exc)) from None
        except (AttributeError, TypeError) as exc:
            # This nvidia-ml-py lacks the call or takes other arguments: that field is
            # unknown, the other fields are still read.
            raise GpuError("BINDING_MISMATCH", f"{fn.__name__}: {exc}") from None

    return wrapper  # type: ignore[return-value]


class NvmlBackend:
    """pynvml behind :class:`~.gpu.GpuBackend`."""

    def __init__(self) -> None:
        self.nv: Any = None
        self._handles: dict[int, Any] = {}

    def init(self) -> None:
        try:
            with warnings.catch_warnings():  # some pynvml builds warn about their own name
                warnings.simplefilter("ignore", FutureWarning)
                import pynvml  # lazy: only the real NVML path pays for it
        except ImportError as exc:
            raise GpuError("LIBRARY_NOT_FOUND", f"pynvml: {exc}") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuError(_error_name(pynvml, exc), str(exc)) from None

    def shutdown(self) -> None:
        if self.nv is not None:
            self.nv.nvmlShutdown()

    def _h(self, i: int) -> Any:
        if i not in self._handles:
            self._handles[i] = self.nv.nvmlDeviceGetHandleByIndex(i)
        return self._handles[i]

    @_nvml
    def driver_version(self) -> str:
        v = self.nv.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    @_nvml
    def count(self) -> int:
        return int(self.nv.nvmlDeviceGetCount())

    @_nvml
    def identity(self, i: int) -> dict[str, Any]:
        nv, h = self.nv, self._h(i)

        def s(v: Any) -> str:
            return v.decode() if isinstance(v, bytes) else str(v)

        arch: Any = None
        try:
            arch = int(nv.nvmlDeviceGetArchitecture(h))
        except nv.NVMLError:
            pass
        return {"name": s(nv.nvmlDeviceGetName(h)), "uuid": s(nv.nvmlDeviceGetUUID(h)),
                "pci": s(nv.nvmlDeviceGetPciInfo(h).busId), "architecture": arch}

    @_nvml
    def ecc_uncorrected(self, i: int) -> tuple[int, int]:
        nv, h = self.nv, self._h(i)
        unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return (int(nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_VOLATILE_ECC)),
                int(nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_AGGREGATE_ECC)))

    @_nvml
    def ecc_mode(self, i: int) -> tuple[bool, bool]:
        current, pending = self.nv.nvmlDeviceGetEccMode(self._h(i))
        return bool(current), bool(pending)

    @_nvml
    def utilization(self, i: int) -> int:
        return int(self.nv.nvmlDeviceGetUtilizationRates(self._h(i)).gpu)

    @_nvml
    def remapped_rows(self, i: int) -> tuple[int, int, bool, bool]:
        corr, unc, pending, failure = self.nv.nvmlDeviceGetRemappedRows(self._h(i))
        return int(corr), int(unc), bool(pending), bool(failure)

    @_nvml
    def retired_pages(self, i: int) -> tuple[int, bool]:
        nv, h = self.nv, self._h(i)
        pages = nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = nv.nvmlDeviceGetRetiredPagesPendingStatus(h)
        return len(pages), bool(pending)

    @_nvml
    def clock_reasons(self, i: int) -> int:
        return int(self.nv.nvmlDeviceGetCurrentClocksEventReasons(self._h(i)))

    @_nvml
    def temperature(self, i: int) -> int:
        return int(self.nv.nvmlDeviceGetTemperature(self._h(i), self.nv.NVML_TEMPERATURE_GPU))

    @_nvml
    def nvlink(self, i: int) -> list[bool]:
        nv, h = self.nv, self._h(i)
        states = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                states.append(bool(nv.nvmlDeviceGetNvLinkState(h, link)))
            except nv.NVMLError as exc:
                if _error_name(nv, exc) in ("NOT_SUPPORTED", "INVALID_ARGUMENT"):
                    continue  # this GPU has no such link
                raise
        return states

    @_nvml
    def pcie(self, i: int) -> tuple[int, int, int, int]:
        nv, h = self.nv, self._h(i)
        return (int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                int(nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
                int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                int(nv.nvmlDeviceGetMaxPcieLinkWidth(h)))

    @_nvml
    def fabric(self, i: int) -> str:
        info = self.nv.c_nvmlGpuFabricInfo_t()  # nvidia-ml-py fills the caller's struct
        self.nv.nvmlDeviceGetGpuFabricInfo(self._h(i), ctypes.byref(info))
        state = _FABRIC.get(int(info.state), f"state{int(info.state)}")
        if state == "completed" and int(getattr(info, "status", 0)) != 0:
            return f"completed_with_error{int(info.status)}"
        return state

    @_nvml
    def recovery_action(self, i: int) -> int:
        nv = self.nv
        (value,) = nv.nvmlDeviceGetFieldValues(self._h(i), [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        ret = int(value.nvmlReturn)
        if ret in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_INVALID_ARGUMENT):
            raise GpuError("NOT_SUPPORTED", "recovery action field unavailable (driver < 570?)")
        if ret != 0:
            raise GpuError(_error_name(nv, nv.NVMLError(ret)), "recovery action field")
        return int(value.value.uiVal)

    @_nvml
    def processes(self, i: int) -> list[int]:
        return [int(p.pid) for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self._h(i))]

    @_nvml
    def memory_used_mib(self, i: int) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self._h(i)).used) // (1024 * 1024)

    @_nvml
    def ecc_corrected(self, i: int) -> int:
        nv = self.nv
        return int(nv.nvmlDeviceGetTotalEccErrors(
            self._h(i), nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))

    @_nvml
    def nvlink_crc(self, i: int) -> int:
        nv, h = self.nv, self._h(i)
        total, links = 0, 0
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                total += int(nv.nvmlDeviceGetNvLinkErrorCounter(
                    h, link, nv.NVML_NVLINK_ERROR_DL_CRC_FLIT))
                links += 1
            except nv.NVMLError as exc:
                if _error_name(nv, exc) in ("NOT_SUPPORTED", "INVALID_ARGUMENT"):
                    continue  # this GPU has no such link
                raise
        if not links:
            raise GpuError("NOT_SUPPORTED", "no NVLink error counters")
        return total

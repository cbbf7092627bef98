"""The real pynvml backend against nvidia-ml-py's own call signatures.

No GPU here, so the C library is replaced: every ``nvml*`` function the backend calls is a
stand-in that first binds its arguments to the installed nvidia-ml-py function's signature (a
call nvidia-ml-py would reject fails here too), then answers like an idle H200 would. The
structures, constants and error classes are nvidia-ml-py's own.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

from resilient_slurm.healthcheck.gpu import gather_gpus  # noqa: E402
from resilient_slurm.healthcheck.nvml import NvmlBackend  # noqa: E402


def _not_supported(*_: Any) -> Any:
    raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def _fabric(_handle: Any, info: Any) -> int:
    struct = info._obj  # ctypes.byref(...) of the caller's c_nvmlGpuFabricInfo_t
    struct.state, struct.status = 3, 0  # NVML_GPU_FABRIC_STATE_COMPLETED, success
    return 0


def _fields(_handle: Any, ids: list[int]) -> Any:
    values = (pynvml.c_nvmlFieldValue_t * len(ids))()
    for v, fid in zip(values, ids, strict=True):
        v.fieldId, v.nvmlReturn, v.value.uiVal = fid, 0, 0
    return values


H200 = {
    "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
    "nvmlSystemGetDriverVersion": lambda: "580.65.06", "nvmlDeviceGetCount": lambda: 1,
    "nvmlDeviceGetHandleByIndex": lambda i: object(),
    "nvmlDeviceGetName": lambda h: "NVIDIA H200", "nvmlDeviceGetUUID": lambda h: "GPU-1234",
    "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(busId="00000000:19:00.0"),
    "nvmlDeviceGetArchitecture": lambda h: 9,
    "nvmlDeviceGetTotalEccErrors": lambda h, t, c: 0,
    "nvmlDeviceGetEccMode": lambda h: [1, 1],
    "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=0, memory=0),
    "nvmlDeviceGetRemappedRows": lambda h: (2, 0, 0, 0),
    "nvmlDeviceGetRetiredPages": _not_supported,
    "nvmlDeviceGetRetiredPagesPendingStatus": _not_supported,
    "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 1,
    "nvmlDeviceGetTemperature": lambda h, s: 31, "nvmlDeviceGetNvLinkState": _not_supported,
    "nvmlDeviceGetNvLinkErrorCounter": _not_supported,
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 1,
    "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 16,
    "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: 5,
    "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
    "nvmlDeviceGetGpuFabricInfo": _fabric, "nvmlDeviceGetFieldValues": _fields,
    "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
    "nvmlDeviceGetMemoryInfo": lambda h, version=None: types.SimpleNamespace(used=5 << 20),
}


def _strict(name: str, answer: Any) -> Any:
    real = inspect.signature(getattr(pynvml, name))

    def call(*args: Any, **kwargs: Any) -> Any:
        real.bind(*args, **kwargs)  # TypeError exactly where nvidia-ml-py would raise one
        return answer(*args, **kwargs)

    return call


@pytest.fixture
def fake_pynvml(monkeypatch) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    for name in dir(pynvml):
        if not name.startswith("nvml"):
            setattr(mod, name, getattr(pynvml, name))  # constants, structs, NVMLError
    for name, answer in H200.items():
        setattr(mod, name, _strict(name, answer))
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_every_field_reads_through_nvidia_ml_py_signatures(fake_pynvml) -> None:
    snap = gather_gpus(NvmlBackend(), 5.0)
    assert snap.usable, snap.describe_failure()
    (gpu,) = snap.gpus
    assert (snap.driver, snap.count, gpu.name, gpu.pci) == ("580.65.06", 1, "NVIDIA H200",
                                                            "00000000:19:00.0")
    assert gpu.values == {
        "ecc": (0, 0), "ecc_mode": (True, True), "utilization": 0,
        "remapped_rows": (2, 0, False, False), "clock_reasons": 1, "temperature": 31,
        "nvlink": [], "pcie": (1, 16, 5, 16), "fabric": "completed",
        "recovery_action": 0, "processes": [], "memory": 5, "ecc_corrected": 0}
    assert gpu.errors == {"retired_pages": "NOT_SUPPORTED", "nvlink_crc": "NOT_SUPPORTED"}


def test_a_call_this_binding_lacks_fails_that_field_only(fake_pynvml) -> None:
    del fake_pynvml.nvmlDeviceGetGpuFabricInfo
    fake_pynvml.nvmlDeviceGetTemperature = _strict("nvmlDeviceGetTemperature",
                                                   lambda h: 31)  # takes too few arguments
    snap = gather_gpus(NvmlBackend(), 5.0)
    assert snap.usable
    (gpu,) = snap.gpus
    assert gpu.errors["fabric"] == "BINDING_MISMATCH"
    assert "temperature" not in gpu.values and gpu.errors["temperature"] == "BINDING_MISMATCH"
    assert gpu.values["pcie"] == (1, 16, 5, 16)

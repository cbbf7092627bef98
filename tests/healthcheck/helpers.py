"""Helpers shared by the health-check tests (configs, scenario files)."""

from __future__ import annotations

import os
from typing import Any

from resilient_slurm.config import Config, load_config
from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck.config import HealthConfig, ProfileSpec
from resilient_slurm.healthcheck.gpu import GpuInfo, GpuSnapshot
from resilient_slurm.healthcheck.klog.sources import LogRead, LogRecord
from resilient_slurm.healthcheck.policy import load_policy
from resilient_slurm_lab.hardware.plugin import ScenarioHardware


def make_config(tmp: str, text: str = "", **health: Any) -> Config:
    """A config whose state dir is under ``tmp``; ``text`` is extra TOML for ``[health]``."""
    path = os.path.join(tmp, "config.toml")
    with open(path, "w") as fh:
        fh.write("[health]\n")
        fh.write(f'state_dir = "{os.path.join(tmp, "state")}"\n')
        fh.write(text)
    return load_config(path, env={}, overrides={"health": health} if health else None)


def on_nodes(request: Any, nodes_dir: str) -> ScenarioHardware:
    """Every run of this test in this process (``check_node``, ``seams``, the CLI invoked
    in-process) on the simulated nodes ``<nodes_dir>/<node>/scenario.toml`` (installed with
    ``install_scenario``), as a hook's entry point given the lab's hardware runs."""
    from resilient_slurm.healthcheck import seams

    hardware = ScenarioHardware(os.path.join(nodes_dir, "{node}", "scenario.toml"))
    plugged = seams.using(hardware)
    plugged.__enter__()
    request.addfinalizer(lambda: plugged.__exit__(None, None, None))
    return hardware


def write_scenario(directory: str, name: str, body: str, base: str = "healthy-p5") -> str:
    """A scenario file ``<directory>/<name>.toml`` = ``base`` + ``body`` (TOML text)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.toml")
    with open(path, "w") as fh:
        fh.write(f'base = "{base}"\n{body}\n' if base else body)
    return path


def by_check(report: Any, check: str) -> list[Any]:
    return [r for r in report.results if r.check == check]


# A p5-like profile and a healthy 8-GPU snapshot for the pure GPU-check tests.
P5 = ProfileSpec(gpus=8, gpu_generation="hopper", nvlinks_per_gpu=18, nvswitch=True,
                 pcie_gen=5, pcie_width=16)
HEALTHY: dict[str, Any] = {
    "ecc": (0, 0), "remapped_rows": (0, 0, False, False), "retired_pages": (0, False),
    "clock_reasons": 1, "temperature": 40, "nvlink": [True] * 18, "pcie": (1, 16, 5, 16),
    "fabric": "completed", "recovery_action": 0, "processes": [], "memory": 0,
}


def snap(n: int = 8, **per_gpu: dict[str, Any]) -> GpuSnapshot:
    gpus = []
    for i in range(n):
        values = dict(HEALTHY)
        errors: dict[str, str] = {}
        for k, v in per_gpu.get(f"g{i}", {}).items():
            if isinstance(v, str) and v.isupper():
                errors[k] = v
                values.pop(k, None)
            else:
                values[k] = v
        gpus.append(GpuInfo(i, "NVIDIA H100 80GB HBM3", f"GPU-{i}", f"00000000:{0x53 + i:02X}:00.0",
                            9, values, errors))
    return GpuSnapshot(driver="550", count=n, gpus=gpus)


# -- kernel-log checks: a read of given lines, and the checks' context ---------------------
def read(*lines: str, uptime: float = 86400.0, error: str = "") -> LogRead:
    return LogRead("file", "boot", uptime, [LogRecord(i, None, t) for i, t in enumerate(lines)],
                   {"source": "file", "boot_id": "boot", "seq": len(lines)}, error=error)


def ctx(cfg: HealthConfig | None = None, gen: str = "hopper") -> cl.LogContext:
    cfg = cfg or HealthConfig()
    pci = {f"0000:{b}:00": (i, gen) for i, b in enumerate(["53", "64", "75", "86"])}
    return cl.LogContext(cfg, lambda g: load_policy(g, cfg), pci, gen)

"""Verdicts on the newest hardware (issue 36 items 10-12): NVML's generation picks the Xid
column, the EFA / InfiniBand driver lines as the drivers print them, and what the Xid catalog
decodes (Xid 154 by value, Xid 74's ignorable bits)."""

from __future__ import annotations

import dataclasses

from resilient_slurm.healthcheck import checks_gpu as cg
from resilient_slurm.healthcheck.config import HealthConfig
from resilient_slurm.healthcheck.gpu import GpuSnapshot
from resilient_slurm.healthcheck.seams import check_node

from .helpers import P5, by_check, make_config, snap


def _as(snapshot: GpuSnapshot, name: str, arch: object) -> GpuSnapshot:
    gpus = [dataclasses.replace(g, name=name, architecture=arch) for g in snapshot.gpus]
    return dataclasses.replace(snapshot, gpus=gpus)


# -- item 10: NVML's generation decides ------------------------------------------------------

def test_a_profile_generation_nvml_contradicts_is_unknown_with_the_reason():
    """Was ok: B200 GPUs under the p5 (Hopper) profile passed gpu_count as healthy."""
    results = cg.evaluate_gpu_count(_as(snap(), "NVIDIA B200", 10), cg.GpuContext(HealthConfig(),
                                                                                   P5))
    assert {(r.status, r.code) for r in results} == {("unknown", "GPU_GENERATION")}
    assert [r.device for r in results] == [f"gpu{i}" for i in range(8)]
    assert "blackwell by NVML" in results[0].reason and "expects hopper" in results[0].reason
    # NVML agreeing with the profile, or not naming a generation, is no mismatch.
    assert [r.status for r in cg.evaluate_gpu_count(snap(), cg.GpuContext(HealthConfig(), P5))] \
        == ["ok"]
    unnamed = _as(snap(), "NVIDIA Future GPU", 42)
    assert [r.status for r in cg.evaluate_gpu_count(unnamed, cg.GpuContext(HealthConfig(), P5))] \
        == ["ok"]


def test_b200_under_the_p5_profile_judges_nvlink5_by_the_blackwell_column(tmp_path):
    """Was: the fatal NVLink5 Xid was judged by the profile's Hopper column (not listed there:
    ``unknown``), and nothing said the profile was wrong for the node."""
    cfg = make_config(str(tmp_path), nvml_timeout_s=2.0, watchdog_s=10.0)
    report = check_node(cfg, simulate="b200-under-p5", node="sim1")
    (x,) = by_check(report, "xid")
    assert (x.status, x.code, x.device, x.action) == ("fail", "XID145", "gpu0", "reset_gpu")
    assert "[policy blackwell:" in x.evidence and "144-150 decode" in x.evidence
    gen = {(r.status, r.code) for r in by_check(report, "gpu_count")}
    assert gen == {("unknown", "GPU_GENERATION")}
    assert report.exit_code == 1


def test_gb200_named_with_a_blackwell_architecture_is_grace_blackwell():
    from resilient_slurm.healthcheck.policy import generation_of
    assert generation_of("NVIDIA GB200", "blackwell") == "grace_blackwell"
    assert generation_of("NVIDIA GB200", 10) == "grace_blackwell"
    assert generation_of("NVIDIA B200", "blackwell") == "blackwell"

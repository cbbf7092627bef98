"""NVRx's requirements for in-process restart (issue 37, item 9): the launcher sets the NCCL
variables the job left unset and keeps the user's; the ranks check them with torch's and
NCCL's versions; where CUDA runs a requirement not met refuses the run, on a CPU torch (gloo)
it is only reported, and the NCCL version is ``unknown`` there, never ``ok``."""

from __future__ import annotations

import pytest

from resilient_slurm.launcher.cycle.inprocess_plan import worker_env
from resilient_slurm.training import nccl_requirements as req

GOOD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0"}


def test_the_launcher_sets_what_the_job_left_unset_and_keeps_the_users() -> None:
    env = worker_env("h:1", 2, "8", job_env={})
    assert {k: env[k] for k in GOOD_ENV} == GOOD_ENV
    kept = worker_env("h:1", 2, "8", job_env={"NCCL_NVLS_ENABLE": "1"})
    assert "NCCL_NVLS_ENABLE" not in kept  # the job's own value reaches the ranks unchanged
    assert kept["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0"


@pytest.mark.parametrize(("torch_v", "nccl", "cuda", "want"), [
    ("2.13.0+cpu", None, False, {"torch": "ok", "nccl": "unknown"}),
    ("2.5.1", (2, 26, 2), True, {"torch": "ok", "nccl": "ok"}),
    ("2.5.0", (2, 26, 2), True, {"torch": "fail", "nccl": "ok"}),
    ("2.6.0+cu124", (2, 21, 5), True, {"torch": "ok", "nccl": "fail"}),
    ("2.6.0", None, True, {"torch": "ok", "nccl": "unknown"}),
])
def test_versions(torch_v, nccl, cuda, want) -> None:
    got = {r.name: r.status for r in req.check_versions(torch_v, nccl, cuda)}
    assert got == want


def test_refused_only_where_cuda_runs() -> None:
    def facts(cuda: bool):
        return lambda: ("2.6.0", (2, 21, 5) if cuda else None, cuda)

    found, cuda = req.check({"NCCL_NVLS_ENABLE": "1"}, facts(False))
    assert not cuda and req.refusals(found, cuda) == []  # CPU: reported, never a failure
    bad = {r.name: r.status for r in found}
    assert bad["NCCL_NVLS_ENABLE"] == "fail" and bad["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "fail"
    assert bad["nccl"] == "unknown"
    found, cuda = req.check({"NCCL_NVLS_ENABLE": "1"}, facts(True))
    refused = {r.name for r in req.refusals(found, cuda)}
    assert refused == {"NCCL_NVLS_ENABLE", "TORCH_NCCL_RETHROW_CUDA_ERRORS", "nccl"}
    found, cuda = req.check(GOOD_ENV, lambda: ("2.6.0", (2, 27, 3), True))
    assert req.refusals(found, cuda) == []


def test_the_ranks_check_on_this_cpu_torch_reports_and_goes_on(capsys) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("nvidia_resiliency_ext.inprocess")
    from resilient_slurm.training import inprocess

    inprocess.check_requirements({})  # no raise on CPU
    out = capsys.readouterr().out
    assert "NCCL_NVLS_ENABLE: fail" in out and "nccl: unknown" in out
    inprocess.check_requirements(dict(GOOD_ENV))
    assert "NCCL_NVLS_ENABLE" not in capsys.readouterr().out

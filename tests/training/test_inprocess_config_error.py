"""Level 0 never retries a configuration error (issue 36 item 9): three local ranks of
``train_fsdp.py --inprocess`` given one node-memory folder (``RESILIENT_TIER1_DIR`` without
``{node}``). Every rank meets the same error at its first snapshot; each reports it once
(``config_error``) and exits with ``fatal.EXIT_CONFIG``, in its first iteration: no in-process
restart. Before, each rank raised the error again on every one of level 0's restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from resilient_slurm.fatal import EXIT_CONFIG

pytestmark = pytest.mark.train

pytest.importorskip("torch")
pytest.importorskip("nvidia_resiliency_ext.inprocess")

from tests.training.inprocess_harness import run_job  # noqa: E402


def test_a_configuration_error_is_not_restarted_in_process(tmp_path: Path) -> None:
    res = run_job(tmp_path, 8, env_extra={"RESILIENT_TIER1_DIR": str(tmp_path / "shared")},
                  timeout=240)
    out = "\n".join(o[-2000:] for o in res.outputs)
    assert res.rcs == [EXIT_CONFIG] * 3, out
    reported = res.kind("config_error")
    assert sorted(e["rank"] for e in reported) == [0, 1, 2], (reported, out)
    assert any("is also node" in e["message"] for e in reported), reported
    assert all("each node needs a folder of its own (RESILIENT_TIER1_DIR)" in e["message"]
               for e in reported), reported
    assert not res.kind("recovered"), out  # level 0 never re-entered the training
    assert out.count("configuration error, not restarted") == 3, out

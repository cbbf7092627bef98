"""scripts/gpu-proof.sh --dry-run: every step of the GPU proof planned and checked on CPU (the
health steps run for real on a simulated node, the NVML hang included); GPU steps skipped with
the reason. The device run itself is the proof (docs/gpu-proof.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "gpu-proof.sh")
STEPS = ["budget", "install", "environment", "genconf", "health-check", "nvml-hang",
         "train-reference", "train-faults", "stall-sync", "stall-async", "memory-tiers",
         "tiers-scale"]


def _dry(tmp_path, **env: str) -> tuple[subprocess.CompletedProcess[str], str]:
    out = str(tmp_path / "out")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RESILIENT_", "GPU_PROOF"))}
    full.update(PYTHON=sys.executable, **env)
    proc = subprocess.run([SCRIPT, "--dry-run", out], capture_output=True, text=True,
                          timeout=600, env=full)
    return proc, out


@pytest.mark.train
def test_dry_run_plans_and_checks_every_step(tmp_path) -> None:
    proc, out = _dry(tmp_path, GPU_PROOF_WHEELS=str(tmp_path / "none"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["verdict"] == "PASS" and summary["dry_run"] is True
    lines = {x["step"]: x for x in summary["lines"] if not x["step"].startswith(" ")}
    assert list(lines) == STEPS
    assert lines["budget"]["result"] == "PASS"
    assert "of 600 s" in lines["budget"]["figure"]
    for step in ("environment", "genconf", "health-check", "nvml-hang"):
        assert lines[step]["result"] == "PASS", lines[step]
    assert "NVML checks with values: 10/10 (0 not expected" in lines["health-check"]["figure"]
    assert "exit 3, status unknown" in lines["nvml-hang"]["figure"]
    for step in STEPS[6:]:
        assert lines[step]["result"] == "SKIP"
        assert lines[step]["figure"].startswith("dry run: planned `")
        assert lines[step]["detail"] == "arguments checked"
    assert "--fault exception@12 --fault sigkill@27" in lines["train-faults"]["figure"]
    text = open(os.path.join(out, "summary.txt")).read()
    assert text.splitlines()[0].split(" DRY RUN ")[1].startswith("PASS")
    files = sorted(os.listdir(out))
    assert files == ["health-check.json", "logs.tar.gz",
                     "nvml-hang.json", "profile.toml", "summary.json", "summary.txt"]
    assert len(files) <= 8  # what the device tool brings back
    hang = json.loads(open(os.path.join(out, "nvml-hang.json")).read())
    assert {r["code"] for r in hang["results"] if r["check"] == "temperature"} == {"NVML_TIMEOUT"}


def test_an_incomplete_wheel_folder_fails_the_run(tmp_path) -> None:
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        from gpu_proof_report import Line, finish, install_line
    finally:
        sys.path.pop(0)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "click-8.1.0-py3-none-any.whl").write_bytes(b"x")
    line = install_line(None, str(wheels))
    assert line.result == "FAIL" and "nvidia_resiliency_ext-" in line.detail
    assert install_line(None, str(tmp_path / "absent")).result == "SKIP"
    assert install_line(50.0, "").result == "FAIL"  # over its 45 s cap
    logs = tmp_path / "logs"
    logs.mkdir()
    proof = types.SimpleNamespace(lines=[Line("budget", "PASS", "x"), line], out=str(tmp_path),
                                  logs=str(logs), dry=True, rehearse=False)
    assert finish(proof, 1.0) == 1
    assert "DRY RUN FAIL: 1 pass, 1 fail" in (tmp_path / "summary.txt").read_text()


def test_usage_errors(tmp_path) -> None:
    for argv in ([], ["--bogus", "x"], ["a", "b"]):
        proc = subprocess.run([SCRIPT, *argv], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "gpu-proof" in proc.stderr

"""The templates on the real sandbox cluster: fsdp.sbatch (resilient-launch) with an
injected exception and SIGKILL ends with the same weights as fsdp-baseline.sbatch fault-free."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from resilient_slurm.checkpoint import layout  # noqa: E402
from resilient_slurm.events import read_events  # noqa: E402
from resilient_slurm_lab.faults import TRAIN_SCRIPT as FAULTS_TRAIN  # noqa: E402

SBATCH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "sbatch"))
# Threads pinned, as in every bitwise test here: on CPU, a fault-free 2-thread run beside other
# jobs once ended with other weights than the same run alone (tests/training/test_train_fsdp.py:
# "BLAS results depend on them").
ARGS = ["--steps", "20", "--checkpoint-every", "5", "--seed", "3", "--threads", "1"]


def _submit(sandbox, tmp_path, template: str, name: str, extra: list[str],
            script: str | None = None) -> tuple[str, str]:
    """``script``: the template's TRAIN_SCRIPT (default: the example it ships with)."""
    work = tmp_path / name
    work.mkdir()
    env = {**os.environ, **({"TRAIN_SCRIPT": script} if script else {}),
           "SLURM_CONF": sandbox.conf, "RESILIENT_SANDBOX_DIR": sandbox.root,
           "PATH": os.path.dirname(sys.executable) + ":" + os.environ.get("PATH", ""),
           "RESILIENT_EVENTS_FILE": str(work / "events.jsonl"), "FT_HB_TIMEOUT": "30",
           "FT_INITIAL_HB_TIMEOUT": "120", "PG_TIMEOUT": "60", "FT_TERM_TIMEOUT": "5"}
    out = subprocess.run(["sbatch", "--parsable", "-N2", f"--output={work}/slurm-%j.out",
                          f"--chdir={work}", os.path.join(SBATCH, template),
                          "--checkpoint-dir", str(work / "ckpt"), *ARGS, *extra],
                         env=env, capture_output=True, text=True, check=True, timeout=30)
    return out.stdout.strip().split(";")[0], str(work)


def _wait(sandbox, job: str, timeout: float) -> str:
    env = {**os.environ, "SLURM_CONF": sandbox.conf}
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True,
                             text=True, timeout=30).stdout
        m = re.search(r"JobState=(\S+)", out)
        state = m.group(1) if m else "GONE"
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"):
            return state
        time.sleep(2)
    subprocess.run(["scancel", job], env=env, timeout=30, check=False)
    return f"still {state}"


def _digests(work: str) -> set[str]:
    text = "".join(open(os.path.join(work, n)).read() for n in os.listdir(work)
                   if n.startswith("slurm-"))
    return set(re.findall(r"weights digest: ([0-9a-f]{64})", text))


@pytest.mark.slurm
@pytest.mark.train
def test_templates_on_sandbox_same_weights(sandbox, tmp_path) -> None:
    faults = ["--fault-count", "2", "--fault-seed", "4", "--fault-types", "exception,sigkill"]
    res_job, res = _submit(sandbox, tmp_path, "fsdp.sbatch", "resilient", faults, FAULTS_TRAIN)
    base_job, base = _submit(sandbox, tmp_path, "fsdp-baseline.sbatch", "baseline", [])
    assert _wait(sandbox, res_job, 420) == "COMPLETED", open(
        os.path.join(res, f"slurm-{res_job}.out")).read()[-3000:]
    assert _wait(sandbox, base_job, 300) == "COMPLETED"
    digests = _digests(res)
    assert len(digests) == 1 and digests == _digests(base)
    # fsdp.sbatch runs resilient-launch, whose state dir collects the training's events too.
    events = list(read_events(os.path.join(res, "ckpt", ".resilient", "events.jsonl")))
    fired = [e for e in events if e["kind"] == "fault" and e.get("source") == "training"]
    assert [e["type"] for e in fired] == ["exception", "sigkill"]
    verdicts = [e for e in events if e["kind"] == "verdict" and e.get("source") == "launcher"]
    assert verdicts and verdicts[-1]["exit_code"] == 0
    assert not [e for e in events if e["kind"] == "requeue"]  # handled in-job
    assert all(e.get("node", "").startswith("node") for e in fired)
    assert layout.latest_committed_step(os.path.join(res, "ckpt")) == 20

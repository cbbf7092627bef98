"""The frameworks themselves through resilient-launch on the sandbox, each script unchanged
but for its launch word (``tests/launcher/foreign/``: PyTorch Lightning, Hugging Face
Trainer; no NVRx, no heartbeats, nothing of resilient_slurm). One job per framework, 3 nodes
with ``--spares 1`` (2 train), no heartbeat timeout given (the instrumentation derives it
from the 0.2 s steps), no checkpoint flag (the directory comes from the script's own
argument), and four stretches in it: fault-free steps, a SIGKILLed rank, a SIGSTOPped rank
(found within the derived timeout and restarted in the job, the report naming the stopped
rank), then a node fault (the node's simulated GPU lost and its rank killed: the hooks drain
it, a spare takes its place, same world size). Every fault line of the report has a step, a
recovery time and lost steps; goodput comes from the instrumented steps."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from pathlib import Path

import launch_helpers  # type: ignore[import-not-found]  # tests/launcher is on sys.path
import pytest

from resilient_slurm.events import read_events
from resilient_slurm.launcher.report import report

pytestmark = [pytest.mark.slurm, pytest.mark.train]

pytest.importorskip("nvidia_resiliency_ext")

HERE = os.path.dirname(os.path.abspath(__file__))
FOREIGN = os.path.join(HERE, "foreign")
BIN = os.path.dirname(sys.executable)
# The node fault comes at about step 35 (12 fault-free steps, then 14 and 5 after each restart,
# resuming from the checkpoint every 10): 60 leaves the job 25 steps on the spare to finish with.
STEPS = 60

FRAMEWORKS = {
    "lightning": ("pytorch_lightning", "train_lightning.py",
                  ["--num-nodes=2", f"--max-steps={STEPS}", "--ckpt-dir={work}/ck",
                   "--every=10"], "ck"),
    "hf": ("transformers", "train_hf.py",
           ["--output_dir={work}/out", f"--max_steps={STEPS}", "--save_steps=10"], "out"),
}


def submit(slurm, sandbox, work: Path, script: str, args: list[str]) -> int:
    """The user's `srun torchrun --nnodes=2 --nproc-per-node=1 ... script.py ARGS` with
    `exec resilient-launch --spares 1` in its place (one more node allocated)."""
    line = [os.path.join(BIN, "resilient-launch"), "--nproc-per-node=1", "--spares=1",
            "--max-restarts=5", "--term-timeout=3",
            f"--verdict-path={sandbox.p('verdicts', '{node}.json')}",
            os.path.join(FOREIGN, script), *[a.replace("{work}", str(work)) for a in args]]
    batch = work / "job.sbatch"
    batch.write_text("#!/bin/bash\nexec " + " ".join(line) + "\n")
    env = {**os.environ, "SLURM_CONF": sandbox.conf, "PATH": BIN + ":" + os.environ["PATH"]}
    return slurm.submit(str(batch), ["--nodes=3", "--requeue", "--open-mode=append",
                                     f"--output={work}/slurm-%j.out", f"--chdir={work}",
                                     "--job-name=rl-framework"], env=env)


def rank_proc(jid: int, script: str, rank: int) -> tuple[int, str] | None:
    """(pid, node) of the job's rank ``rank`` running ``script``, from /proc."""
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = dict(kv.split(b"=", 1) for kv in
                       Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
        except (OSError, ValueError):
            continue
        if script.encode() in cmd and b"ft_launcher" not in cmd \
                and env.get(b"SLURM_JOB_ID") == str(jid).encode() \
                and env.get(b"RANK") == str(rank).encode():
            return int(pid), env.get(b"SLURMD_NODENAME", b"").decode()
    return None


class Job:
    def __init__(self, state: str, log: Path) -> None:
        self.events = os.path.join(state, "events.jsonl")
        self.log = log

    def of(self, kind: str) -> list[dict]:
        return [e for e in read_events(self.events) if e.get("kind") == kind]

    def step(self) -> int:
        return max((e["step"] for e in self.of("progress")), default=-1)

    def wait(self, what, timeout: float = 240) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if what():
                return
            time.sleep(0.3)
        log = self.log.read_text(errors="replace")[-5000:] if self.log.exists() else ""
        raise AssertionError(f"timed out; events: {list(read_events(self.events))[-15:]}\n"
                             f"job log: {log}")

    def resumes(self) -> list[dict]:
        return [e for e in self.of("resume") if e.get("source") == "training"]


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_framework_script_unchanged(slurm, clean, tmp_path, framework):
    from resilient_slurm_lab.faults.injector import NODE_SCENARIO
    from resilient_slurm_lab.hardware.simulate import install_scenario

    module, script, args, ckpt = FRAMEWORKS[framework]
    importlib.import_module(module)  # installed by scripts/setup.sh: never a skip
    work = tmp_path
    jid = submit(slurm, clean, work, script, args)
    log_path = work / f"slurm-{jid}.out"
    job = Job(str(work / ckpt / ".resilient"), log_path)  # the script's own checkpoint folder
    hurt = ""
    try:
        # 1. fault-free steps, then a SIGKILLed rank
        job.wait(lambda: job.step() >= 12, 300)
        pid, _ = rank_proc(jid, script, 1) or (0, "")
        assert pid, "rank 1 not found"
        os.kill(pid, signal.SIGKILL)
        job.wait(lambda: len(job.resumes()) >= 2)
        # 2. a SIGSTOPped rank, once the derived timeout is in force again
        at = job.step()
        job.wait(lambda: job.step() >= at + 14)
        pid, _ = rank_proc(jid, script, 1) or (0, "")
        assert pid, "rank 1 not found"
        stopped_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        job.wait(lambda: len(job.resumes()) >= 3)
        resumed_at = job.resumes()[2]["ts"]
        # 3. a node fault: a training node's GPU lost (not the batch host's), its rank gone
        at = job.step()
        job.wait(lambda: job.step() >= at + 5)
        batch_host = slurm.job(jid).extra.get("batch_host")
        found = [rank_proc(jid, script, r) for r in (0, 1)]
        pid, hurt = next(p for p in found if p and p[1] != batch_host)
        install_scenario(clean.node_dir(hurt), NODE_SCENARIO)
        os.kill(pid, signal.SIGKILL)
        done = launch_helpers.wait_job(slurm, jid, 600)
    finally:
        if hurt:
            install_scenario(clean.node_dir(hurt), "clear")
    log = log_path.read_text(errors="replace")
    assert done.state == "COMPLETED", log[-6000:]
    events = list(read_events(job.events))
    rep = report.build(events)
    why = report.render(rep, events)
    # the SIGSTOPped rank: found within the derived timeout and restarted in the job
    assert resumed_at - stopped_at < 60, why
    hang = [f for f in rep.faults if f.what == "hang"]
    assert len(hang) == 1 and hang[0].detected_s is not None and hang[0].detected_s < 30, why
    assert hang[0].rank == 1 or hang[0].evidence == report.UNKNOWN_CULPRIT, why
    assert hang[0].handled_by.startswith("in-job restart"), why
    # the node fault: a spare in its place, the same world size, no requeue
    swaps = [e for e in job.of("spare") if e.get("node")]
    assert [e["out"] for e in swaps] == [hurt], why
    assert not job.of("requeue") and done.restart_count == 0, why
    assert {e.get("world_size") for e in job.resumes()} == {2}, job.resumes()
    # every fault line: a step, a recovery time, lost steps; goodput from the steps
    assert len(rep.faults) >= 3, why
    for f in rep.faults:
        assert f.step is not None and f.recovery_s is not None and f.lost_steps is not None, why
    assert rep.goodput is not None and rep.productive_basis is not None, why
    assert rep.final_step == STEPS, why
    # the job log as it happens; no deprecated-package warning in the ranks' output
    lines = [ln for ln in log.splitlines() if ln.startswith("resilient-launch: fault")]
    assert len([ln for ln in lines if "resumed in" in ln and "lost steps" in ln]) >= 2, lines
    assert "spare " in log and f" in for {hurt}" in log
    assert "pynvml package is deprecated" not in log
    assert "heartbeat timeout 10 s" in log

"""The shipped sbatch templates: their directives, and what they run as real batch jobs on the
sandbox (real ``srun``, ``scontrol``, ``torchrun`` and ``resilient-launch``).

``fsdp.sbatch`` runs ``resilient-launch --dry-run`` (its plan: the ft_launcher command line it
would start) with the options the template computes, KillWait read from the sandbox's own
``scontrol show config``; ``fsdp-baseline.sbatch`` runs ``srun torchrun`` on two nodes around a
training script that records its arguments and fails, and requeues itself once.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resilient_slurm.slurm import Job

SBATCH = os.path.join(os.path.dirname(__file__), "..", "..", "sbatch")
TEMPLATES = ["fsdp.sbatch", "fsdp-baseline.sbatch"]
BIN = os.path.dirname(sys.executable)
ARGS = ["--steps", "50", "--fault-types", "a b"]
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

# The user's training script, standing in for train_fsdp.py: records what it was given, fails.
RECORDING_SCRIPT = """
import json, os, sys
rec = {"argv": sys.argv[1:], "rank": os.environ.get("RANK"),
       "world": os.environ.get("WORLD_SIZE"), "node": os.environ.get("SLURMD_NODENAME"),
       "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}
path = os.path.join(os.environ["RECORD_DIR"], f"r{rec['restart']}-rank{rec['rank']}.json")
with open(path, "w") as fh:
    json.dump(rec, fh)
sys.exit(3)
"""


@pytest.mark.parametrize("template", TEMPLATES)
def test_directives(template) -> None:
    text = open(os.path.join(SBATCH, template)).read()
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@",
                 "#SBATCH --ntasks-per-node=1"):
        assert line in text, line
    # A failing rank must end the step: resilient-launch's srun uses --kill-on-bad-exit=1.
    assert "--kill-on-bad-exit=1" in text or "exec resilient-launch" in text
    assert subprocess.run(["bash", "-n", os.path.join(SBATCH, template)]).returncode == 0


def test_resilient_template_forces_no_heartbeat_timeout() -> None:
    """fsdp.sbatch passes a heartbeat timeout only when its knob is set: unset, resilient-launch
    (and so ft_launcher) keep NVRx's own (issue 37, item 10)."""
    text = open(os.path.join(SBATCH, "fsdp.sbatch")).read()
    flags = [ln.strip() for ln in text.splitlines()
             if "heartbeat-timeout" in ln and not ln.lstrip().startswith("#")]
    assert flags == ['${FT_INITIAL_HB_TIMEOUT:+--initial-heartbeat-timeout '
                     '"$FT_INITIAL_HB_TIMEOUT"} \\',
                     '${FT_HB_TIMEOUT:+--heartbeat-timeout "$FT_HB_TIMEOUT"} \\'], flags
    assert not re.search(r"HB_TIMEOUT:-", text), "a heartbeat timeout default in the template"


def _submit(slurm, sandbox, work: Path, template: str, name: str, nodes: int,
            env: dict[str, str], args: list[str]) -> int:
    job_env = {**os.environ, "SLURM_CONF": sandbox.conf, "RESILIENT_SANDBOX_DIR": sandbox.root,
               "PATH": BIN + ":" + os.environ.get("PATH", ""), "PYTHON": sys.executable,
               "TRAIN_SCRIPT": str(work / "train.py"), **env}
    return slurm.submit(os.path.abspath(os.path.join(SBATCH, template)),
                        [f"-N{nodes}", f"--output={work}/{name}-%j.out", f"--chdir={work}",
                         f"--job-name={name}"], args=args, env=job_env)


def _wait(slurm, jobs: list[int], timeout: float) -> dict[int, Job]:
    deadline = time.monotonic() + timeout
    done: dict[int, Job] = {}
    while time.monotonic() < deadline and len(done) < len(jobs):
        for jid in jobs:
            if jid not in done:
                job = slurm.job(jid)
                if job.state in TERMINAL:
                    done[jid] = job
        time.sleep(1)
    for jid in set(jobs) - set(done):
        slurm.cancel(jid)
    assert len(done) == len(jobs), f"jobs still running after {timeout}s: {set(jobs) - set(done)}"
    return done


def _log(work: Path, name: str, jid: int) -> str:
    path = work / f"{name}-{jid}.out"
    return path.read_text() if path.exists() else ""


def _ft_argv(log: str) -> list[str]:
    """The ft_launcher command line in resilient-launch's dry-run plan."""
    line = next((ln for ln in log.splitlines() if ln.startswith("srun ")), None)
    assert line is not None, log[-3000:]
    argv = shlex.split(line)
    return argv[argv.index(next(a for a in argv if a.endswith("ft_launcher"))):]


def _flag(argv: list[str], suffix: str) -> str:
    """The value of the one option ending with ``suffix`` (NVRx versions spell some apart)."""
    (value,) = [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0].endswith(suffix)]
    return value


@pytest.mark.slurm
def test_resilient_template_on_the_sandbox(clean, sandbox, slurm, tmp_path) -> None:
    """fsdp.sbatch's options reach resilient-launch (its plan), the term timeout comes from
    the signal lead less the cluster's KillWait (at least 10 s, FT_TERM_TIMEOUT wins), the
    user's RESILIENT_LAUNCH_ARGS come before the script, and the template's exit code is
    resilient-launch's (exec)."""
    work = tmp_path
    (work / "train.py").write_text(RECORDING_SCRIPT)
    kill_wait = int(slurm.kill_wait())
    cases = {  # name: (nodes, env, expected term timeout or None)
        "plan": (2, {"RESILIENT_LAUNCH_ARGS": "--dry-run --min-nodes 2"},
                 max(120 - kill_wait, 10)),
        "lead": (1, {"RESILIENT_LAUNCH_ARGS": "--dry-run", "SIGNAL_LEAD": "200"},
                 max(200 - kill_wait, 10)),
        "floor": (1, {"RESILIENT_LAUNCH_ARGS": "--dry-run", "SIGNAL_LEAD": str(kill_wait + 1)},
                  10),
        "explicit": (1, {"RESILIENT_LAUNCH_ARGS": "--dry-run", "FT_TERM_TIMEOUT": "7",
                         "FT_INITIAL_HB_TIMEOUT": "120", "FT_HB_TIMEOUT": "50"}, 7),
        "usage": (1, {"RESILIENT_LAUNCH_ARGS": "--min-nodes 3"}, None),
    }
    jobs = {name: _submit(slurm, sandbox, work, "fsdp.sbatch", name, nodes, env, ARGS)
            for name, (nodes, env, _) in cases.items()}
    done = _wait(slurm, list(jobs.values()), 240)
    for name, (_, _, term) in cases.items():
        jid = jobs[name]
        log = _log(work, name, jid)
        job = done[jid]
        if term is None:
            # resilient-launch refused --min-nodes 3 on one node (exit 2): the job's exit code
            assert job.state == "FAILED" and job.exit_code == 2, (job, log[-2000:])
            assert "--min-nodes 3 > 1" in log, log[-2000:]
            continue
        assert job.state == "COMPLETED", (name, job, log[-3000:])
        argv = _ft_argv(log)
        assert _flag(argv, "term-timeout") == str(term), (name, argv)
        assert _flag(argv, "--nproc-per-node") == "1"
        assert "budgets: 3 in-job restarts/cycle" in log, log[-2000:]  # FT_MAX_RESTARTS
        assert argv[-5:] == [str(work / "train.py"), *ARGS], argv
        if name == "explicit":  # the user's heartbeat timeouts reach ft_launcher
            hb = {a.split("=", 1)[0].replace("_", "-").removeprefix("--ft-")
                  .removeprefix("param-"): a.split("=", 1)[1] for a in argv if "heartbeat" in a}
            assert hb == {"initial-rank-heartbeat-timeout": "120",
                          "rank-heartbeat-timeout": "50"}, argv
            assert "heartbeat timeout 50 s (yours); initial 120 s" in log, log[-2000:]
        else:  # none forced: NVRx's own (no flag on ft_launcher's command line)
            assert not [a for a in argv if "heartbeat" in a], (name, argv)
            assert "; initial 3600 s;" in log, log[-2000:]
        assert not list(work.glob("r*-rank*.json")), "a dry run started the training"
    assert "(min 2)" in _log(work, "plan", jobs["plan"])


@pytest.mark.slurm
@pytest.mark.train
def test_baseline_template_on_the_sandbox(clean, sandbox, slurm, tmp_path) -> None:
    """fsdp-baseline.sbatch: srun torchrun on both nodes (rank per node, world 2, the script's
    arguments after --pg-timeout), a failed step requeues the job once
    (BASELINE_MAX_REQUEUES=1), the second failure ends it with the step's exit code."""
    work = tmp_path
    (work / "train.py").write_text(RECORDING_SCRIPT)
    env = {"RECORD_DIR": str(work), "BASELINE_MAX_REQUEUES": "1",
           "TORCH_CPP_LOG_LEVEL": "ERROR"}
    jid = _submit(slurm, sandbox, work, "fsdp-baseline.sbatch", "base", 2, env, ARGS)
    job = _wait(slurm, [jid], 300)[jid]
    log = _log(work, "base", jid)
    records = {p.name: json.loads(p.read_text()) for p in work.glob("r*-rank*.json")}
    assert sorted(records) == ["r0-rank0.json", "r0-rank1.json", "r1-rank0.json",
                               "r1-rank1.json"], (records, log[-3000:])
    for rec in records.values():
        assert rec["argv"] == ["--pg-timeout", "120", *ARGS] and rec["world"] == "2", rec
    assert len({records[f"r0-rank{r}.json"]["node"] for r in (0, 1)}) == 2, records  # a node each
    failed = re.findall(r"training step failed \(exit (\d+)\): requeueing", log)
    assert len(failed) == 1, log[-3000:]  # once: the second failure is past the budget
    assert job.state == "FAILED" and job.restart_count == 1, job
    # the job ends with its last step's exit code (torchrun's 1, or 143 where srun's
    # --kill-on-bad-exit stopped the other node's torchrun before it exited itself)
    final = re.findall(r"training step failed \(exit (\d+)\): not requeued, 1 requeue\(s\) "
                       r"of BASELINE_MAX_REQUEUES=1 spent", log)
    assert len(final) == 1, log[-3000:]
    assert job.exit_code == int(final[0]) != 0, (job, final)

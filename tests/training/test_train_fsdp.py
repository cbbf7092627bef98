"""Acceptance: train_fsdp.py on 2 CPU ranks; faults restarted by ft_launcher end bitwise-equal."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from resilient_slurm.checkpoint import layout  # noqa: E402
from resilient_slurm.events import read_events  # noqa: E402
from resilient_slurm_lab.faults import TRAIN_SCRIPT as FAULTS_SCRIPT  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "sbatch", "train_fsdp.py")
BIN = os.path.dirname(sys.executable)
TRAIN = ["--steps", "24", "--checkpoint-every", "4", "--keep", "2", "--seed", "7"]
# seed 115 on 24 steps x 2 ranks: sigkill at step 7 on rank 1, exception at step 10 on rank 0,
# hang at step 13 on rank 1 (found by the heartbeat timeout)
FAULTS = ["--fault-count", "3", "--fault-seed", "115", "--fault-types", "exception,sigkill,hang"]
EXPECTED_FAULTS = [(7, 1, "sigkill"), (10, 0, "exception"), (13, 1, "hang")]


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESILIENT_", "SLURM"))}
    env["RESILIENT_EVENTS_FILE"] = str(tmp_path / "events.jsonl")
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return env


def _digests(out: str) -> list[str]:
    return re.findall(r"weights digest: ([0-9a-f]{64})", out)


def _run(argv: list[str], env: dict[str, str], timeout: float) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def _torchrun(ckpt: str, extra: list[str], env: dict[str, str]) -> str:
    return _run([os.path.join(BIN, "torchrun"), "--standalone", "--nproc-per-node", "2",
                 SCRIPT, "--checkpoint-dir", ckpt, *TRAIN, *extra], env, 240)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("ref")
    out = _torchrun(str(tmp / "ckpt"), [], _env(tmp))
    digests = _digests(out)
    assert len(digests) == 2 and len(set(digests)) == 1, out[-3000:]
    return digests[0]


@pytest.mark.train
@pytest.mark.skipif(shutil.which("ft_launcher", path=BIN) is None, reason="no ft_launcher")
def test_faults_restarted_by_ft_launcher_end_bitwise_equal(tmp_path, reference) -> None:
    """Exception, SIGKILL and hang, each restarted by ft_launcher: same final weights as the
    fault-free run. The hang is found through missing heartbeats (10 s timeout), which the
    saves and loads themselves never trip."""
    ckpt = str(tmp_path / "ckpt")
    env = _env(tmp_path)
    out = _run([os.path.join(BIN, "ft_launcher"), "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "4", "--monitor-interval", "0.5", "--term-timeout", "5",
                "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "10",
                "--ft-enable-nic-monitor=false", FAULTS_SCRIPT, "--checkpoint-dir", ckpt, *TRAIN,
                *FAULTS], env, 420)
    assert _digests(out) == [reference, reference], out[-3000:]
    events = list(read_events(env["RESILIENT_EVENTS_FILE"]))
    faults = [(e["step"], e["rank"], e["type"]) for e in events if e["kind"] == "fault"]
    assert faults == EXPECTED_FAULTS
    resumes = [e["step"] for e in events if e["kind"] == "resume"]
    assert len(resumes) == 4 and resumes[0] == 0  # fresh start + one restart per fault
    assert resumes == sorted(resumes) and resumes[-1] >= 8  # resumed from committed saves
    assert any(e["kind"] == "progress" for e in events)
    assert events[-1]["kind"] == "complete" and events[-1]["digest"] == reference
    assert layout.latest_committed_step(ckpt) == 24
    assert len(os.listdir(os.path.join(ckpt, "faults"))) == 3


@pytest.mark.train
def test_torchrun_resume_is_bitwise_exact(tmp_path, reference) -> None:
    ckpt = str(tmp_path / "ckpt")
    env = _env(tmp_path)
    first = _torchrun(ckpt, ["--steps", "10", "--sync-checkpoint"], env)
    assert layout.latest_committed_step(ckpt) == 10 and len(_digests(first)) == 2
    second = _torchrun(ckpt, [], env)
    assert "resuming from step 10" in second
    assert _digests(second) == [reference, reference]


def test_same_fault_seed_same_schedule_in_two_runs() -> None:
    argv = [sys.executable, "-m", "resilient_slurm_lab.faults.injector", "--count", "5", "--seed",
            "42", "--types", "exception,hang,sigkill,node", "--weights", "0.4,0.2,0.2,0.2",
            "--steps", "200", "--world-size", "4"]
    runs = [subprocess.run(argv, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0].splitlines()) == 5


@pytest.mark.train
def test_node_fault_outside_sandbox_fails_loudly(tmp_path) -> None:
    env = _env(tmp_path)
    env.pop("RESILIENT_SANDBOX_DIR", None)
    env.pop("SLURMD_NODENAME", None)
    proc = subprocess.run([sys.executable, FAULTS_SCRIPT, "--checkpoint-dir",
                           str(tmp_path / "c"), "--steps", "5", "--fault-count", "1",
                           "--fault-types", "node"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "RESILIENT_SANDBOX_DIR" in proc.stderr
    assert not os.path.exists(tmp_path / "c" / "step_000001")



@pytest.mark.train
def test_sigterm_saves_the_current_step_and_resume_is_exact(tmp_path, reference) -> None:
    """SIGTERM to torchrun (as on scancel): every rank saves one agreed step, commits, exits;
    the next run resumes there and ends with the reference weights."""
    ckpt = str(tmp_path / "ckpt")
    env = _env(tmp_path)
    argv = [os.path.join(BIN, "torchrun"), "--standalone", "--nproc-per-node", "2", SCRIPT,
            "--checkpoint-dir", ckpt, *TRAIN, "--checkpoint-every", "100", "--step-sleep", "0.2"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "step 10 loss" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    stopped = [e for e in read_events(env["RESILIENT_EVENTS_FILE"]) if e["kind"] == "stopped"]
    assert len(stopped) == 1, out[-3000:]
    step = stopped[0]["step"]
    assert 10 <= step < 24 and layout.latest_committed_step(ckpt) == step
    second = _torchrun(ckpt, [], env)
    assert f"resuming from step {step}" in second
    assert _digests(second) == [reference, reference]


@pytest.mark.train
def test_reshard_from_two_ranks_to_one(tmp_path) -> None:
    """Elastic relaunch on fewer ranks: the 2-rank save loads into 1 rank with the same weights
    and training continues from it."""
    ckpt = str(tmp_path / "ckpt")
    env = _env(tmp_path)
    two = _digests(_torchrun(ckpt, ["--steps", "8"], env))
    assert len(two) == 2
    alone = [sys.executable, SCRIPT, "--checkpoint-dir", ckpt, *TRAIN]
    same = _run([*alone, "--steps", "8"], env, 120)
    assert "resharded save 8 from 2 to 1 ranks" in same and _digests(same) == two[:1]
    more = _run([*alone, "--steps", "10"], env, 120)
    assert len(_digests(more)) == 1 and layout.latest_committed_step(ckpt) == 10


@pytest.mark.train
def test_elastic_resume_on_fewer_ranks_is_bitwise_exact(tmp_path) -> None:
    """3 ranks save at step 6, 2 ranks resume to 12: the same weights as 3 ranks (and as one
    process) without interruption, because the 3 virtual shards' gradients are summed in shard
    order whatever the world size. Threads are pinned: BLAS results depend on them."""
    env = _env(tmp_path)
    fixed = ["--seed", "7", "--checkpoint-every", "3", "--threads", "1", "--virtual-dp", "3"]

    def ranks(n: int, ckpt: str, steps: int) -> list[str]:
        return _digests(_run([os.path.join(BIN, "torchrun"), "--standalone",
                              "--nproc-per-node", str(n), SCRIPT, "--checkpoint-dir", ckpt,
                              "--steps", str(steps), *fixed], env, 240))

    straight = ranks(3, str(tmp_path / "three"), 12)
    assert len(straight) == 3 and len(set(straight)) == 1
    elastic = str(tmp_path / "elastic")
    assert len(ranks(3, elastic, 6)) == 3
    out = _run([os.path.join(BIN, "torchrun"), "--standalone", "--nproc-per-node", "2", SCRIPT,
                "--checkpoint-dir", elastic, "--steps", "12", *fixed], env, 240)
    assert "resharded save 6 from 3 to 2 ranks" in out
    assert "3 virtual shards in 2 round(s)" in out
    assert _digests(out) == straight[:2]
    alone = _run([sys.executable, SCRIPT, "--checkpoint-dir", str(tmp_path / "one"),
                  "--steps", "12", *fixed], env, 240)
    assert _digests(alone) == straight[:1]
    other = _run([sys.executable, SCRIPT, "--checkpoint-dir", str(tmp_path / "two"),
                  "--steps", "12", *fixed[:-2], "--virtual-dp", "2"], env, 240)
    assert _digests(other) != straight[:1]  # the shard count is part of the result


@pytest.mark.train
def test_bad_targeted_fault_is_a_usage_error(tmp_path) -> None:
    proc = subprocess.run([sys.executable, FAULTS_SCRIPT, "--checkpoint-dir",
                           str(tmp_path / "c"), "--fault", "boom@3"], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "bad fault 'boom@3'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.train
def test_the_example_is_only_a_training_script(tmp_path) -> None:
    """The users' example takes no fault flags (they are the lab wrapper's) and its help names
    none."""
    proc = subprocess.run([sys.executable, SCRIPT, "--checkpoint-dir", str(tmp_path / "c"),
                           "--fault", "exception@3"], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "unrecognized arguments: --fault" in proc.stderr
    helped = subprocess.run([sys.executable, SCRIPT, "--help"], env=_env(tmp_path),
                            capture_output=True, text=True, timeout=120, check=False)
    assert helped.returncode == 0 and "--steps" in helped.stdout
    assert "--fault" not in helped.stdout and "RESILIENT_FAULT" not in helped.stdout
    assert not os.path.exists(tmp_path / "c")


@pytest.mark.skipif(shutil.which("ft_launcher", path=BIN) is None, reason="no ft_launcher")
def test_adapted_heartbeat_timeout_finds_the_hang_early(tmp_path, reference) -> None:
    """resilient-launch's RESILIENT_HEARTBEAT_FLOOR (no user heartbeat timeout): after 10 steps
    the script sets NVRx's calculated timeout (here the 5 s floor) instead of the configured
    60 s, so the hang at step 16 is found in seconds; the run still ends bitwise-equal."""
    import re

    ckpt = str(tmp_path / "ckpt")
    env = {**_env(tmp_path), "RESILIENT_HEARTBEAT_FLOOR": "5"}
    out = _run([os.path.join(BIN, "ft_launcher"), "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "2", "--monitor-interval", "0.5", "--term-timeout", "5",
                "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "60",
                "--ft-workload-check-interval", "0.25", "--ft-enable-nic-monitor=false",
                FAULTS_SCRIPT, "--checkpoint-dir", ckpt, *TRAIN, "--fault", "hang@16@rank1"],
               env, 420)
    assert _digests(out) == [reference, reference], out[-3000:]
    assert re.search(r"heartbeat timeout adapted to [\d.]+ s", out), out[-3000:]
    waited = [float(x) for x in re.findall(r"Did not get subsequent heartbeat\. Waited ([\d.]+)",
                                           out)]
    assert waited and min(waited) < 30, out[-3000:]  # not the configured 60 s

"""The ranks' instrumentation (launcher/instrument): the bootstrap on PYTHONPATH never breaks
or slows a process that is no rank, never imports torch for a script that does not, chains to
the user's sitecustomize; in a rank it reports steps, the resume and checkpoints; under the
real ft_launcher (no Slurm) a SIGSTOPped rank of a script without heartbeats is found by
NVRx within the derived timeout; a script with its own heartbeats is left alone; the shim's
stopped-rank evidence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resilient_slurm.events import read_events
from resilient_slurm.launcher import instrument
from resilient_slurm.launcher.shim.stopped import stopped_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
FOREIGN = os.path.join(HERE, "foreign")
BIN = os.path.dirname(sys.executable)
RANK_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "t"}


def run_py(code: str, env: dict[str, str], tmp_path: Path, timeout: float = 120
           ) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "s.py"
    script.write_text(code)
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "PYTHONPATH")}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout, env=instrument.worker_env({**base, **env}),
                          cwd=tmp_path)


def user_site(tmp_path: Path) -> str:
    d = tmp_path / "usersite"
    d.mkdir(exist_ok=True)
    (d / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    return str(d)


PROBE = ("import os, sys\nprint('torch' in sys.modules, os.environ.get('USER_SITE_RAN'), "
         "sys.modules['sitecustomize'].__file__)\n")


def test_no_rank_no_torch_and_the_users_sitecustomize_runs(tmp_path: Path) -> None:
    for env in ({}, RANK_ENV):  # ft_launcher / the node shim, then a rank that uses no torch
        res = run_py(PROBE, {**env, "PYTHONPATH": user_site(tmp_path)}, tmp_path)
        assert res.returncode == 0, res.stderr
        torch_loaded, ran, site = res.stdout.split()
        assert (torch_loaded, ran) == ("False", "1")
        assert site.startswith(user_site(tmp_path))  # the user's module is `sitecustomize`
        assert "instrument" not in res.stderr


def test_an_error_inside_is_said_once_and_the_script_runs(tmp_path: Path) -> None:
    code = ("import torch\nm = torch.nn.Linear(2, 1)\no = torch.optim.SGD(m.parameters(), 0.1)\n"
            "for _ in range(3):\n    m(torch.ones(1, 2)).sum().backward(); o.step()\n"
            "print('trained')\n")
    res = run_py(code, {**RANK_ENV, "RESILIENT_HEARTBEAT_FLOOR": "ten"}, tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "trained", res.stderr
    said = [ln for ln in res.stderr.splitlines() if "resilient-launch instrument" in ln]
    assert len(said) == 1 and "ValueError" in said[0], res.stderr


TRAIN = """
import os, sys, time, torch
start = int(sys.argv[1])
m = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(m.parameters())
ck = os.path.join(os.environ['CK'], 'step-{}', 'model.pt')
if start:
    st = torch.load(ck.format(start)); m.load_state_dict(st['m']); opt.load_state_dict(st['o'])
for step in range(start + 1, start + 13):
    m(torch.randn(3, 4)).sum().backward(); opt.step(); opt.zero_grad(); time.sleep(0.06)
os.makedirs(os.path.dirname(ck.format(step)))
torch.save({'m': m.state_dict(), 'o': opt.state_dict()}, ck.format(step))
time.sleep(0.3)
print('sitecustomize' in sys.modules)
"""


def test_a_rank_reports_steps_resume_and_checkpoints(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    env = {**RANK_ENV, "RESILIENT_EVENTS_FILE": str(events), "CK": str(tmp_path / "ck")}
    for start in (0, 12):
        res = run_py(TRAIN.replace("sys.argv[1]", str(start)), env, tmp_path)
        assert res.returncode == 0, res.stderr
    evs = [e for e in read_events(str(events)) if e.get("source") == "training"]
    resumes = [e["step"] for e in evs if e["kind"] == "resume"]
    assert resumes == [0, 12]  # the optimizer's own step, restored with the checkpoint
    steps = [e["step"] for e in evs if e["kind"] == "progress"]
    assert steps == sorted(steps) and steps[-1] == 24 and 12 in steps
    ckpts = [(e["step"], e["path"]) for e in evs if e["kind"] == "checkpoint"]
    assert ckpts == [(12, str(tmp_path / "ck" / "step-12" / "model.pt")),
                     (24, str(tmp_path / "ck" / "step-24" / "model.pt"))]


def ft_launcher(script: str, args: list[str], tmp_path: Path, nproc: int, port: int
                ) -> tuple[subprocess.Popen[str], Path]:
    events = tmp_path / "events.jsonl"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env = instrument.worker_env({**base, "RESILIENT_EVENTS_FILE": str(events),
                                 "RESILIENT_HEARTBEAT_FLOOR": "10"})
    argv = [os.path.join(BIN, "ft_launcher"), "--nnodes=1", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=2",
            "--ft-param-workload_check_interval=0.25", script, *args]
    log = open(tmp_path / "ft.log", "w")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=tmp_path)
    return proc, events


def rank_pid(script: str, rank: int) -> int | None:
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if script.encode() in cmd and f"RANK={rank}".encode() in env \
                and b"ft_launcher" not in cmd:
            return int(pid)
    return None


def progress(events: Path) -> int:
    steps = [e["step"] for e in read_events(str(events)) if e.get("kind") == "progress"]
    return max(steps, default=0)


@pytest.mark.train
def test_sigstopped_rank_of_a_script_without_heartbeats_is_found(tmp_path: Path) -> None:
    script = os.path.join(FOREIGN, "train_loop.py")
    proc, events = ft_launcher(script, ["--steps=70", f"--ckpt-dir={tmp_path / 'ck'}"],
                               tmp_path, 2, 29000 + os.getpid() % 1000)
    try:
        deadline = time.monotonic() + 180
        while progress(events) < 25 and time.monotonic() < deadline:
            time.sleep(0.3)
        pid = rank_pid(script, 1)
        assert pid is not None and progress(events) >= 25
        stopped_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        assert proc.wait(timeout=240) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    log = (tmp_path / "ft.log").read_text()
    assert "heartbeat timeout 10 s (5 x the longest step interval" in log
    assert "Did not get subsequent heartbeat. Waited 10.00 seconds" in log
    evs = list(read_events(str(events)))
    resumes = [e for e in evs if e.get("kind") == "resume"]
    # restarted within the derived timeout (+ the restart), resumed from its checkpoint
    assert len(resumes) == 2 and resumes[1]["step"] in (20, 30), resumes
    assert resumes[1]["ts"] - stopped_at < 60
    assert "[script] done step=70" in log


@pytest.mark.train
def test_a_script_with_its_own_heartbeats_is_left_alone(tmp_path: Path) -> None:
    proc, events = ft_launcher(os.path.join(FOREIGN, "train_plain.py"),
                               ["--steps=12", "--step-time=0.05", f"--fault-dir={tmp_path}"],
                               tmp_path, 1, 29000 + (os.getpid() + 500) % 1000)
    assert proc.wait(timeout=180) == 0
    assert not [e for e in read_events(str(events)) if e.get("source") == "training"]
    assert "resilient-launch instrument" not in (tmp_path / "ft.log").read_text()


def test_stopped_ranks_from_proc(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "RANK": "3"})
    try:
        assert stopped_ranks() == []
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while stopped_ranks() != [3] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stopped_ranks() == [3]
        assert stopped_ranks(root=child.pid) == []  # its own descendants only
    finally:
        child.kill()
        child.wait()
    assert json.dumps(stopped_ranks(proc=str(tmp_path / "none"))) == "[]"


def test_a_script_that_reports_its_steps_keeps_its_numbers(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    code = ("import time, torch\nfrom resilient_slurm.launcher.cycle.progress import report_step\n"
            "m = torch.nn.Linear(2, 1)\no = torch.optim.AdamW(m.parameters())\n"
            "for s in range(100, 106):\n    m(torch.ones(1, 2)).sum().backward(); o.step()\n"
            "    report_step(s); time.sleep(0.1)\n")
    res = run_py(code, {**RANK_ENV, "RESILIENT_EVENTS_FILE": str(events)}, tmp_path)
    assert res.returncode == 0, res.stderr
    steps = [(e["step"], bool(e.get("instrumented"))) for e in read_events(str(events))
             if e["kind"] == "progress"]
    assert steps == [(s, False) for s in range(100, 106)]

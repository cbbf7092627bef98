"""The shipped sbatch templates: directives, and the exact commands they run (golden files).

The templates run under bash with fake ``srun``, ``scontrol``, ``ft_launcher`` and ``torchrun``
on PATH that record their arguments; ``UPDATE_GOLDEN=1`` rewrites the golden files.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

SBATCH = os.path.join(os.path.dirname(__file__), "..", "..", "sbatch")
GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
TEMPLATES = ["fsdp.sbatch", "fsdp-baseline.sbatch"]

FAKES = {
    # srun: record, then run the command after srun's own options
    "srun": 'echo "srun $*" >> "$REC"\nwhile [ "${1#--}" != "$1" ]; do shift; done\n'
            'exec "$@"\n',
    "scontrol": 'echo "scontrol $*" >> "$REC"\ncase "$1 $2" in\n'
                '  "show hostnames") printf "node1\\nnode2\\n" ;;\n'
                '  "show config") echo "KillWait                = ${FAKE_KILL_WAIT:-30} sec" ;;\n'
                '  "show node") echo "NodeName=$3 Arch=x86_64 NodeAddr=10.0.0.${3#node} '
                'NodeHostName=vm" ;;\nesac\n',
    "ft_launcher": 'for a in "$@"; do echo "ft_launcher: $a" >> "$REC"; done\n'
                   'exit "${FAKE_RC:-0}"\n',
    "torchrun": 'for a in "$@"; do echo "torchrun: $a" >> "$REC"; done\nexit "${FAKE_RC:-0}"\n',
    "resilient-launch": 'for a in "$@"; do echo "resilient-launch: $a" >> "$REC"; done\n'
                        'exit "${FAKE_RC:-0}"\n',
}


def _run(tmp_path, template: str, args: list[str], rc: int = 0,
         restarts: str = "0", extra_env: dict[str, str] | None = None) -> tuple[int, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        path = bindir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    rec = tmp_path / "rec.txt"
    rec.write_text("")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "REC": str(rec), "SLURM_JOB_ID": "4242",
           "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
           "SLURMD_NODENAME": "node2", "SLURM_RESTART_COUNT": restarts,
           "TRAIN_SCRIPT": "/opt/train_fsdp.py", "FAKE_RC": str(rc), **(extra_env or {})}
    proc = subprocess.run(["bash", os.path.join(SBATCH, template), *args], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert "line" not in proc.stderr, proc.stderr
    return proc.returncode, rec.read_text()


@pytest.mark.parametrize("template", TEMPLATES)
def test_directives(template) -> None:
    text = open(os.path.join(SBATCH, template)).read()
    for line in ("#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --signal=B:USR1@",
                 "#SBATCH --ntasks-per-node=1"):
        assert line in text, line
    # A failing rank must end the step: resilient-launch's srun uses --kill-on-bad-exit=1.
    assert "--kill-on-bad-exit=1" in text or "exec resilient-launch" in text
    assert subprocess.run(["bash", "-n", os.path.join(SBATCH, template)]).returncode == 0


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("template", TEMPLATES)
def test_commands_match_golden(tmp_path, template) -> None:
    rc, recorded = _run(tmp_path, template, ["--steps", "50", "--fault-types", "a b"])
    assert rc == 0
    golden = os.path.join(GOLDEN, template + ".txt")
    if os.environ.get("UPDATE_GOLDEN"):
        with open(golden, "w") as fh:
            fh.write(recorded)
    with open(golden) as fh:
        assert recorded == fh.read()


def test_baseline_requeues_failed_step_within_budget(tmp_path) -> None:
    rc, recorded = _run(tmp_path, "fsdp-baseline.sbatch", [], rc=3)
    assert rc == 3 and "scontrol requeue 4242" in recorded
    rc, recorded = _run(tmp_path, "fsdp-baseline.sbatch", [], rc=3, restarts="3")
    assert rc == 3 and "requeue" not in recorded.replace("scontrol show", "")


def test_resilient_template_passes_exit_code(tmp_path) -> None:
    for code in (1, 3, 5):
        rc, _ = _run(tmp_path, "fsdp.sbatch", [], rc=code)
        assert rc == code


def test_resilient_template_passes_launcher_args(tmp_path) -> None:
    bindir = tmp_path / "bin"
    rc, recorded = _run(tmp_path, "fsdp.sbatch", ["--steps", "5"],
                        extra_env={"RESILIENT_LAUNCH_ARGS": "--min-nodes 2"})
    assert rc == 0 and bindir.exists()
    lines = recorded.splitlines()
    i = lines.index("resilient-launch: --min-nodes")
    assert lines[i + 1] == "resilient-launch: 2"
    assert lines.index("resilient-launch: /opt/train_fsdp.py") > i


@pytest.mark.parametrize("kill_wait,lead,want", [("30", None, "90"), ("12", "200", "188"),
                                                 ("300", None, "10"), ("junk", "60", "30")])
def test_term_timeout_from_signal_lead_and_kill_wait(tmp_path, kill_wait, lead, want) -> None:
    env = {"FAKE_KILL_WAIT": kill_wait, **({"SIGNAL_LEAD": lead} if lead else {})}
    rc, recorded = _run(tmp_path, "fsdp.sbatch", [], extra_env=env)
    lines = recorded.splitlines()
    i = lines.index("resilient-launch: --term-timeout")
    assert rc == 0 and lines[i + 1] == f"resilient-launch: {want}"
    rc, recorded = _run(tmp_path, "fsdp.sbatch", [], extra_env={**env, "FT_TERM_TIMEOUT": "7"})
    lines = recorded.splitlines()
    assert lines[lines.index("resilient-launch: --term-timeout") + 1] == "resilient-launch: 7"

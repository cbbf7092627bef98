"""The epilog removes a finished job's memory-tier snapshots (``<dir>/<job id>``), only a real
directory owned by the job's user, never through a link."""

from __future__ import annotations

import os
import subprocess
import sys

from resilient_slurm.epilog import memtier
from resilient_slurm_lab.hardware.simulate import install_scenario


def test_only_the_jobs_own_directory_goes(tmp_path) -> None:
    root = tmp_path / "shm"
    (root / "42" / "0" / "step-3").mkdir(parents=True)
    (root / "42" / "0" / "step-3" / "state.bin").write_bytes(b"x")
    uid = os.getuid()
    assert memtier.remove_job_snapshots(str(root), 41, uid) is None  # nothing there
    assert "belongs to uid" in (memtier.remove_job_snapshots(str(root), 42, uid + 1) or "")
    assert (root / "42").exists()
    assert memtier.remove_job_snapshots(str(root), 42, uid) == f"removed {root / '42'}"
    assert not (root / "42").exists()
    assert memtier.remove_job_snapshots(str(root), 42, None) is None
    assert memtier.remove_job_snapshots("", 42, uid) is None
    assert memtier.job_uid({"SLURM_JOB_UID": "1001"}) == 1001
    assert memtier.job_uid({"SLURM_JOB_UID": "x1"}) is None and memtier.job_uid({}) is None


def test_a_planted_link_is_never_followed(tmp_path) -> None:
    root, victim = tmp_path / "shm", tmp_path / "precious"
    root.mkdir()
    victim.mkdir()
    (victim / "keep").write_text("x")
    os.symlink(victim, root / "42")
    assert "not a directory" in (memtier.remove_job_snapshots(str(root), 42, os.getuid()) or "")
    inner = tmp_path / "shm2" / "43"
    inner.mkdir(parents=True)
    os.symlink(victim, inner / "link")  # a link inside the job's folder: removed, not followed
    memtier.remove_job_snapshots(str(tmp_path / "shm2"), 43, os.getuid())
    assert (victim / "keep").exists() and not inner.exists()


def test_the_epilog_removes_them_at_job_end(tmp_path) -> None:
    """The hook as the sandbox's slurmd runs it (root, bare environment, ``python -I``; the
    lab's wrapper: the node's simulated hardware beside its state directory)."""
    shm = tmp_path / "shm"
    (shm / "42" / "1" / "step-9").mkdir(parents=True)
    (shm / "77").mkdir()  # another job's: stays
    node = tmp_path / "nodes" / "n1"
    install_scenario(str(node), "clear")
    config = tmp_path / "config.toml"
    config.write_text(
        "[hooks]\n"
        f'state_dir = "{tmp_path}/nodes/{{node}}/hooks"\n'
        f'events_file = "{tmp_path}/events.jsonl"\n'
        'slurm_bin_dir = "/nonexistent"\nslurm_conf = "/nonexistent/slurm.conf"\n'
        'verdict_file = ""\n'
        f'memory_tier_dir = "{shm}"\n'
        "[health]\n"
        f'state_dir = "{tmp_path}/nodes/{{node}}/health"\n'
        'profile = "p5.48xlarge"\nwatchdog_s = 10\ntool_timeout_s = 5\nnvml_timeout_s = 5\n')
    code = ("import sys; from resilient_slurm_lab.hardware.hooks import epilog_main; "
            f"sys.exit(epilog_main(['--config', {str(config)!r}]))")
    env = {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "42", "SLURM_JOB_UID": str(os.getuid())}
    done = subprocess.run([sys.executable, "-I", "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(shm)) == ["77"]

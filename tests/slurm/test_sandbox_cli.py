"""`resilient-slurm sandbox` as a person uses it: up, srun, status, env, down."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from click.testing import CliRunner

from resilient_slurm.cli import main
from resilient_slurm_lab.sandbox import cluster
from resilient_slurm_lab.sandbox.cluster import Paths, sandbox_processes

from ..conftest import require_sandbox

CLI = [sys.executable, "-m", "resilient_slurm.cli"]


@pytest.mark.slurm
def test_up_srun_down_leaves_nothing() -> None:
    require_sandbox()
    root = tempfile.mkdtemp(prefix="rs-test-cli-")
    up = subprocess.run([*CLI, "sandbox", "up", "--nodes", "4", "--dir", root],
                        capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        conf_lines = [ln for ln in up.stdout.splitlines() if ln.startswith("SLURM_CONF=")]
        assert len(conf_lines) == 1
        conf = conf_lines[0].split("=", 1)[1]
        env = {**os.environ, "SLURM_CONF": conf}
        out = subprocess.run(["srun", "-N4", "hostname"], env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        assert len(out.strip().splitlines()) == 4
        as_user = subprocess.run([*CLI, "sandbox", "exec-as-user", "--dir", root, "--",
                                  "srun", "-N2", "id", "-un"], capture_output=True, text=True,
                                 timeout=60)
        assert as_user.returncode == 0, as_user.stderr
        assert as_user.stdout.split() == ["rsjob", "rsjob"]
        exports = subprocess.run([*CLI, "sandbox", "env", "--dir", root], capture_output=True,
                                 text=True, check=True).stdout
        assert f"export SLURM_CONF={conf}" in exports
        status = subprocess.run([*CLI, "sandbox", "status", "--dir", root], capture_output=True,
                                text=True, check=True).stdout
        assert status.count("idle") == 4
        assert sandbox_processes(Paths(root))  # daemons are running now...
    finally:
        down = subprocess.run([*CLI, "sandbox", "down", "--dir", root], capture_output=True,
                              text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    assert sandbox_processes(Paths(root)) == []  # ...and none after down
    again = subprocess.run([*CLI, "sandbox", "status", "--dir", root], capture_output=True,
                           text=True)
    assert again.returncode != 0 and "Traceback" not in again.stderr
    shutil.rmtree(root, ignore_errors=True)


def test_missing_slurm_says_what_to_install(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cluster, "SBIN_PATH", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    result = CliRunner().invoke(main, ["sandbox", "up", "--dir", str(tmp_path / "sbx")])
    assert result.exit_code == 1
    assert "apt-get install" in result.output and "slurmctld" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_not_root_is_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(main, ["sandbox", "up", "--dir", str(tmp_path / "sbx")])
    assert result.exit_code == 1 and "root" in result.output


def test_the_lab_plugs_sandbox_into_the_product_command() -> None:
    """`resilient-slurm sandbox` is the lab's group, found through the product's entry points;
    without the lab installed its stand-in says where it comes from and exits 2."""
    from resilient_slurm.cli import COMMANDS_GROUP, _missing, plugin_commands
    from resilient_slurm_lab.sandbox.cli import sandbox

    assert COMMANDS_GROUP == "resilient_slurm.commands"
    assert sandbox in plugin_commands() and main.commands["sandbox"] is sandbox
    absent = CliRunner().invoke(_missing("sandbox", "resilient-slurm-lab"), ["up", "--nodes", "2"])
    assert absent.exit_code == 2 and "resilient-slurm-lab" in absent.output, absent.output


def test_bad_node_count_is_usage_error(tmp_path) -> None:
    result = CliRunner().invoke(main, ["sandbox", "up", "--nodes", "0", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "--nodes" in result.output


def test_sandboxes_start_at_job_ids_of_their_own() -> None:
    """Side-by-side sandboxes (the test workers) share /dev/shm, where a job's memory tier lives
    under its id: each directory starts at its own FirstJobId, unless the caller sets one."""
    def conf(root: str, extra: list[str]) -> list[str]:
        plan = cluster.Plan(nodes=["node1"], ctld_port=1, node_ports={"node1": 2},
                            hostname="h", slurm_version="22.05.8", extra_conf=extra)
        return [ln for ln in cluster.render_conf(Paths(root), plan).splitlines()
                if ln.startswith("FirstJobId=")]

    roots = [f"/tmp/rs-test-sbx-{i}" for i in range(8)]  # fixed: the figures are deterministic
    firsts = {conf(r, [])[0] for r in roots}
    assert len(firsts) == len(roots)
    assert all(0 < int(f.split("=")[1]) < 67_043_328 for f in firsts)
    assert conf(roots[0], []) == conf(roots[0], [])  # stable for one directory
    assert conf(roots[0], ["FirstJobId=1"]) == ["FirstJobId=1"]

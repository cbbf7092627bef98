"""``resilient-slurm doctor`` against the real sandbox: the Slurm it reports is the one running,
the NVRx version and ft_launcher flags are the installed release's (both CI stages run this:
Slurm 22.05 + NVRx 0.4.1 and Slurm 24.11 + NVRx 0.6)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest

from resilient_slurm.sandbox.cluster import read_meta

pytestmark = pytest.mark.slurm

BIN = os.path.dirname(sys.executable)


def doctor(*args: str, conf: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    if conf:
        env["SLURM_CONF"] = conf
    return subprocess.run([os.path.join(BIN, "resilient-slurm"), "doctor", *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


def test_doctor_reports_this_cluster(sandbox) -> None:
    out = doctor(conf=sandbox.conf)
    assert out.returncode == 0, out.stdout + out.stderr
    running = str(read_meta(sandbox)["slurm_version"])  # slurmctld -V of the sandbox
    major, minor = running.split(".")[:2]
    assert f"slurm version: {int(major)}.{int(minor):02d}\n" in out.stdout
    assert re.search(r"^slurm backend: (cli|pyslurm) \(.+\)$", out.stdout, re.M)
    assert "controller: up, 4 node(s)" in out.stdout
    try:
        nvrx = version("nvidia-resiliency-ext")
    except PackageNotFoundError:
        assert "nvidia-resiliency-ext: not installed" in out.stdout
        return
    assert f"nvidia-resiliency-ext: {nvrx}\n" in out.stdout
    assert re.search(r"^ft_launcher: /\S+/ft_launcher$", out.stdout, re.M), out.stdout
    # Every NVRx release since 0.4.1 offers a heartbeat timeout; the line names its spelling.
    assert re.search(r"^  heartbeat +--ft-\S+$", out.stdout, re.M), out.stdout


def test_doctor_without_a_controller_says_so(tmp_path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                    "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    out = doctor("--ft-launcher", "no-such-ft-launcher", conf=str(conf))
    assert out.returncode == 1
    assert "controller: not reachable" in out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    if "nvidia-resiliency-ext: not installed" not in out.stdout:
        assert "ft_launcher: no-such-ft-launcher not found" in out.stdout

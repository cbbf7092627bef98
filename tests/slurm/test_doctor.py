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

from resilient_slurm_lab.sandbox.cluster import read_meta

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
    assert f"OK    slurm version: {int(major)}.{int(minor):02d}\n" in out.stdout
    assert re.search(r"^INFO  slurm backend: (cli|pyslurm) \(.+\)$", out.stdout, re.M)
    assert "OK    controller: up, 4 node(s)" in out.stdout
    try:
        nvrx = version("nvidia-resiliency-ext")
    except PackageNotFoundError:
        assert "WARN  nvidia-resiliency-ext: not installed" in out.stdout
        return
    assert f"OK    nvidia-resiliency-ext: {nvrx}\n" in out.stdout
    # found beside this interpreter (the venv's bin), whatever PATH says
    assert f"OK    ft_launcher: {BIN}/ft_launcher\n" in out.stdout, out.stdout
    # Every NVRx release since 0.4.1 offers a heartbeat timeout; the line names its spelling.
    assert re.search(r"^INFO  ft_launcher heartbeat: --ft-\S+$", out.stdout, re.M), out.stdout


def test_doctor_without_a_controller_says_so(tmp_path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                    "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    out = doctor("--ft-launcher", "no-such-ft-launcher", conf=str(conf))
    assert out.returncode == 1
    (line,) = [x for x in out.stderr.splitlines() if "controller" in x]
    assert line.startswith("FAIL  controller: not reachable: ")
    assert "*" not in line and ("DOWN" in line or "no answer" in line)  # a cause, not a banner
    assert "Traceback" not in out.stdout + out.stderr
    if "nvidia-resiliency-ext: not installed" not in out.stdout:
        assert "WARN  ft_launcher: no-such-ft-launcher not found" in out.stdout


def test_doctor_json_and_a_missing_conf(tmp_path) -> None:
    import json

    out = doctor("--json", "--no-hooks", conf=str(tmp_path / "nope.conf"))
    assert out.returncode == 1
    assert json.loads(out.stdout) == [{"status": "fail", "what": "slurm.conf",
                                       "detail": f"{tmp_path}/nope.conf does not exist "
                                                 "(--conf or $SLURM_CONF)"}]


def test_doctor_checks_the_hooks_installed_here(tmp_path, monkeypatch) -> None:
    from resilient_slurm.cli import doctor as doc
    from resilient_slurm.hooks import install

    real = install.layout
    monkeypatch.setattr(install, "layout", lambda prefix, *a, **k: real(str(tmp_path), *a, **k))
    assert doc.hook_findings(None)[0].what == "hooks"  # not installed: said, not failed
    assert doc.hook_findings(None)[0].status == "info"
    install.install(str(tmp_path), config_text="[hooks]\nresume_aftr = 3\n")
    bad = doc.hook_findings(str(tmp_path / "none.conf"))
    assert {f.status for f in bad} == {"fail"}
    assert any("resume_aftr" in f.detail for f in bad)

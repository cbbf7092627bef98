"""install-hooks writes shims + config and --check names what is wrong."""

from __future__ import annotations

import os

from click.testing import CliRunner

from resilient_slurm.cli import main
from resilient_slurm.hooks import install


def test_install_then_check(tmp_path) -> None:
    prefix = tmp_path / "root"
    res = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix)])
    assert res.exit_code == 0, res.output
    inst = install.layout(str(prefix))
    for path in inst.shims.values():
        assert os.access(path, os.X_OK)
        assert f"Prolog={inst.shims['prolog']}" in res.output
    assert "PrologFlags=Alloc" in res.output and "HealthCheckInterval=30" in res.output
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    bad = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix), "--check",
                                    "--slurm-conf", str(conf)])
    assert bad.exit_code == 1 and "PrologFlags lacks Alloc" in bad.output
    conf.write_text("\n".join(inst.slurm_conf_lines()) +
                    "\nSchedulerParameters=nohold_on_prolog_fail\n")
    good = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix), "--check",
                                     "--slurm-conf", str(conf)])
    assert good.exit_code == 0, good.output


def test_check_names_bad_config_key(tmp_path) -> None:
    prefix = tmp_path / "root"
    install.install(str(prefix), config_text="[hooks]\nresume_aftr = 3\n")
    problems = install.check(str(prefix), slurm_conf=str(tmp_path / "none.conf"))
    assert any("hooks.resume_aftr" in p for p in problems)


def test_group_writable_shim_is_flagged(tmp_path) -> None:
    prefix = tmp_path / "root"
    inst = install.install(str(prefix))
    os.chmod(inst.shims["prolog"], 0o777)
    assert any("writable by group or others" in p for p in install.check(str(prefix)))


def test_shim_runs_isolated_and_fails_cleanly_without_node(tmp_path) -> None:
    prefix = tmp_path / "root"
    inst = install.install(str(prefix))
    from resilient_slurm import proc

    out = proc.run([inst.shims["healthcheck"]], timeout=60, env={})
    assert out.returncode == 2 and "SLURMD_NODENAME" in out.stderr


def test_check_fails_on_nodes_no_profile_matches(tmp_path) -> None:
    """Issue 12 item 6: a node no profile matches would be unknown (drained) on every run."""
    prefix = tmp_path / "root"
    inst = install.install(str(prefix))
    conf = tmp_path / "slurm.conf"
    lines = "\n".join(inst.slurm_conf_lines()) + "\nSchedulerParameters=nohold_on_prolog_fail\n"
    conf.write_text(lines + "NodeName=gpu-[1-4] CPUs=8\n")
    found = install.check(str(prefix), slurm_conf=str(conf))
    assert any("no profile matches node(s) gpu-[1-4]" in p for p in found), found
    res = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix), "--check",
                                    "--slurm-conf", str(conf)])
    assert res.exit_code == 1
    with open(inst.config_path, "a") as fh:  # the admin chose it
        fh.write("allow_unmatched_profile = true\n")  # the skeleton ends in [health]
    assert not [p for p in install.check(str(prefix), slurm_conf=str(conf))
                if p.startswith("profiles")]

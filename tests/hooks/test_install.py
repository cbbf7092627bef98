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


def test_shim_of_an_older_layout_is_flagged(tmp_path) -> None:
    """A shim naming a module the HealthCheckProgram has left (``healthcheck.hook``: the
    health engine imports no hooks) is reported by --check, not left to fail at the next
    health run."""
    prefix = tmp_path / "root"
    inst = install.install(str(prefix))
    path = inst.shims["healthcheck"]
    with open(path) as fh:
        text = fh.read()
    with open(path, "w") as fh:
        fh.write(text.replace("resilient_slurm.hooks.health", "resilient_slurm.healthcheck.hook"))
    problems = install.check(str(prefix))
    assert any("does not run resilient_slurm.hooks.health:health_main" in p
               for p in problems), problems
    assert not any("prolog" in p and "does not run" in p for p in problems)


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


def test_check_reports_a_pattern_naming_an_unknown_profile(tmp_path) -> None:
    prefix = tmp_path / "root"
    install.install(str(prefix), config_text="[health]\nprofile_patterns = "
                                             "{ 'gpu-*' = 'p5.48xlarg' }\n")
    res = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix), "--check",
                                    "--slurm-conf", str(tmp_path / "none.conf")])
    assert res.exit_code == 1
    line = next(x for x in res.output.splitlines() if "profile_patterns" in x)
    assert line.startswith("FAIL") and "config.toml:2:" in line
    assert "unknown profile 'p5.48xlarg' (did you mean 'p5.48xlarge'?)" in line


def test_dry_run_prints_every_file_and_writes_nothing(tmp_path) -> None:
    prefix = tmp_path / "root"
    res = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert not prefix.exists()
    inst = install.layout(str(prefix))
    for path in [*inst.shims.values(), inst.config_path]:
        assert f"--- {path} (mode 0" in res.output
    assert "[hooks]" in res.output and "from resilient_slurm.prolog.hook import" in res.output
    assert f"Prolog={inst.shims['prolog']}" in res.output


def test_staging_root_keeps_final_paths(tmp_path) -> None:
    stage = tmp_path / "pkgroot"
    res = CliRunner().invoke(main, ["install-hooks", "--destdir", str(stage)])
    assert res.exit_code == 0, res.output
    staged = stage / "usr/libexec/resilient-slurm/prolog"
    text = staged.read_text()
    assert "'--config', '/etc/resilient-slurm/config.toml'" in text  # the final path
    assert (stage / "etc/resilient-slurm/config.toml").is_file()
    assert "Prolog=/usr/libexec/resilient-slurm/prolog" in res.output
    assert f"wrote prolog shim: {staged}" in res.output


def test_check_prints_a_line_per_check_and_compares_budgets(tmp_path) -> None:
    prefix = tmp_path / "root"
    install.install(str(prefix), config_text="[hooks]\nprolog_epilog_timeout_s = 300\n"
                                             "epilog_budget_s = 200\n")
    inst = install.layout(str(prefix))
    conf = tmp_path / "slurm.conf"
    lines = [x for x in inst.slurm_conf_lines(20) if not x.startswith("PrologEpilogTimeout")]
    conf.write_text("\n".join([*lines, "PrologEpilogTimeout=120"]) + "\n")
    res = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix), "--check",
                                    "--slurm-conf", str(conf)])
    assert res.exit_code == 1
    out = res.output.splitlines()
    assert all(x.split()[0] in ("PASS", "FAIL", "WARN") for x in out[:-1]), res.output
    assert "PASS  prolog shim: " in res.output and "PASS  slurm.conf PrologFlags: Alloc" in out
    timeout = [x for x in out if x.startswith("FAIL  budgets vs PrologEpilogTimeout")]
    assert any("PrologEpilogTimeout=120: set it to 120" in x for x in timeout)
    assert any("(221 s" in x and "does not fit" in x for x in timeout)  # 200 + 2 x 8 + 5
    assert "FAIL  budgets vs HealthCheckInterval: hooks.health_budget_s = 30 is longer than " \
           "HealthCheckInterval=20" in res.output
    assert out[-1].startswith("install-hooks --check: ") and out[-1].endswith("check(s) failed")


def test_shim_fails_closed_and_check_flags_an_older_one(tmp_path) -> None:
    """The shims start in /bin/sh (they must run when the interpreter is gone); a shim of the
    older form (``#!python -I``) is reported by --check."""
    prefix = tmp_path / "root"
    inst = install.install(str(prefix))
    path = inst.shims["healthcheck"]
    with open(path) as fh:
        text = fh.read()
    assert text.startswith("#!/bin/sh\n") and "HOOK_BROKEN healthcheck" in text
    assert not any("fail closed" in p for p in install.check(str(prefix)))
    with open(path, "w") as fh:
        fh.write(f"#!{inst.python} -I\nimport sys\nfrom resilient_slurm.hooks.health import "
                 "health_main\nsys.exit(health_main([]))\n")
    assert any("does not fail closed" in p for p in install.check(str(prefix)))


def test_a_value_a_shim_cannot_carry_is_refused(tmp_path) -> None:
    prefix = tmp_path / "root"
    os.makedirs(prefix / "etc/resilient-slurm")
    (prefix / "etc/resilient-slurm/config.toml").write_text(
        '[hooks]\nevents_file = "/var/log/my events.jsonl"\n')
    res = CliRunner().invoke(main, ["install-hooks", "--prefix", str(prefix)])
    assert res.exit_code == 2 and "hooks.events_file" in res.output, res.output

"""Backend selection: the CLI backend (the one CI runs against Slurm) unless pyslurm is chosen
explicitly, and a chosen pyslurm only when it imports and matches the running Slurm."""

from __future__ import annotations

import sys
import types

import pytest
from click.testing import CliRunner

from resilient_slurm.launcher import cli
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.slurm import backend_choice, connect, pyslurm_usable, select
from resilient_slurm.slurm.cli_backend import CliSlurm
from resilient_slurm.slurm.model import SlurmError


@pytest.fixture()
def matching_pyslurm(monkeypatch):
    """A pyslurm that imports and whose version matches the running Slurm's."""
    monkeypatch.setitem(sys.modules, "pyslurm", types.SimpleNamespace(__version__="22.5.0"))
    monkeypatch.setattr(CliSlurm, "version", lambda self: (22, 5))


def test_version_pair() -> None:
    assert select.version_pair("25.11.0") == (25, 11)
    assert select.version_pair("22.5.1") == (22, 5)
    assert select.version_pair("garbage") is None


def test_cli_is_the_default_even_where_pyslurm_matches(matching_pyslurm, monkeypatch) -> None:
    monkeypatch.delenv(select.BACKEND_ENV, raising=False)
    assert isinstance(connect(), CliSlurm)
    name, why = backend_choice()
    assert name == "cli" and "RESILIENT_SLURM_BACKEND=pyslurm" in why
    assert pyslurm_usable() == (True, "pyslurm 22.5.0 matches Slurm 22.05")


def test_pyslurm_when_chosen(matching_pyslurm, monkeypatch) -> None:
    from resilient_slurm.slurm.pyslurm_backend import PySlurm

    assert isinstance(connect(backend="pyslurm"), PySlurm)
    monkeypatch.setenv(select.BACKEND_ENV, "pyslurm")
    assert isinstance(connect(), PySlurm)
    assert isinstance(connect(backend="cli"), CliSlurm)  # the caller's word wins (the hooks')
    name, why = backend_choice()
    assert name == "pyslurm" and why.startswith("chosen by RESILIENT_SLURM_BACKEND")


def test_chosen_pyslurm_absent_is_an_error_not_a_fallback(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import raises ImportError
    monkeypatch.setenv(select.BACKEND_ENV, "pyslurm")
    with pytest.raises(SlurmError, match="unusable.*not importable"):
        connect()
    assert backend_choice()[0] == "unusable"


def test_mismatched_pyslurm_is_refused(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", types.SimpleNamespace(__version__="25.11.0"))
    monkeypatch.setattr(CliSlurm, "version", lambda self: (22, 5))
    with pytest.raises(SlurmError, match="does not match Slurm 22.05"):
        connect(backend="pyslurm")


@pytest.mark.parametrize("how", ["arg", "env"])
def test_unknown_backend_name(monkeypatch, how) -> None:
    if how == "env":
        monkeypatch.setenv(select.BACKEND_ENV, "rest")
    with pytest.raises(SlurmError, match="unknown Slurm backend 'rest'"):
        connect(backend="rest" if how == "arg" else None)


def test_the_launcher_follows_the_choice(matching_pyslurm, monkeypatch, tmp_path) -> None:
    """resilient-launch: the CLI backend by default; RESILIENT_SLURM_BACKEND=pyslurm naming an
    unusable pyslurm is a usage error (exit 2) with the reason."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    monkeypatch.setenv("RESILIENT_SANDBOX_DIR", str(tmp_path / "sbx"))
    monkeypatch.setattr(plan, "detect_features",
                        lambda *_a: plan.Features(frozenset({"--term-timeout"}), "0.4.1"))
    used: list[object] = []
    real_print = cli._print_plan

    def print_plan(slurm: object, *a: object) -> None:
        used.append(slurm)
        real_print(slurm, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(cli, "_print_plan", print_plan)
    argv = ["--dry-run", "--nproc-per-node=1", "--checkpoint-dir", str(tmp_path / "ck"), "t.py"]
    monkeypatch.delenv(select.BACKEND_ENV, raising=False)
    res = CliRunner().invoke(cli.main, argv)
    assert res.exit_code == 0, res.output
    assert [type(s) for s in used] == [CliSlurm]
    monkeypatch.setitem(sys.modules, "pyslurm", None)
    monkeypatch.setenv(select.BACKEND_ENV, "pyslurm")
    res = CliRunner().invoke(cli.main, argv)
    assert res.exit_code == 2 and "pyslurm backend chosen by RESILIENT_SLURM_BACKEND but "\
        "unusable: pyslurm not importable" in res.output, res.output
    assert "Traceback" not in res.output

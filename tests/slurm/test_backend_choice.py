"""Backend selection: pyslurm only when it imports and matches the running Slurm."""

from __future__ import annotations

import sys
import types

import pytest

from resilient_slurm.slurm import backend_choice, connect, select
from resilient_slurm.slurm.cli_backend import CliSlurm
from resilient_slurm.slurm.model import SlurmError


def test_version_pair() -> None:
    assert select.version_pair("25.11.0") == (25, 11)
    assert select.version_pair("22.5.1") == (22, 5)
    assert select.version_pair("garbage") is None


def test_cli_when_pyslurm_absent(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import raises ImportError
    name, why = backend_choice()
    assert name == "cli" and "not importable" in why
    assert isinstance(connect(), CliSlurm)
    with pytest.raises(SlurmError, match="unusable"):
        connect(backend="pyslurm")


def test_mismatched_pyslurm_is_not_used(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", types.SimpleNamespace(__version__="25.11.0"))
    monkeypatch.setattr(CliSlurm, "version", lambda self: (22, 5))
    name, why = backend_choice()
    assert name == "cli" and "does not match Slurm 22.05" in why


def test_matching_pyslurm_is_chosen(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", types.SimpleNamespace(__version__="22.5.0"))
    monkeypatch.setattr(CliSlurm, "version", lambda self: (22, 5))
    assert backend_choice() == ("pyslurm", "pyslurm 22.5.0 matches Slurm 22.05")


def test_unknown_backend_name() -> None:
    with pytest.raises(SlurmError, match="unknown Slurm backend"):
        connect(backend="rest")

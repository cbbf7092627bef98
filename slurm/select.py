"""Backend selection: pyslurm where it imports and matches the running Slurm, else the CLI."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from resilient_slurm.slurm.backend import SlurmBackend
from resilient_slurm.slurm.cli_backend import CliSlurm
from resilient_slurm.slurm.model import SlurmError


def version_pair(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``25.11.0`` or ``22.5.1``."""
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _pyslurm_status(cli: CliSlurm) -> tuple[Any, str]:
    """(module or None, why)."""
    try:
        import pyslurm
    except Exception as exc:  # noqa: BLE001 - any import failure means "not usable"
        return None, f"pyslurm not importable ({type(exc).__name__}: {exc})"
    version = getattr(pyslurm, "__version__", "") or getattr(pyslurm, "version", lambda: "")()
    try:
        major, minor = cli.version()
    except SlurmError as exc:
        return None, f"cannot read the Slurm version to compare with pyslurm {version}: {exc}"
    if version_pair(str(version)) != (major, minor):
        return None, f"pyslurm {version} does not match Slurm {major}.{minor:02d}"
    return pyslurm, f"pyslurm {version} matches Slurm {major}.{minor:02d}"


def backend_choice(conf: str | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Which backend ``connect()`` would use here, and why."""
    cli = CliSlurm(conf=conf, env=env)
    mod, why = _pyslurm_status(cli)
    return ("pyslurm" if mod is not None else "cli"), why


def connect(
    conf: str | None = None,
    backend: str = "auto",
    timeout: float = 15.0,
    bin_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    version_file: str | None = None,
) -> SlurmBackend:
    """A Slurm handle; ``backend`` is ``auto`` (pyslurm if usable, else CLI), ``cli`` or
    ``pyslurm``."""
    cli = CliSlurm(conf=conf, timeout=timeout, bin_dir=bin_dir, env=env,
                   version_file=version_file)
    if backend == "cli":
        return cli
    if backend not in ("auto", "pyslurm"):
        raise SlurmError(f"unknown Slurm backend {backend!r} (use auto, cli or pyslurm)")
    mod, why = _pyslurm_status(cli)
    if mod is None:
        if backend == "pyslurm":
            raise SlurmError(f"pyslurm backend requested but unusable: {why}")
        return cli
    from resilient_slurm.slurm.pyslurm_backend import PySlurm

    return PySlurm(mod, cli)

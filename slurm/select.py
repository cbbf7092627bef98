"""Backend selection: the CLI backend unless pyslurm is chosen explicitly.

The CLI backend is the one CI runs against a real Slurm cluster; the pyslurm backend is written
against pyslurm's documented API and has never run against Slurm in CI (no pyslurm release
matches the Slurm versions CI installs). So it is used only when chosen: ``backend="pyslurm"``
or ``RESILIENT_SLURM_BACKEND=pyslurm``, and then it must import and match the running Slurm, or
``connect()`` raises.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from resilient_slurm.slurm.backend import SlurmBackend
from resilient_slurm.slurm.cli_backend import CliSlurm
from resilient_slurm.slurm.model import SlurmError

BACKEND_ENV = "RESILIENT_SLURM_BACKEND"  # "cli" (default) or "pyslurm"
BACKENDS = ("cli", "pyslurm")


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


def requested_backend(backend: str | None = None) -> tuple[str, str]:
    """(backend name, where the choice came from): ``backend`` when given, else
    ``$RESILIENT_SLURM_BACKEND``, else ``cli``. Raises SlurmError for an unknown name."""
    if backend is not None:
        name, origin = backend, "asked for"
    elif os.environ.get(BACKEND_ENV):
        name, origin = os.environ[BACKEND_ENV].strip(), f"chosen by {BACKEND_ENV}"
    else:
        return "cli", f"the default; pyslurm only when chosen: {BACKEND_ENV}=pyslurm"
    if name not in BACKENDS:
        raise SlurmError(f"unknown Slurm backend {name!r} ({origin}; use cli or pyslurm)")
    return name, origin


def pyslurm_usable(conf: str | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether pyslurm imports here and matches the running Slurm, and why (whatever the
    choice of backend)."""
    mod, why = _pyslurm_status(CliSlurm(conf=conf, env=env))
    return mod is not None, why


def backend_choice(conf: str | None = None,
                   env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """Which backend ``connect()`` would use here, and why (``pyslurm`` only when chosen and
    usable; a chosen but unusable pyslurm reads ``unusable``, as ``connect()`` would fail)."""
    name, origin = requested_backend()
    if name == "cli":
        return "cli", origin
    usable, why = pyslurm_usable(conf, env)
    return ("pyslurm", f"{origin}: {why}") if usable else (
        "unusable", f"pyslurm {origin} but unusable: {why}")


def connect(
    conf: str | None = None,
    backend: str | None = None,
    timeout: float = 15.0,
    bin_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    version_file: str | None = None,
) -> SlurmBackend:
    """A Slurm handle: the CLI backend, or pyslurm when chosen (``backend="pyslurm"``, or with
    ``backend`` None, ``$RESILIENT_SLURM_BACKEND=pyslurm``). A chosen pyslurm that does not
    import or does not match the running Slurm raises SlurmError (never a silent fallback)."""
    name, origin = requested_backend(backend)
    cli = CliSlurm(conf=conf, timeout=timeout, bin_dir=bin_dir, env=env,
                   version_file=version_file)
    if name == "cli":
        return cli
    mod, why = _pyslurm_status(cli)
    if mod is None:
        raise SlurmError(f"pyslurm backend {origin} but unusable: {why}")
    from resilient_slurm.slurm.pyslurm_backend import PySlurm

    return PySlurm(mod, cli)

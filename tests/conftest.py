"""Shared fixtures: a real 4-node Slurm sandbox started and stopped by the suite.

Slurm is never faked. Where the machine cannot run the sandbox (not root, slurm-wlm missing),
tests that need it are skipped with the reason, unless RESILIENT_REQUIRE_SLURM=1 (set by
`make test` and CI), in which case they fail loudly instead.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from resilient_slurm.sandbox import lifecycle
from resilient_slurm.sandbox.cluster import Paths, SandboxError, preflight


def _sandbox_unavailable() -> str | None:
    try:
        preflight()
    except SandboxError as exc:
        return str(exc)
    return None


def require_sandbox() -> None:
    why = _sandbox_unavailable()
    if why is None:
        return
    if os.environ.get("RESILIENT_REQUIRE_SLURM") == "1":
        pytest.fail(f"Slurm sandbox required but unavailable: {why}")
    pytest.skip(f"Slurm sandbox unavailable: {why}")


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Paths]:
    """A 4-node sandbox for the whole session (node1..node4), brought down at the end."""
    require_sandbox()
    root = tempfile.mkdtemp(prefix="rs-test-sbx-")
    paths = lifecycle.up(root, nodes=4)
    try:
        yield paths
    finally:
        survivors = lifecycle.down(root)
        assert not survivors, f"sandbox processes survived: {survivors}"


@pytest.fixture()
def slurm(sandbox: Paths):  # type: ignore[no-untyped-def]
    from resilient_slurm.slurm import connect

    return connect(conf=sandbox.conf, backend="cli", timeout=10)

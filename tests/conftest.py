"""Shared fixtures: a real 4-node Slurm sandbox started and stopped by the suite.

Slurm is never faked. Where the machine cannot run the sandbox (not root, slurm-wlm missing),
tests that need it are skipped with the reason, unless RESILIENT_REQUIRE_SLURM=1 (set by
`make test` and CI), in which case they fail loudly instead.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
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


TEST_PREFIX = "rs-test-sbx-"
OWNER_FILE = "owner.pid"


def _reap_stale_test_sandboxes() -> None:
    """Bring down test sandboxes whose pytest died without tearing them down."""
    for root in glob.glob(os.path.join(tempfile.gettempdir(), TEST_PREFIX + "*")):
        try:
            owner = int(open(os.path.join(root, OWNER_FILE)).read())
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and not os.path.exists(f"/proc/{owner}"):
            lifecycle.down(root, quiet=True)
            shutil.rmtree(root, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    # SIGTERM (a CI timeout, a killed run) unwinds like Ctrl-C, so fixtures bring sandboxes down.
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Paths]:
    """A 4-node sandbox for the whole session (node1..node4), brought down at the end."""
    require_sandbox()
    _reap_stale_test_sandboxes()
    root = tempfile.mkdtemp(prefix=TEST_PREFIX)
    with open(os.path.join(root, OWNER_FILE), "w") as fh:
        fh.write(str(os.getpid()))
    paths = lifecycle.up(root, nodes=4)
    try:
        yield paths
    finally:
        survivors = lifecycle.down(root)
        assert not survivors, f"sandbox processes survived: {survivors}"
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def slurm(sandbox: Paths):  # type: ignore[no-untyped-def]
    from resilient_slurm.slurm import connect

    return connect(conf=sandbox.conf, backend="cli", timeout=10)

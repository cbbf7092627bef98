"""Shared fixtures: a real 4-node Slurm sandbox started and stopped by the suite.

Slurm is never faked. Where the machine cannot run the sandbox (not root, slurm-wlm missing),
tests that need it are skipped with the reason, unless RESILIENT_REQUIRE_SLURM=1 (set by
`make test` and CI), in which case they fail loudly instead; there, any other skip outside a
short allow-list fails too (tests/skip_policy.py).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from resilient_slurm_lab.sandbox import jobuser, lifecycle
from resilient_slurm_lab.sandbox.cluster import Paths, SandboxError, preflight

# The skip policy (tests/skip_policy.py): in `make test`, `make test-unit` and the CI stages a
# skip outside the allow-list (pyslurm, CUDA) fails the run. Imported here so every run over
# tests/ loads its hooks.
from tests.skip_policy import (  # noqa: F401
    pytest_make_collect_report,
    pytest_runtest_makereport,
)

T = TypeVar("T")


def _sandbox_unavailable() -> str | None:
    try:
        preflight()
    except SandboxError as exc:
        return str(exc)
    return None


# `make test-unit` sets this: the unit tests run without Slurm, so a test that reaches for the
# sandbox there is missing its `slurm` marker.
NO_SLURM_ENV = "RESILIENT_NO_SLURM"
SLOW_MARKERS = ("slurm", "train", "integration")


# `make test` runs the suite on pytest-xdist workers (`--dist loadgroup`); each worker starts
# its own sandboxes. The tests of one production sandbox share a worker, so each production
# sandbox starts once; the other cluster tests of a module stay together, in file order, on
# one worker (each worker's sandbox is its own); unit tests spread one by one.
SANDBOX_GROUPS = {"prod6": "prod6", "prod6_sandbox": "prod6", "prod": "prod",
                  "prod_sandbox": "prod"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test not marked slurm, train or integration is a unit test (`make test-unit`);
    the cluster tests get their xdist group (above)."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in SLOW_MARKERS):
            item.add_marker(pytest.mark.unit)
            continue
        if item.get_closest_marker("xdist_group"):
            continue
        fixtures = getattr(item, "fixturenames", ())
        group = next((g for f, g in SANDBOX_GROUPS.items() if f in fixtures),
                     item.nodeid.split("::")[0])
        item.add_marker(pytest.mark.xdist_group(group))


def require_sandbox() -> None:
    if os.environ.get(NO_SLURM_ENV) == "1":
        pytest.fail("this test starts the Slurm sandbox but is not marked `slurm` "
                    f"(${NO_SLURM_ENV}=1: the unit tests run without Slurm)")
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


def _start_sandbox(prefix: str, **kwargs: Any) -> Iterator[Paths]:
    require_sandbox()
    _reap_stale_test_sandboxes()
    root = tempfile.mkdtemp(prefix=prefix)
    with open(os.path.join(root, OWNER_FILE), "w") as fh:
        fh.write(str(os.getpid()))
    paths = lifecycle.up(root, **kwargs)
    try:
        yield paths
    finally:
        survivors = lifecycle.down(root)
        assert not survivors, f"sandbox processes survived: {survivors}"
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Paths]:
    """A 4-node sandbox for the whole session (node1..node4), brought down at the end.

    Fast timing (KillWait=5, cred_expire=10); jobs may be submitted as root or, through
    ``job_user``, as the unprivileged account ``rsjob``.
    """
    yield from _start_sandbox(TEST_PREFIX, nodes=4)


@pytest.fixture(scope="session")
def prod_sandbox() -> Iterator[Paths]:
    """A second 4-node sandbox with Slurm's production timeouts (``--timing production``).

    Started only when a test asks for it (then kept for the session): KillWait=30,
    cred_expire=120 (a requeued job waits that long), MessageTimeout=10,
    HealthCheckInterval=30. ``lifecycle.sandbox_timing(prod_sandbox.root)`` has the figures.
    """
    yield from _start_sandbox(TEST_PREFIX + "prod-", nodes=4, timing="production")


@pytest.fixture(scope="session")
def prod6_sandbox() -> Iterator[Paths]:
    """A 6-node sandbox with Slurm's production timeouts, for the node-loss acceptance tests
    (a 3-node job among 6 nodes, as production jobs run beside others), with the hooks' node
    watcher on every node (``resilient-health watch``, as a production node runs it). Started
    on demand."""
    yield from _start_sandbox(TEST_PREFIX + "prod6-", nodes=6, timing="production", watch=True)


@dataclass(frozen=True)
class JobUserHelper:
    """The unprivileged account the sandboxes' jobs run as, and how to act as it."""

    name: str
    uid: int
    gid: int
    home: str
    base: str  # a directory the user may traverse, where make_dir puts new directories

    def run(self, sandbox: Paths, argv: Sequence[str], **kwargs: Any
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the user with ``sandbox``'s SLURM_CONF (see ``jobuser.run_as``).

        ``env=`` adds variables to the user's clean environment; ``cwd`` defaults to the user's
        work directory in that sandbox; other keywords go to ``subprocess.run``.
        """
        return lifecycle.run_as_user(sandbox.root, argv, **kwargs)

    def make_dir(self, path: str | None = None, mode: int = 0o700) -> str:
        """A directory owned by the user (fresh under ``base`` unless ``path`` is given).

        pytest's ``tmp_path`` is under a 0700 root directory the user cannot enter: use this.
        """
        if path is None:
            path = tempfile.mkdtemp(dir=self.base)
        return lifecycle.make_user_dir(path, jobuser.ensure_account(self.name), mode)


@pytest.fixture(scope="session")
def job_user() -> Iterator[JobUserHelper]:
    """The sandboxes' job user (``rsjob``): name, uid, gid, ``run`` and ``make_dir``."""
    require_sandbox()
    entry = jobuser.ensure_account(lifecycle.DEFAULT_USER)
    # The venv's python is a symlink: the user must reach its target too (a pyenv under /root).
    for needed in (sys.executable, os.path.realpath(sys.executable),
                   os.path.dirname(os.path.abspath(__file__))):
        blocked = jobuser.unreachable_by(needed, entry.pw_uid, entry.pw_gid)
        if blocked is not None:
            pytest.fail(f"the job user {entry.pw_name} cannot reach {needed}: {blocked} is "
                        f"closed to others (`make setup` as root opens it: traverse-only, "
                        f"scripts/open-path.sh; or chmod o+x {blocked})")
    base = tempfile.mkdtemp(prefix="rs-test-user-")
    os.chmod(base, 0o755)
    try:
        yield JobUserHelper(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def slurm(sandbox: Paths):
    from resilient_slurm.slurm import connect

    return connect(conf=sandbox.conf, backend="cli", timeout=10)


SETTLE_S = 2.0  # how long every node must stay idle and undrained before a test starts


def make_healthy_idle(sbx, s, timeout: float) -> None:
    """Every node of ``sbx`` with healthy simulated hardware, resumed, and IDLE with no flag
    for ``SETTLE_S``; AssertionError with the nodes' states when that takes over ``timeout``."""
    from resilient_slurm_lab.hardware.simulate import install_scenario

    for n in s.nodes():
        install_scenario(sbx.node_dir(n.name), "clear")
    # A health program run that read the old hardware before the scenario changed may still
    # drain its node after a resume: resume again until every node stayed idle for SETTLE_S.
    deadline = time.monotonic() + timeout
    since: float | None = None
    while True:
        nodes = s.nodes()
        for n in nodes:
            if n.drain or not n.available:
                s.resume(n.name)
        now = time.monotonic()
        if all(n.state == "IDLE" and not n.flags for n in nodes):
            since = now if since is None else since
            if now - since >= SETTLE_S:
                return
        else:
            since = None
        if now >= deadline:
            raise AssertionError("the sandbox's nodes did not all settle healthy and idle "
                                 f"within {timeout:g} s: "
                                 + "; ".join(n.describe() for n in nodes))
        time.sleep(0.3)


@pytest.fixture()
def clean(sandbox, slurm):
    """Every node healthy and idle before a test."""
    make_healthy_idle(sandbox, slurm, 30)
    return sandbox


def wait_until(pred: Callable[[], T], timeout: float = 30.0, every: float = 0.3) -> T:
    """``pred()``'s first truthy value, polled every ``every`` s (AssertionError at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s")

"""Issue 23 item 10 acceptance: a fleet-wide storage stall on 16 sandbox nodes drains at most
the configured share; the other nodes stay up, and the shared cause is raised loudly.

The stall is real: every node's storage check probes one ext4 filesystem (a loop mount)
that is frozen (``fsfreeze -f``), so each probe blocks in the kernel until the check's
timeout (``STORAGE_HANG``), as with a hung NFS server. One 16-node sandbox of its own
(about 1-2 minutes on a loaded 2-core machine).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from resilient_slurm import fsutil
from resilient_slurm.slurm import connect
from resilient_slurm_lab.sandbox.cluster import Paths
from resilient_slurm_lab.sandbox.lifecycle import HEALTH_INTERVAL, config_path

from ..conftest import TEST_PREFIX, _start_sandbox, wait_until
from .conftest import PREFIX, events, run_health_as_slurm

pytestmark = pytest.mark.slurm
NODES = 16
FRACTION = 0.25  # at most 4 of 16 drained for one cause


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def shared_fs() -> Iterator[str]:
    """A small ext4 filesystem loop-mounted at a private path: the fleet's "shared storage"."""
    base = fsutil.private_dir(os.path.join("/tmp", f"rs-test-fleetfs-{os.getpid()}"))
    image, mnt = os.path.join(base, "fs.img"), os.path.join(base, "mnt")
    os.makedirs(mnt, exist_ok=True)
    with open(image, "wb") as fh:
        fh.truncate(16 * 1024 * 1024)
    made = _sh("mkfs.ext4", "-q", "-F", image)
    mounted = made.returncode == 0 and _sh("mount", "-o", "loop", image, mnt).returncode == 0
    if not mounted:
        shutil.rmtree(base, ignore_errors=True)
        why = (made.stderr or "mount -o loop failed").strip()
        if os.environ.get("RESILIENT_REQUIRE_SLURM") == "1":
            pytest.fail(f"cannot loop-mount a filesystem for the storage stall: {why}")
        pytest.skip(f"cannot loop-mount a filesystem for the storage stall: {why}")
    try:
        yield mnt
    finally:
        _sh("fsfreeze", "-u", mnt)
        for _ in range(20):
            if _sh("umount", mnt).returncode == 0:
                break
            time.sleep(1)  # probes blocked on the frozen fs are still leaving
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet(shared_fs: str) -> Iterator[Paths]:
    extra = f'storage_paths = ["{shared_fs}"]\nstorage_timeout_s = 3\n'
    for paths in _start_sandbox(TEST_PREFIX + "fleet-", nodes=NODES, config_extra=extra,
                                timeout=180):
        conf = config_path(paths)
        text = open(conf).read().replace("[hooks]\n", f"[hooks]\nmax_drain_fraction = "
                                         f"{FRACTION}\n", 1)
        fsutil.atomic_write(conf, text, mode=0o644)
        yield paths


def test_fleet_wide_storage_stall_drains_at_most_the_configured_share(fleet, shared_fs):
    slurm = connect(conf=fleet.conf, backend="cli", timeout=30)
    names = [f"node{i}" for i in range(1, NODES + 1)]
    cap = int(FRACTION * NODES)
    assert not any(n.drain for n in slurm.nodes())
    assert _sh("fsfreeze", "-f", shared_fs).returncode == 0
    stalled_at = time.time()
    seen_max = 0
    # Both rounds' runs are kept: a round that meets the sandbox's own periodic runs inside
    # their settle window may find those nodes drained by us for a moment, and then says
    # nothing (a local .ci/run once saw no shout in the second round alone).
    runs: list[subprocess.CompletedProcess[str]] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for _round in range(2):  # as slurmd does every interval (it runs its own too)
                runs += pool.map(lambda n: run_health_as_slurm(fleet, n), names)
                seen_max = max(seen_max, sum(n.drain for n in slurm.nodes()))
        time.sleep(3)  # longer than the guard's settle time: yielded nodes have resumed
        drained = [n for n in slurm.nodes() if n.drain]
        hang = [e for e in events(fleet, kind="verdict") if e["ts"] >= stalled_at
                and e["code"] == "STORAGE_HANG"]
        assert {e["node"] for e in hang} == set(names)  # every node saw the stall
        assert 1 <= len(drained) <= cap, [n.describe() for n in drained]
        assert all(n.reason.startswith(f"{PREFIX}STORAGE_HANG") for n in drained)
        guarded = [e for e in events(fleet, kind="fleet_guard") if e["ts"] >= stalled_at]
        assert {e["node"] for e in guarded} >= set(names) - {n.name for n in drained}
        assert all(e["cause"] == "STORAGE_HANG" for e in guarded)
        loud = [r.stderr for r in runs if "FLEET GUARD" in r.stderr]
        assert loud and "shared cause" in loud[0] and "kept up" in loud[0]
        assert all(r.returncode in (0, 1) for r in runs)  # kept up: 0; drained: 1
    finally:
        _sh("fsfreeze", "-u", shared_fs)
    print(f"\n{len(drained)} of {NODES} drained (cap {cap}); at most {seen_max} drained at "
          "a sampled moment (a node that drained with others yields within its settle time)")
    # The storage is back: the drained nodes pass again, their holds end, they resume.
    for _ in range(3):
        for n in drained:
            run_health_as_slurm(fleet, n.name)
    wait_until(lambda: not any(n.drain for n in slurm.nodes()), timeout=4 * HEALTH_INTERVAL)

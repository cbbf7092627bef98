"""How the sandbox tracks job processes: proctrack/cgroup under production timing, each sandbox
on a freezer cgroup of its own; linuxproc under fast timing."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm_lab.sandbox import cgroup, lifecycle
from resilient_slurm_lab.sandbox.cluster import Paths, cluster_name

from ..conftest import require_sandbox, wait_until
from .sandbox_helpers import env_of, show_config, show_job

CGROUP_HOST = cgroup.freezer_v1_mounted() and cgroup.plugin_present()


# -- /proc/mounts ---------------------------------------------------------------------------

def _escape(path: str) -> str:
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in path)


@given(st.lists(st.tuples(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
            min_size=1).map(lambda s: "/" + s),
    st.sampled_from(["cgroup", "cgroup2", "tmpfs", "ext4"]),
    st.lists(st.sampled_from(["rw", "relatime", "freezer", "cpu", "memory"]), min_size=1)
    .map(",".join)), max_size=6), st.text(max_size=40))
def test_parse_mounts_reads_back_every_line_and_skips_junk(entries, junk) -> None:
    lines = [f"cgroup {_escape(mp)} {fs} {opts} 0 0" for mp, fs, opts in entries]
    text = "\n".join([*lines, " ".join(junk.split()[:3])])
    got = cgroup.parse_mounts(text)
    assert got[:len(entries)] == entries
    assert len(got) == len(entries)


def test_freezer_must_be_a_cgroup_v1_hierarchy() -> None:
    v1 = [("/sys/fs/cgroup/freezer", "cgroup", "rw,relatime,freezer")]
    assert cgroup.freezer_v1_mounted(v1)
    assert not cgroup.freezer_v1_mounted([("/sys/fs/cgroup", "cgroup2", "rw,nsdelegate")])
    assert not cgroup.freezer_v1_mounted([("/sys/fs/cgroup/freezer", "cgroup", "rw,cpu")])
    assert not cgroup.freezer_v1_mounted([])


# -- the profiles on a running cluster --------------------------------------------------------

@pytest.mark.slurm
def test_production_runs_cgroup_tracking_and_slurm_defaults(prod_sandbox: Paths) -> None:
    conf = show_config(prod_sandbox)
    track = lifecycle.tracking(prod_sandbox.root)
    assert conf["ProctrackType"] == track.proctrack and track.reason
    if CGROUP_HOST:
        assert track.proctrack == cgroup.CGROUP, track.reason
    assert conf["SlurmdTimeout"] == "300 sec"
    assert "nohold_on_prolog_fail" not in conf.get("SchedulerParameters", "")


@pytest.mark.slurm
def test_fast_timing_keeps_linuxproc_and_short_slurmd_timeout(sandbox: Paths) -> None:
    conf = show_config(sandbox)
    assert conf["ProctrackType"] == cgroup.LINUXPROC
    assert conf["SlurmdTimeout"] == "30 sec"
    assert "nohold_on_prolog_fail" in conf["SchedulerParameters"]


@pytest.fixture()
def two_prod() -> Iterator[tuple[Paths, Paths]]:
    """Two 1-node production sandboxes at once: both have a node1 and a job 1."""
    require_sandbox()
    roots = [tempfile.mkdtemp(prefix="rs-test-track-") for _ in range(2)]
    try:
        yield tuple(lifecycle.up(r, nodes=1, hooks=False, timing="production",  # type: ignore[misc]
                                 extra_conf=["FirstJobId=1"])  # not each its own
                    for r in roots)
    finally:
        for r in roots:
            lifecycle.down(r, quiet=True)
            shutil.rmtree(r, ignore_errors=True)


def _sbatch(paths: Paths) -> str:
    out = subprocess.run(["sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap",
                          "srun sleep 300"], env=env_of(paths), capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return out.strip().split(";")[0]


def _step_cgroup(paths: Paths) -> str:
    """The freezer cgroup of the job's sleep (a task of step 0), "" until it runs."""
    for pid in lifecycle.members(paths).jobs:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if os.path.basename(fh.read().split(b"\0")[0]) != b"sleep":
                    continue
            with open(f"/proc/{pid}/cgroup", encoding="utf-8") as fh:
                return next((ln.split(":", 2)[2].strip() for ln in fh
                             if ":freezer:" in ln), "")
        except OSError:
            continue
    return ""


@pytest.mark.slurm
@pytest.mark.skipif(not CGROUP_HOST, reason="no cgroup v1 freezer or proctrack_cgroup here")
def test_sandboxes_side_by_side_keep_their_job_cgroups_apart(two_prod) -> None:
    a, b = two_prod
    jobs = [_sbatch(a), _sbatch(b)]
    assert jobs == ["1", "1"]  # the same job id, on a node of the same name
    where = [wait_until(lambda p=p: _step_cgroup(p), 60) for p in (a, b)]
    for paths, cg in zip((a, b), where, strict=True):
        assert cg.startswith(f"/{cluster_name(paths.root)}/slurm_node1/"), cg
    subprocess.run(["scancel", "1"], env=env_of(a), check=True, timeout=30)
    wait_until(lambda: not _step_cgroup(a), 60)
    assert show_job(b, "1")["JobState"] == "RUNNING" and _step_cgroup(b) == where[1]
    lifecycle.down(a.root)
    assert not os.path.exists(cgroup.own_cgroup(a))
    assert not any(mp.startswith(a.root) for mp, _, _ in cgroup.mounts())
    assert _step_cgroup(b) == where[1]

"""Sandbox life cycle on the real cluster: privileges, scale, reuse of a directory, clean down."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from resilient_slurm.hooks.install import layout
from resilient_slurm_lab.sandbox import lifecycle, privileges
from resilient_slurm_lab.sandbox.cluster import Paths, members, read_meta
from resilient_slurm_lab.sandbox.procs import all_procs, proc_env

from ..conftest import require_sandbox

pytestmark = pytest.mark.slurm
CLI = [sys.executable, "-m", "resilient_slurm.cli"]


@pytest.fixture()
def sandbox_dir() -> Iterator[str]:
    require_sandbox()
    root = tempfile.mkdtemp(prefix="rs-test-life-")
    try:
        yield root
    finally:
        lifecycle.down(root, quiet=True)
        shutil.rmtree(root, ignore_errors=True)


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "sandbox", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def leftovers(paths: Paths, spare: set[int] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Any process still tied to the sandbox: by membership, by its dir on the command line,
    or by its SLURM_CONF (except ``spare`` and this test)."""
    me = os.getpid()
    found = [f"member {p}" for p in members(paths).all()]
    for pid, info in all_procs().items():
        if pid == me or pid in spare:
            continue
        if any(paths.root in a for a in info.cmdline) or \
                proc_env(pid).get("SLURM_CONF") == paths.conf:
            found.append(f"{pid} {' '.join(info.cmdline)[:100]}")
    return found


# -- 2. production privilege boundaries ----------------------------------------------------

def test_user_job_cannot_read_kernel_logs_or_hook_state(sandbox: Paths, job_user) -> None:
    inst = layout(sandbox.root)
    hook_files = [*inst.shims.values(), inst.config_path]
    nodes = [f"node{i}" for i in range(1, 5)]
    assert privileges.problems(sandbox, nodes, hook_files) == []
    for n in nodes:
        assert os.path.getsize(f"{sandbox.node_dir(n)}/kernel.log") > 0  # root reads them
    nodes_dir = sandbox.p("nodes")
    # Whichever node the job lands on: its own node's files and another node's.
    where = (f'own={nodes_dir}/$SLURMD_NODENAME; other={nodes_dir}/node1; '
             f'[ "$SLURMD_NODENAME" = node1 ] && other={nodes_dir}/node2; ')
    probes = {
        "other-kernel-log": "cat $other/kernel.log",
        "own-kernel-log": "cat $own/kernel.log",
        "scenario": "cat $other/scenario.toml",
        "hook-state": "ls $own/hooks",
        "kernlog-position": "ls $own/state",
        "write-shim": f"echo x >> {inst.shims['prolog']}",
        "write-config": f"echo x >> {inst.config_path}",
    }
    script = where + "; ".join(
        f"({cmd}) >/dev/null 2>&1 && echo {name}=allowed || echo {name}=denied"
        for name, cmd in probes.items())
    out = job_user.make_dir()
    res = job_user.run(sandbox, ["sbatch", "--parsable", "-N1", "-o", f"{out}/%j.out",
                                 "--wrap", f"id -un; {script}"], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    deadline = time.monotonic() + 60
    while not os.path.exists(f"{out}/{job}.out") or "write-config=" not in open(
            f"{out}/{job}.out").read():
        assert time.monotonic() < deadline, "the probing job did not finish"
        time.sleep(0.3)
    lines = open(f"{out}/{job}.out").read().split()
    assert lines[0] == job_user.name
    assert sorted(lines[1:]) == sorted(f"{name}=denied" for name in probes)


def test_privilege_check_names_what_is_too_open(tmp_path) -> None:
    paths = Paths(str(tmp_path))
    node = paths.node_dir("node1")
    os.makedirs(node)
    privileges.harden(paths, ["node1"])
    assert privileges.problems(paths, ["node1"]) == []
    open(f"{node}/kernel.log", "w").close()
    os.chmod(f"{node}/kernel.log", 0o644)
    os.chmod(f"{node}/hooks", 0o755)
    found = privileges.problems(paths, ["node1"])
    assert any("kernel.log" in p for p in found) and any("hooks" in p for p in found)


# -- 5. scale -------------------------------------------------------------------------------

def test_64_nodes_come_up_and_go_down_leaving_no_process(sandbox_dir: str) -> None:
    start = time.monotonic()
    res = cli("up", "--nodes", "64", "--dir", sandbox_dir)
    took = time.monotonic() - start
    assert res.returncode == 0, res.stderr
    paths = Paths(sandbox_dir)
    mem = lifecycle.daemon_memory(sandbox_dir)
    print(f"\n64-node sandbox: up in {took:.1f}s; {lifecycle.memory_summary(sandbox_dir)}")
    assert "daemons use" in res.stdout
    assert len([k for k in mem if k.startswith("node")]) == 64
    assert all(pss > 0 for _, pss in mem.values())
    assert len(members(paths).daemons) == 66  # munged, slurmctld, 64 slurmd
    res = cli("down", "--dir", sandbox_dir)
    assert res.returncode == 0, res.stderr
    assert leftovers(paths) == []


# -- 6. reusing a directory -----------------------------------------------------------------

def test_up_twice_on_one_directory_and_after_an_unclean_stop(sandbox_dir: str) -> None:
    paths = Paths(sandbox_dir)
    for _ in range(2):  # two processes: Python's hash() differs between them
        res = cli("up", "--nodes", "1", "--no-hooks", "--dir", sandbox_dir)
        assert res.returncode == 0, res.stderr
        assert cli("down", "--dir", sandbox_dir).returncode == 0
    assert cli("up", "--nodes", "2", "--no-hooks", "--dir", sandbox_dir).returncode == 0
    # Unclean stop, daemons still running (e.g. the caller was killed): say what to do.
    res = cli("up", "--nodes", "1", "--no-hooks", "--dir", sandbox_dir)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert f"resilient-slurm sandbox down --dir {paths.root}" in res.stderr
    # Unclean stop, every daemon killed outright while a job runs on node2: up (now without
    # node2, whose slurmd would otherwise clean up) works and ends the orphaned job processes.
    job = lifecycle.run_as_user(sandbox_dir, ["sbatch", "-N1", "-w", "node2", "-o", "/dev/null",
                                              "--wrap", "sleep 600"], capture_output=True)
    assert job.returncode == 0, job.stderr
    deadline = time.monotonic() + 30
    while not members(paths).jobs:
        assert time.monotonic() < deadline, "the job's processes never appeared"
        time.sleep(0.2)
    for pid in members(paths).daemons:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while members(paths).daemons and time.monotonic() < deadline:
        time.sleep(0.1)
    orphans = members(paths).jobs + members(paths).step_daemons
    assert orphans  # what a crash leaves behind
    res = cli("up", "--nodes", "1", "--no-hooks", "--dir", sandbox_dir)
    assert res.returncode == 0, res.stderr
    assert not [p for p in orphans if p in all_procs()]
    assert cli("down", "--dir", sandbox_dir).returncode == 0


# -- 7. down ends this sandbox's processes only ---------------------------------------------

def test_down_spares_a_shell_that_exported_slurm_conf(sandbox_dir: str) -> None:
    res = cli("up", "--nodes", "2", "--no-hooks", "--dir", sandbox_dir)
    assert res.returncode == 0, res.stderr
    paths = Paths(sandbox_dir)
    exports = cli("env", "--dir", sandbox_dir).stdout
    # A user's shell after `eval "$(resilient-slurm sandbox env)"`: it and what it starts
    # carry this SLURM_CONF.
    shell = subprocess.Popen(["bash", "-c", f'eval "{exports}"; sleep 600 & wait'],
                             env={**os.environ, "SLURM_CONF": paths.conf})
    user = read_meta(paths)["user"]
    assert isinstance(user, dict)
    job = lifecycle.run_as_user(sandbox_dir, ["sbatch", "--parsable", "-N1", "-o", "/dev/null",
                                              "--wrap", "sleep 600"], capture_output=True)
    assert job.returncode == 0, job.stderr
    deadline = time.monotonic() + 30
    while not [p for p in members(paths).jobs if all_procs().get(p)
               and all_procs()[p].uid == user["uid"]]:
        assert time.monotonic() < deadline, "the job's processes never appeared"
        time.sleep(0.2)
    job_procs = members(paths).jobs
    shell_tree = {shell.pid} | {p for p, i in all_procs().items() if i.ppid == shell.pid}
    assert not shell_tree & set(members(paths).all())
    down = subprocess.run(["bash", "-c", f'eval "{exports}"; "$@"; echo down-rc=$?', "bash",
                           *CLI, "sandbox", "down", "--dir", sandbox_dir],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SLURM_CONF": paths.conf})
    try:
        assert "down-rc=0" in down.stdout, down.stdout + down.stderr
        assert "Terminated" not in down.stdout + down.stderr
        assert shell.poll() is None  # the user's shell lives on...
        assert all(os.path.exists(f"/proc/{p}") for p in shell_tree)
        assert not any(p in all_procs() for p in job_procs)  # ...the job's processes do not
        assert leftovers(paths, spare=shell_tree) == []
    finally:
        for pid in shell_tree:
            os.kill(pid, signal.SIGKILL)
        shell.wait()

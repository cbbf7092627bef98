"""resilient-launch --inprocess planning: level-1 flags from ft_launcher --help, timeouts that
leave level 0 its time, the store host the launcher runs."""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

import pytest

from resilient_slurm.launcher.cycle import inprocess_plan as ip
from resilient_slurm.launcher.cycle import plan

DATA = Path(__file__).parent / "nvrx_output"  # real ft_launcher --help of each release


def feats(version: str) -> plan.Features:
    text = (DATA / version / "help.txt").read_text()
    return plan.Features(plan.parse_help(text), version, frozenset(),
                         plan.parse_restart_policies(text))


V041, V060 = feats("0.4.1"), feats("0.6.0")


def _ft_launcher() -> str | None:
    """ft_launcher on PATH or next to this interpreter (a venv run without activation)."""
    import os
    import sys

    near = os.path.join(os.path.dirname(sys.executable), "ft_launcher")
    return shutil.which("ft_launcher") or (near if os.path.exists(near) else None)


def test_level1_flags() -> None:
    nnodes, extra = ip.ft_args(V041, 2, 3, heartbeat_timeout=60,
                               initial_heartbeat_timeout=300, hard_timeout=20)
    assert nnodes == "2:3" and extra == ["--ft-restart-policy=min-healthy"]
    assert V041.restart_policies == {"any-failed", "min-healthy"}
    assert "never hot spares" in ip.level1_span(V041, 2, 3)


@pytest.mark.train
def test_installed_ft_launcher_is_read(tmp_path, monkeypatch) -> None:
    exe = _ft_launcher()
    if exe is None:
        pytest.skip("ft_launcher not installed")
    monkeypatch.setenv("RESILIENT_CACHE_DIR", str(tmp_path))
    f = plan.detect_features(exe)
    assert "--nnodes" in f.flags and "any-failed" in f.restart_policies
    old = tuple(int(x) for x in f.version.split(".")[:2]) < (0, 6)
    assert ("min-healthy" in f.restart_policies) == old  # dropped in NVRx 0.6


def test_nvrx_06_refuses_with_a_clear_error() -> None:
    """NVRx 0.6/0.7 accept only any-failed (and read MIN:N as hot spares): refused, saying
    why and what to do."""
    assert V060.restart_policies == {"any-failed"}
    with pytest.raises(ip.InprocessPlanError) as err:
        ip.ft_args(V060, 2, 3, 60, 300)
    msg = str(err.value)
    assert "min-healthy" in msg and "0.6.0" in msg and "hot spares" in msg
    assert "Run without --inprocess" in msg


@pytest.mark.parametrize("hb,initial", [(25, 300), (60, 29.9)])
def test_heartbeat_must_exceed_level0_hard_timeout(hb: float, initial: float) -> None:
    with pytest.raises(ip.InprocessPlanError, match="hard timeout"):
        ip.ft_args(V041, 2, 3, hb, initial, hard_timeout=20)


def test_min_nodes_range() -> None:
    with pytest.raises(ip.InprocessPlanError):
        ip.ft_args(V041, 4, 3, 60, 300)


def test_worker_env() -> None:
    env = ip.worker_env("10.0.0.1:4000", 2, "4")
    assert env == {"RESILIENT_INPROCESS_STORE": "10.0.0.1:4000",
                   "RESILIENT_INPROCESS_MIN_WORLD": "8", "NCCL_NVLS_ENABLE": "0",
                   "TORCH_NCCL_RETHROW_CUDA_ERRORS": "0"}
    assert "RESILIENT_INPROCESS_MIN_WORLD" not in ip.worker_env("h:1", 2, "auto")
    # --spares: 3 of 4 nodes train, 4 ranks each: ranks 12.. stand by in level 0
    assert ip.worker_env("h:1", 2, "4", train_nodes=3)["RESILIENT_INPROCESS_ACTIVE_WORLD"] \
        == "12"
    assert "RESILIENT_INPROCESS_ACTIVE_WORLD" not in ip.worker_env("h:1", 2, "4")


@pytest.mark.train
def test_store_host_serves_and_stops() -> None:
    torch = pytest.importorskip("torch")
    host = ip.StoreHost(host="127.0.0.1")  # torch import may be slow on a loaded machine
    port = host.start()
    try:
        client = torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                            timeout=datetime.timedelta(seconds=120))
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert host.address({"b1": "127.0.0.1"}, "b1") == f"127.0.0.1:{port}"
    finally:
        host.stop()
    assert host.proc is not None and host.proc.poll() is not None


def _dry_env(tmp_path, monkeypatch) -> None:
    import os
    import sys

    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    monkeypatch.setenv("RESILIENT_SANDBOX_DIR", str(tmp_path / "sbx"))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep
                       + os.environ.get("PATH", ""))
    monkeypatch.setattr(plan, "detect_features", lambda *_a: V041)


@pytest.mark.train
def test_dry_run_inprocess_sets_level1(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from resilient_slurm.launcher import cli

    if _ft_launcher() is None:
        pytest.skip("ft_launcher not installed")
    _dry_env(tmp_path, monkeypatch)
    res = CliRunner().invoke(cli.main, ["--dry-run", "--inprocess", "--min-nodes=2",
                                        "--checkpoint-dir", str(tmp_path / "ck"),
                                        "train_fsdp.py"])
    assert res.exit_code == 0, res.output
    srun = next(line for line in res.output.splitlines() if line.startswith("srun "))
    assert "--nnodes=2:3" in srun and "--ft-restart-policy=min-healthy" in srun
    assert "in-process level 1: ft_launcher --nnodes=2:3" in res.output
    assert "never hot spares" in res.output
    assert "in-process level 0 timeouts: soft 60 s (NVRx's), hard 90 s (NVRx's), heartbeat " \
        "30 s (NVRx's)" in res.output
    assert "hang detection: heartbeat timeout 2700 s" in res.output  # level 1: NVRx's own
    assert "initial 3600 s" in res.output and "heartbeat-timeout" not in srun


@pytest.mark.train
def test_dry_run_inprocess_with_a_spare_runs_ranks_on_every_node(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from resilient_slurm.launcher import cli

    if _ft_launcher() is None:
        pytest.skip("ft_launcher not installed")
    _dry_env(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-4]")
    res = CliRunner().invoke(cli.main, ["--dry-run", "--inprocess", "--spares=1",
                                        "--checkpoint-dir", str(tmp_path / "ck"),
                                        "train_fsdp.py"])
    assert res.exit_code == 0, res.output
    assert "hot spares: 1 node(s) of ranks standing by in level 0" in res.output
    assert "3 node(s) train" in res.output
    srun = next(line for line in res.output.splitlines() if line.startswith("srun "))
    assert "--nodelist=node1,node2,node3,node4" in srun and "--nnodes=3:4" in srun


def test_dry_run_inprocess_on_nvrx_06_is_exit_2(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from resilient_slurm.launcher import cli

    _dry_env(tmp_path, monkeypatch)
    monkeypatch.setattr(plan, "detect_features", lambda *_a: V060)
    res = CliRunner().invoke(cli.main, ["--dry-run", "--inprocess", "--min-nodes=2",
                                        "train_fsdp.py"])
    assert res.exit_code == 2 and "min-healthy" in res.output and "Traceback" not in res.output


def test_script_learns_inprocess_from_the_environment(monkeypatch) -> None:
    """--inprocess given once (to resilient-launch) is enough: the example script turns it on
    when the launcher hosts the in-process store (RESILIENT_INPROCESS_STORE)."""
    pytest.importorskip("torch")
    from resilient_slurm.sbatch import train_fsdp

    monkeypatch.delenv("RESILIENT_INPROCESS_STORE", raising=False)
    assert not train_fsdp.parse_args(["--checkpoint-dir", "/x"]).inprocess
    monkeypatch.setenv("RESILIENT_INPROCESS_STORE", "10.0.0.1:4000")
    assert train_fsdp.parse_args(["--checkpoint-dir", "/x"]).inprocess


@pytest.mark.train
def test_dry_run_inprocess_refuses_short_heartbeat(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from resilient_slurm.launcher import cli

    if _ft_launcher() is None:
        pytest.skip("ft_launcher not installed")
    _dry_env(tmp_path, monkeypatch)
    res = CliRunner().invoke(cli.main, ["--dry-run", "--inprocess", "--heartbeat-timeout=9",
                                        "--checkpoint-dir", str(tmp_path / "ck"), "t.py"])
    assert res.exit_code == 2 and "hard timeout" in res.output
    assert "Traceback" not in res.output


def test_report_names_level0() -> None:
    from resilient_slurm.launcher.report import report

    def ev(ts: float, kind: str, source: str = "launcher", **kw):
        return {"ts": ts, "kind": kind, "source": source, **kw}

    events = [
        ev(0, "launch_start"), ev(0.1, "cycle_start", cycle=1),
        ev(1, "resume", "training", step=0, iteration=0),
        *[ev(1 + s, "progress", "training", step=s) for s in range(1, 6)],
        ev(6.5, "fault", "training", type="sigkill", step=6, node="n2"),
        ev(7.5, "resume", "training", step=5, iteration=1, level="inprocess",
           lost_ranks=[1], restart="0"),
        ev(9.5, "fault", "training", type="sigkill", step=8, node="n3"),
        ev(30, "resume", "training", step=4, iteration=0, restart="1"),
        ev(40, "verdict", verdict="completed", exit_code=0),
    ]
    rows = report.build(events).faults
    assert [f.handled_by for f in rows] == ["in-process restart (level 0, ranks 1 left out)",
                                            "in-job restart (ft_launcher)"]
    assert rows[0].recovery_s == 1.0 and rows[0].lost_steps == 0


def test_report_names_a_standby_that_took_the_place() -> None:
    """--inprocess --spares: ranks lost, the world size kept: a standby took their place."""
    from resilient_slurm.launcher.report import report

    def ev(ts: float, kind: str, **kw):
        return {"ts": ts, "kind": kind, "source": "training", **kw}

    events = [ev(0.1, "cycle_start", cycle=1),
              ev(1, "resume", step=0, iteration=0, world_size=3, standby_nodes=["n4"]),
              ev(6.5, "fault", type="node", step=6, node="n2"),
              ev(7.5, "resume", step=5, iteration=1, level="inprocess", lost_ranks=[1],
                 world_size=3),
              ev(9.5, "fault", type="sigkill", step=8, node="n3"),
              ev(11, "resume", step=7, iteration=2, level="inprocess", lost_ranks=[1, 2],
                 world_size=2)]
    assert [f.handled_by for f in report.build(events).faults] == [
        "in-process restart (level 0, a standby took ranks 1' place)",
        "in-process restart (level 0, ranks 2 left out)"]


def test_report_names_only_the_ranks_each_level0_restart_left_out() -> None:
    """The training's ``lost_ranks`` is every initial rank gone so far: a later fault's row
    names only the ranks that restart newly left out (none for a hang after a shrink)."""
    from resilient_slurm.launcher.report import report

    def ev(ts: float, kind: str, source: str = "training", **kw):
        return {"ts": ts, "kind": kind, "source": source, **kw}

    events = [
        ev(0.1, "cycle_start", "launcher", cycle=1), ev(1, "resume", step=0, iteration=0),
        ev(6.5, "fault", type="node", step=6, node="n3"),
        ev(7.5, "resume", step=5, iteration=1, level="inprocess", lost_ranks=[2]),
        ev(9.5, "fault", type="hang", step=8, node="n1"),
        ev(30, "resume", step=7, iteration=2, level="inprocess", lost_ranks=[2]),
        ev(31, "fault", type="sigkill", step=9, node="n2"),
        ev(33, "resume", step=8, iteration=3, level="inprocess", lost_ranks=[1, 2]),
    ]
    assert [f.handled_by for f in report.build(events).faults] == [
        "in-process restart (level 0, ranks 2 left out)", "in-process restart (level 0)",
        "in-process restart (level 0, ranks 1 left out)"]


def test_level0_hard_timeout_from_the_job_or_nvrx() -> None:
    """Level 1's heartbeat timeouts are checked against level 0's hard timeout as the ranks
    will have it: the job's RESILIENT_INPROCESS_HARD_TIMEOUT, else NVRx's own (90 s)."""
    opts = plan.LaunchOptions(script="t.py", heartbeat_timeout=40.0,
                              initial_heartbeat_timeout=180.0)
    with pytest.raises(ip.InprocessPlanError) as err:
        ip.configure(opts, V041, 2, 3, {})
    assert "(90 s, NVRx's own; set $RESILIENT_INPROCESS_HARD_TIMEOUT for yours)" in str(err.value)
    short = {"RESILIENT_INPROCESS_SOFT_TIMEOUT": "4", "RESILIENT_INPROCESS_HARD_TIMEOUT": "20"}
    got = ip.configure(opts, V041, 2, 3, short)
    assert got.min_nnodes == 2 and got.heartbeat_timeout == 40.0
    with pytest.raises(ip.InprocessPlanError, match="RESILIENT_INPROCESS_SOFT_TIMEOUT"):
        ip.configure(opts, V041, 2, 3, {"RESILIENT_INPROCESS_SOFT_TIMEOUT": "x"})
    with pytest.raises(ip.InprocessPlanError, match=r"soft_timeout \(95\) < hard_timeout \(90\)"):
        ip.configure(opts, V041, 2, 3, {"RESILIENT_INPROCESS_SOFT_TIMEOUT": "95"})


def test_inprocess_forces_no_heartbeat_timeout() -> None:
    """Without the user's, level 1's heartbeat timeouts stay NVRx's own (45 / 60 min: none on
    ft_launcher's command line), and level 2 waits for level 0 as long as level 0's own
    bound, not level 1's heartbeat timeout."""
    got = ip.configure(plan.LaunchOptions(script="t.py"), V041, 2, 3, {})
    assert got.heartbeat_timeout is None and got.initial_heartbeat_timeout is None
    assert (got.heartbeat_s, got.initial_heartbeat_s) == (plan.NVRX_HEARTBEAT_TIMEOUT,
                                                          plan.NVRX_INITIAL_HEARTBEAT_TIMEOUT)
    argv = plan.ft_command(got, V041, 3, "h:1", "rid", log_dir="/l", cycle_info_dir="/c")
    assert not [a for a in argv if "heartbeat" in a], argv
    assert ip.level0_grace(got, {}) == 90 + ip.MIN_HEARTBEAT_MARGIN  # NVRx's hard timeout
    env = {"RESILIENT_INPROCESS_SOFT_TIMEOUT": "4", "RESILIENT_INPROCESS_HARD_TIMEOUT": "20",
           "RESILIENT_INPROCESS_HEARTBEAT_TIMEOUT": "60"}
    assert ip.level0_grace(got, env) == 70
    users = plan.LaunchOptions(script="t.py", heartbeat_timeout=40.0)
    assert ip.level0_grace(users, env) == 40  # level 1 acts by then


def test_adapted_heartbeat_floor_leaves_level0_its_time() -> None:
    """A script that adapts level 1's heartbeat timeout (RESILIENT_HEARTBEAT_FLOOR, set when
    the user chose none) never goes below level 0's hard timeout + the margin."""
    opts = plan.LaunchOptions(script="t.py", extra_env={ip.FLOOR_ENV: "10", "X": "1"})
    got = ip.configure(opts, V041, 2, 3, {})
    assert got.extra_env == {ip.FLOOR_ENV: "100", "X": "1"}  # NVRx's hard 90 s + 10
    short = {"RESILIENT_INPROCESS_SOFT_TIMEOUT": "4", "RESILIENT_INPROCESS_HARD_TIMEOUT": "20"}
    assert ip.configure(opts, V041, 2, 3, short).extra_env[ip.FLOOR_ENV] == "30"
    high = plan.LaunchOptions(script="t.py", extra_env={ip.FLOOR_ENV: "500"})
    assert ip.configure(high, V041, 2, 3, {}).extra_env[ip.FLOOR_ENV] == "500"
    assert opts.extra_env[ip.FLOOR_ENV] == "10"  # the caller's options untouched

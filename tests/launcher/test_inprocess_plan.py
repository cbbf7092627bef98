"""resilient-launch --inprocess planning: level-1 flags from ft_launcher --help, timeouts that
leave level 0 its time, the store host the launcher runs."""

from __future__ import annotations

import datetime
import shutil
import subprocess

import pytest

from resilient_slurm.launcher import inprocess_plan as ip

WITH_POLICY = """usage: ft_launcher [-h] [--nnodes NNODES]
  --nnodes NNODES       Number of nodes, or the range of nodes in form
                        <minimum_nodes>:<maximum_nodes>.
  --ft-restart-policy {any-failed,min-healthy}
"""
WITHOUT_POLICY = """usage: ft_launcher [-h] [--nnodes NNODES]
  --nnodes NNODES       Number of nodes, or the range of nodes in form
                        <minimum_nodes>:<maximum_nodes>.
"""


def test_level1_flags() -> None:
    nnodes, extra = ip.ft_args(WITH_POLICY, 2, 3, heartbeat_timeout=60,
                               initial_heartbeat_timeout=300)
    assert nnodes == "2:3" and extra == ["--ft-restart-policy=min-healthy"]


def test_installed_ft_launcher_is_read() -> None:
    exe = shutil.which("ft_launcher")
    if exe is None:
        pytest.skip("ft_launcher not installed")
    text = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120).stdout
    assert ip.restart_policy_supported(text) and ip.node_range_supported(text)


def test_no_policy_is_a_clear_error() -> None:
    with pytest.raises(ip.InprocessPlanError, match="min-healthy"):
        ip.ft_args(WITHOUT_POLICY, 2, 3, 60, 300)


@pytest.mark.parametrize("hb,initial", [(25, 300), (60, 29.9)])
def test_heartbeat_must_exceed_level0_hard_timeout(hb: float, initial: float) -> None:
    with pytest.raises(ip.InprocessPlanError, match="hard timeout"):
        ip.ft_args(WITH_POLICY, 2, 3, hb, initial, hard_timeout=20)


def test_min_nodes_range() -> None:
    with pytest.raises(ip.InprocessPlanError):
        ip.ft_args(WITH_POLICY, 4, 3, 60, 300)


def test_worker_env() -> None:
    env = ip.worker_env("10.0.0.1:4000", 2, "4")
    assert env == {"RESILIENT_INPROCESS_STORE": "10.0.0.1:4000",
                   "RESILIENT_INPROCESS_MIN_WORLD": "8"}
    assert "RESILIENT_INPROCESS_MIN_WORLD" not in ip.worker_env("h:1", 2, "auto")


def test_store_host_serves_and_stops() -> None:
    torch = pytest.importorskip("torch")
    host = ip.StoreHost(host="127.0.0.1")
    port = host.start()
    try:
        client = torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                            timeout=datetime.timedelta(seconds=30))
        client.set("k", "v")
        assert client.get("k") == b"v"
        assert host.address({"b1": "127.0.0.1"}, "b1") == f"127.0.0.1:{port}"
    finally:
        host.stop()
    assert host.proc is not None and host.proc.poll() is not None

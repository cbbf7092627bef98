"""Per-rank step timing: compute separated from collective waits, reported as events."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from resilient_slurm.events import EventLog, read_events
from resilient_slurm.training.steptime import StepTimer, aggregate, kernel_seconds


def test_aggregate_takes_each_nodes_slowest_compute_and_least_wait() -> None:
    rows = [(1.0, 4.0, 5.0, 10, math.nan), (2.0, 3.0, 5.0, 10, math.nan),
            (4.0, 1.0, 5.0, 10, math.nan)]
    got = aggregate(rows, ["a", "a", "b"])
    assert got == {"a": {"compute_s": 0.2, "wait_s": 0.3, "ranks": 2},
                   "b": {"compute_s": 0.4, "wait_s": 0.1, "ranks": 1}}


def test_aggregate_keeps_the_lowest_gpu_score_of_a_node() -> None:
    rows = [(1.0, 0.0, 1.0, 1, 0.9), (1.0, 0.0, 1.0, 1, 0.5), (1.0, 0.0, 1.0, 1, 1.0)]
    got = aggregate(rows, ["a", "a", "b"])
    assert got["a"]["gpu_score"] == 0.5 and got["b"]["gpu_score"] == 1.0


def test_kernel_seconds_sums_num_times_avg_in_ms() -> None:
    class Stat:  # NVRx's Statistic enum members are named MIN, MAX, MED, AVG, STD, NUM
        def __init__(self, name: str) -> None:
            self.name = name

    num, avg, med = Stat("NUM"), Stat("AVG"), Stat("MED")
    summaries = {"gemm": {num: 10, avg: 2.0, med: 1.0}, "relu": {num: 4, avg: 0.5, med: 9.0}}
    assert kernel_seconds(summaries) == pytest.approx(0.022)
    assert kernel_seconds({}) == 0.0


@pytest.fixture
def group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_collectives_count_as_wait_the_rest_as_compute(tmp_path, group) -> None:
    ev = str(tmp_path / "ev.jsonl")
    timer = StepTimer(2, "node7", EventLog(ev, "training"), use_nvrx=False)
    original = dist.barrier

    def barrier(*a, **k):  # a collective that blocks 50 ms, as if waiting for a peer
        time.sleep(0.05)
        return original(*a, **k)

    dist.barrier = barrier
    try:
        with timer.installed():
            assert dist.barrier is not barrier  # wrapped
            for step in (1, 2):
                before = time.monotonic()
                timer.start_step()
                time.sleep(0.03)  # compute
                dist.barrier()
                compute = timer.compute_so_far()
                total = time.monotonic() - before
                # Bounds that hold on a loaded machine: at least the 30 ms of compute, and
                # never the collective's 50 ms (the step's whole wall time less the wait).
                assert 0.03 <= compute <= total - 0.05, (compute, total)
                timer.end_step()
                timer.maybe_report(step)
            dist.barrier(async_op=False)  # outside a step: not counted
        assert dist.barrier is barrier  # restored
    finally:
        dist.barrier = original
    (event,) = [e for e in read_events(ev) if e["kind"] == "step_timing"]
    assert event["step"] == 2 and event["steps"] == 2 and event["world_size"] == 1
    node = event["nodes"]["node7"]
    assert node["ranks"] == 1
    # lower bounds only (a loaded machine stretches a sleep, never shortens it): the 30 ms of
    # compute is compute, the collective's 50 ms is wait (a barrier counted as compute would
    # leave wait near zero)
    assert node["compute_s"] >= 0.03 - 1e-3 and node["wait_s"] >= 0.05 - 1e-3, node
    assert event["step_s"] == pytest.approx(node["compute_s"] + node["wait_s"], abs=1e-3)
    # the cost is measured and is a share of the step, not more than it: its figure is
    # bench/straggler_noise.py's (cost_pct), a load-dependent bound here would test the machine
    assert event["timing"] == "sections" and 0 <= event["cost_s"] <= event["step_s"]
    assert 0 < timer.cost_fraction() < 1


def test_disabled_timer_patches_and_emits_nothing(tmp_path, group) -> None:
    ev = str(tmp_path / "ev.jsonl")
    before = dist.all_reduce
    timer = StepTimer(0, "n", EventLog(ev, "training"))
    with timer.installed():
        assert dist.all_reduce is before
        timer.start_step()
        timer.end_step()
        timer.maybe_report(10, force=True)
    assert not os.path.exists(ev) and timer.cost_fraction() == 0.0


def test_report_only_every_n_steps_or_forced(tmp_path, group) -> None:
    ev = str(tmp_path / "ev.jsonl")
    timer = StepTimer(5, "n", EventLog(ev, "training"), use_nvrx=False)
    with timer.installed():
        for step in range(1, 8):
            timer.start_step()
            timer.end_step()
            timer.maybe_report(step, force=step == 7)
    got = [(e["step"], e["steps"]) for e in read_events(ev)]
    assert got == [(5, 5), (7, 2)]




@pytest.mark.train
def test_train_fsdp_reports_the_slow_node(tmp_path) -> None:
    """Two ranks on two 'nodes'; node1 slowed 3x from step 6: its compute is the higher and
    its wait the lower in every report after the slowdown."""
    from resilient_slurm_lab.faults import TRAIN_SCRIPT as script  # the example, with --fault
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ev = str(tmp_path / "ev.jsonl")
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "SLURMD_NODENAME": f"node{rank}", "RESILIENT_EVENTS_FILE": ev}
        procs.append(subprocess.Popen(
            [sys.executable, script, "--steps", "20", "--checkpoint-dir",
             str(tmp_path / "ckpt"), "--step-timing-every", "5", "--threads", "1",
             "--step-sleep", "0.02", "--fault", "slow@6@node1:3"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "step timing cost" in outs[0]
    timing = [e for e in read_events(ev) if e["kind"] == "step_timing"]
    assert [e["step"] for e in timing] == [5, 10, 15, 20]
    for e in timing[1:]:
        n0, n1 = e["nodes"]["node0"], e["nodes"]["node1"]
        assert n1["compute_s"] > 1.5 * n0["compute_s"], e
        assert n1["wait_s"] < n0["wait_s"], e


class FakeDetector:
    """Stands in for NVRx's CUPTI-backed Detector (hardware seam): kernel summaries in ms."""

    initialized = False
    entered = 0

    @classmethod
    def initialize(cls, **kwargs):
        assert kwargs["gather_on_rank0"] is False
        cls.initialized = True

    @classmethod
    def shutdown(cls):
        cls.initialized = False

    @classmethod
    def detection_section(cls, name, profile_cuda=True):
        import contextlib

        @contextlib.contextmanager
        def cm():
            cls.entered += 1
            yield

        return cm()

    @classmethod
    def generate_report(cls):
        class Stat:
            def __init__(self, name: str) -> None:
                self.name = name

        class Report:
            local_kernel_summaries = {"gemm": {Stat("NUM"): 30, Stat("AVG"): 1.0}}
            gpu_relative_perf_scores = {0: 0.5}

        return Report()


def test_gpu_path_takes_compute_from_nvrx_kernel_times(tmp_path, group) -> None:
    ev = str(tmp_path / "ev.jsonl")
    timer = StepTimer(3, "gpu1", EventLog(ev, "training"), detector=FakeDetector)
    with timer.installed():
        assert FakeDetector.initialized
        for step in (1, 2, 3):
            timer.start_step()
            time.sleep(0.02)
            timer.end_step()
            timer.maybe_report(step)
    assert not FakeDetector.initialized and FakeDetector.entered == 3
    (event,) = [e for e in read_events(ev) if e["kind"] == "step_timing"]
    node = event["nodes"]["gpu1"]
    assert event["timing"] == "nvrx-cupti"
    assert node["compute_s"] == pytest.approx(0.01)  # 30 kernels x 1 ms over 3 steps
    assert node["wait_s"] == pytest.approx(event["step_s"] - 0.01, abs=1e-3)
    assert node["gpu_score"] == 0.5

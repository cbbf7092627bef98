"""Acceptance: SIGKILL ranks at random points mid-save, 20 times; never a torn save."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from resilient_slurm.training import layout, writers  # noqa: E402
from resilient_slurm.training.checkpoint import Checkpointer  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "kill9_worker.py")
WORLD = 2


def _spawn(directory: str, backend: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, WORKER, directory, str(rank), str(WORLD), backend],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             start_new_session=True) for rank in range(WORLD)]


def _go(procs: list[subprocess.Popen], session: str) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"go {session}\n".encode())
        p.stdin.flush()
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == b"ready"


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the rank and its background writers
    except ProcessLookupError:
        pass
    proc.wait()


def _verify(directory: str) -> int:
    step = layout.latest_committed_step(directory)
    assert step is not None
    reader = Checkpointer(directory, backend="sync", rank=0, world_size=WORLD, session="reader")
    for rank in range(WORLD):
        got_step, state = reader.load(rank=rank)
        assert got_step == step and state["step"] == step and state["rank"] == rank
        assert torch.all(state["payload"] == float(step))
        assert torch.all(state["tail"] == float(step)) and state["tail"].numel() == step % 97 + 1
    return step


@pytest.mark.train
def test_kill9_mid_save_never_yields_a_torn_save(tmp_path) -> None:
    directory = str(tmp_path / "ckpt")
    for rank in range(WORLD):  # a committed save to start from
        with Checkpointer(directory, backend="sync", rank=rank, world_size=WORLD,
                          session="s0") as ck:
            ck.save(1, {"step": 1, "rank": rank, "payload": torch.full((10,), 1.0),
                        "tail": torch.full((2,), 1.0)})
    backends = ["sync", "fork"] + (["nvrx"] if writers.nvrx_available() else [])
    rng = random.Random(20240607)
    last, torn_seen = _verify(directory), 0
    upcoming = _spawn(directory, backends[0])
    for i in range(20):
        procs = upcoming
        _go(procs, f"k{i}")
        if i < 19:
            upcoming = _spawn(directory, backends[(i + 1) % len(backends)])
        time.sleep(rng.uniform(0.05, 1.2))
        victim = rng.randrange(WORLD + 1)  # one rank first (the other keeps going), or both
        if victim < WORLD:
            _killpg(procs[victim])
            time.sleep(rng.uniform(0.0, 0.3))
        for p in procs:
            _killpg(p)
        summary = layout.describe(directory)
        leftovers = [n for _, _, files in os.walk(directory) for n in files if ".tmp" in n]
        torn_seen += bool(summary["uncommitted"] or leftovers)
        step = _verify(directory)
        assert step >= last
        last = step
    assert last > 1, "no save ever committed: the test did not exercise the writers"
    assert torn_seen > 0, "no kill landed mid-save: the test did not exercise torn saves"

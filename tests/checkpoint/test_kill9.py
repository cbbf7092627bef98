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

from resilient_slurm.checkpoint import layout, writers  # noqa: E402
from resilient_slurm.checkpoint.checkpointer import Checkpointer  # noqa: E402

ZYGOTE = os.path.join(os.path.dirname(__file__), "kill9_worker.py")
WORLD = 2


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the rank and its background writers
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10
    while _group_alive(pid) and time.monotonic() < deadline:  # zombies do not count
        time.sleep(0.01)


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


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
    zygotes = [subprocess.Popen([sys.executable, ZYGOTE, directory, str(r), str(WORLD)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for r in range(WORLD)]
    try:
        for z in zygotes:
            assert z.stdout is not None and z.stdout.readline().strip() == "ready"
        backends = ["sync", "fork"] + (["nvrx"] if writers.nvrx_available() else [])
        rng = random.Random(20240607)
        last, torn_seen = _verify(directory), 0
        for i in range(20):
            pids = []
            for z in zygotes:
                assert z.stdin is not None and z.stdout is not None
                z.stdin.write(f"go k{i} {backends[i % len(backends)]}\n")
                z.stdin.flush()
                pids.append(int(z.stdout.readline()))
            time.sleep(rng.uniform(0.05, 1.0))
            victim = rng.randrange(WORLD + 1)  # one rank first (the other goes on), or both
            if victim < WORLD:
                _killpg(pids[victim])
                time.sleep(rng.uniform(0.0, 0.3))
            for pid in pids:
                _killpg(pid)
            summary = layout.describe(directory)
            leftovers = [n for _, _, files in os.walk(directory) for n in files if ".tmp" in n]
            torn_seen += bool(summary["uncommitted"] or leftovers)
            step = _verify(directory)
            assert step >= last
            last = step
    finally:
        for z in zygotes:
            z.kill()
            z.wait()
    assert last > 1, "no save ever committed: the test did not exercise the writers"
    assert torn_seen > 0, "no kill landed mid-save: the test did not exercise torn saves"

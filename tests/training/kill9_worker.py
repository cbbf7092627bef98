"""Saves continuously as one rank until killed (used by test_kill9.py).

argv: checkpoint_dir rank world_size backend; then reads "go <session>" on stdin (so the
test can start the next pair, torch imported, while the current pair still runs).
Every state holds its step in every element, so a reader can tell a torn or mixed save.
"""

from __future__ import annotations

import sys

import torch

from resilient_slurm.training.checkpoint import Checkpointer


def main() -> None:
    directory, rank, world, backend = sys.argv[1:5]
    session = sys.stdin.readline().split()[1]
    ck = Checkpointer(directory, keep=2, backend=backend, rank=int(rank),
                      world_size=int(world), session=session)
    step = (ck.latest() or 0) + 1
    payload = torch.empty(3_000_000)  # 12 MB per rank
    print("ready", flush=True)
    while True:
        payload.fill_(float(step))
        ck.save(step, {"step": step, "rank": int(rank), "payload": payload,
                       "tail": torch.full((int(step) % 97 + 1,), float(step))})
        ck.poll()
        step += 1


if __name__ == "__main__":
    main()

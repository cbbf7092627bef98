"""A zygote for test_kill9.py: imports torch once, then forks one saving rank per request.

argv: checkpoint_dir rank world_size. Each stdin line ``go <session> <backend>`` forks a child
that becomes its own process group leader (so the test can SIGKILL it together with its
background writers) and saves continuously; the zygote prints ``<pid>``. Every state holds its
step in every element, so a reader can tell a torn or mixed save.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.writers import nvrx_available


def save_forever(directory: str, rank: int, world: int, session: str, backend: str) -> None:
    ck = Checkpointer(directory, keep=2, backend=backend, rank=rank, world_size=world,
                      session=session)
    step = (ck.latest() or 0) + 1
    payload = torch.empty(2_000_000)  # 8 MB per rank
    while True:
        payload.fill_(float(step))
        ck.save(step, {"step": step, "rank": rank, "payload": payload,
                       "tail": torch.full((step % 97 + 1,), float(step))})
        ck.poll()
        step += 1


def main() -> None:
    directory, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    nvrx_available()  # import NVRx once, here, not in every child
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed children are reaped at once
    print("ready", flush=True)
    for line in sys.stdin:
        _, session, backend = line.split()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the writers need waitpid
            os.setsid()
            try:
                save_forever(directory, rank, world, session, backend)
            finally:
                os._exit(1)
        print(pid, flush=True)


if __name__ == "__main__":
    main()

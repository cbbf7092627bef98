"""Detached helper of ``sandbox controller stall``: SIGSTOP a PID, sleep, SIGCONT it.

Run as a script (``python -I stallhelper.py PID SECONDS``) in its own session, standard library
only, so it outlives whoever asked for the stall. Asked to stop (SIGTERM, SIGINT, SIGHUP), it
sends SIGCONT at once; it sends SIGCONT on every way out short of SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    pid, seconds = int(argv[0]), float(argv[1])

    def finish(signum: int, frame: object) -> None:
        _cont(pid)
        os._exit(0)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, finish)
    try:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
    finally:
        _cont(pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

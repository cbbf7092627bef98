#!/usr/bin/env python3
"""A stand-in for ``ft_launcher`` in ``bench/scale_slurm.py``: the launcher's per-node cost
without a torch import per node. ``--help`` is answered by the installed ft_launcher (so the
launcher detects the same flags); any other call sleeps until SIGTERM or SIGINT and exits 0,
as an ft_launcher whose workers train and never fail."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time

if __name__ == "__main__":
    if "--help" in sys.argv[1:]:
        real = shutil.which("ft_launcher") or os.path.join(os.path.dirname(sys.executable),
                                                           "ft_launcher")
        os.execv(real, [real, *sys.argv[1:]])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)

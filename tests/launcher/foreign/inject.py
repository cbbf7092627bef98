"""Fault injection for the outside-style scripts (the only part a user would not write).

``--fault TYPE@STEP:RANK`` (exception, sigkill, hang) fires once per job: a file under
``--fault-dir`` remembers it across restarts and requeues. Before the fault the rank prints
``[script] fault=TYPE step=N rank=R t=UNIX``: the script's own timestamp of it.
"""

from __future__ import annotations

import os
import signal
import time


def maybe_fault(faults: list[str], fault_dir: str, step: int, rank: int) -> None:
    for spec in faults:
        kind, _, where = spec.partition("@")
        at, _, who = where.partition(":")
        if int(at) != step or int(who or 0) != rank:
            continue
        mark = os.path.join(fault_dir, f"{kind}-{at}-{who or 0}")
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue  # fired before this restart
        print(f"[script] fault={kind} step={step} rank={rank} t={time.time():.3f}", flush=True)
        if kind == "exception":
            raise RuntimeError(f"injected exception at step {step}")
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            while True:
                time.sleep(3600)
        raise SystemExit(f"unknown fault {kind}")

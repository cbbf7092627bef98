#!/usr/bin/env python3
"""Bench section ``scale``, the time-limit part: with slurmctld frozen for 60 s and the
checkpoint directory's filesystem stalled, a time-limit USR1 still ends in a committed save
and a requeued job within the grace.

One production-timing sandbox of 3 nodes (KillWait 30 s, MessageTimeout 10 s; no hooks). A
2-node ``resilient-launch`` job of the real training (``sbatch/train_fsdp.py``: FSDP2 on gloo,
no periodic save, so what is committed is what the stop saved) runs as the job user with
``--time=MIN --signal=B:USR1@120`` (the README's line). Slurm itself sends the warning (up to
60 s early). As soon as the launcher acted on it (its ``stop_cycle`` event), the sandbox's
slurmctld is stopped (SIGSTOP, SIGCONT 60 s later) and the checkpoint directory stalls: a
FUSE mount inside it that never answers its handshake (``stalled/``; no FUSE server or library:
``/dev/fuse`` opened and never read), so every scan of the directory blocks in it until the
bench closes the device, as on a hung Lustre or NFS server; the training's own save directory
(``step_NNNNNN/``) is outside it. Measured: the save committed (the training's ``stopped``
step holds ``COMMITTED``), the requeue's time after the warning and its margin to the job's
end time (the launcher's ``requeue`` event, written once the controller took it), the job
record once the controller answers (requeued, not TIMEOUT). Target: committed save, requeued
job, the requeue before the end time; printed met / NOT MET.

    python bench/scale_usr1.py [--minutes 5] [--freeze 60] [--json OUT]

``bench/run_all.py --only scale-usr1`` (also part of ``--only scale``) writes
``bench/results/scale-usr1.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BIN, TERMINAL, TRAIN_SCRIPT  # noqa: E402

from resilient_slurm.checkpoint.layout import latest_committed_step  # noqa: E402
from resilient_slurm.events import read_events  # noqa: E402
from resilient_slurm.launcher.shim.observe import EventTail  # noqa: E402
from resilient_slurm.slurm import connect  # noqa: E402
from resilient_slurm_lab.sandbox import lifecycle  # noqa: E402

WARN_S = 120  # --signal=B:USR1@120
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2


@contextlib.contextmanager
def stalled_dir(path: str) -> Iterator[None]:
    """``path`` (an empty directory) becomes a FUSE mount whose server never answers: every
    access below it blocks (open, stat, readdir) until the context ends (the device is
    closed: the waiters get ENOTCONN, the mount is detached). Root only."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"stalled", path.encode(), b"fuse", ctypes.c_ulong(MS_NOSUID | MS_NODEV),
                  opts) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"mount fuse on {path}: {os.strerror(err)}")
    try:
        yield
    finally:
        os.close(fd)
        libc.umount2(path.encode(), MNT_DETACH)


def _events(state: str) -> list[dict[str, Any]]:
    return list(read_events(os.path.join(state, "events.jsonl")))


def _submit(root: str, work: str, minutes: int) -> tuple[int, str, str]:
    """The 2-node job, as the job user; (job id, checkpoint dir, state dir)."""
    user = lifecycle.job_user(root)
    lifecycle.make_user_dir(work, user, mode=0o755)
    ckpt = os.path.join(work, "ckpt")
    lifecycle.make_user_dir(ckpt, user, mode=0o755)
    os.makedirs(os.path.join(ckpt, "stalled"), exist_ok=True)  # the stall's mount point
    argv = [str(BIN / "resilient-launch"), "--nproc-per-node=1", "--max-restarts=1",
            "--max-requeues=1", "--term-timeout=30", "--heartbeat-timeout=60",
            "--initial-heartbeat-timeout=300",
            f"--verdict-path={os.path.join(root, 'verdicts', '{node}.json')}",
            str(TRAIN_SCRIPT), "--checkpoint-dir", ckpt,
            "--steps=100000", "--checkpoint-every=100000", "--step-sleep=0.3", "--threads=1",
            "--log-every=1"]
    script = Path(work, "job.sbatch")
    script.write_text("#!/bin/bash\nexec " + shlex.join(argv) + "\n")
    os.chown(script, user.uid, user.gid)
    r = lifecycle.run_as_user(root, [
        "sbatch", "--parsable", "--nodes=2", "--requeue", f"--time={minutes}",
        f"--signal=B:USR1@{WARN_S}", "--open-mode=append", f"--output={work}/slurm-%j.out",
        str(script)], capture_output=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"sbatch: {r.stderr.strip()}")
    return int(r.stdout.strip().split(";")[0]), ckpt, os.path.join(ckpt, ".resilient")


class Seen:
    """The job's events as they come (one incremental reader: the bench polls every 0.05 s on
    the same 2 cores as the job)."""

    def __init__(self, state: str) -> None:
        self.tail = EventTail(os.path.join(state, "events.jsonl"))
        self.all: list[dict[str, Any]] = []

    def first(self, pred: Any, until: float, step: float = 0.1,
              gone: Any = None) -> dict[str, Any] | None:
        """The first event, seen or to come before ``until`` (epoch s), that ``pred`` takes;
        None also once ``gone()`` says the job ended."""
        todo = list(self.all)
        while True:
            for e in todo:
                if pred(e):
                    return e
            if time.time() >= until or (gone is not None and gone()):
                return None
            time.sleep(step)
            self.tail.read()
            todo = list(self.tail.fresh)
            self.all += todo


def measure(root: str, minutes: int, freeze: float) -> dict[str, Any]:
    slurm = connect(conf=os.path.join(root, "etc", "slurm.conf"), backend="cli", timeout=30)
    jid, ckpt, state = _submit(root, os.path.join(root, "users", "bench-usr1"), minutes)
    deadline = time.time() + minutes * 60 + 300
    seen = Seen(state)
    start = seen.first(lambda e: e.get("kind") == "progress" and e.get("step", 0) >= 1,
                       deadline, 1.0, lambda: slurm.job(jid).state in TERMINAL)
    if start is None:
        out = "".join(p.read_text(errors="replace")[-2000:]
                      for p in Path(os.path.dirname(ckpt)).glob("slurm-*.out"))
        raise RuntimeError(f"job {jid}: no training step ({slurm.job(jid).state}): {out}")
    end_time = slurm.job(jid).end_time
    if end_time is None:
        raise RuntimeError(f"job {jid}: no end time in its record")
    print(f"job {jid} trains; end time in {end_time - time.time():.0f} s; waiting for "
          f"Slurm's USR1 (@{WARN_S})", flush=True)
    stop = seen.first(lambda e: e.get("kind") == "stop_cycle"
                      and "SIGUSR1" in str(e.get("reason")), end_time + 60, 0.05)
    if stop is None:
        raise RuntimeError(f"job {jid}: the launcher never acted on a USR1")
    t_usr1 = float(stop["ts"])
    stall = lifecycle.controller_stall(root, freeze, wait=False)
    t_freeze = time.time()
    print(f"USR1 acted on {end_time - t_usr1:.0f} s before the end; slurmctld frozen for "
          f"{freeze:g} s and {ckpt} stalled", flush=True)
    with stalled_dir(os.path.join(ckpt, "stalled")):
        ended = seen.first(lambda e: e.get("kind") in ("requeue", "verdict")
                           and float(e.get("ts", 0)) >= t_usr1, end_time + 60, 0.1)
        stall.wait(timeout=freeze + 30)
        t_thaw = time.time()
        time.sleep(2)
        job = slurm.job(jid)
    evs = [e for e in _events(state) if float(e.get("ts", 0)) >= t_usr1 - 1]
    saved = sorted({int(e["step"]) for e in evs if e.get("kind") == "stopped"})
    committed = latest_committed_step(ckpt)
    rq = next((e for e in evs if e.get("kind") == "requeue" and e.get("reason")), None)
    verdicts = [e.get("verdict") for e in evs if e.get("kind") == "verdict"]
    t_rq = float(rq["ts"]) if rq else None
    slurm.cancel(jid)
    row = {
        "job_id": jid, "warning": f"--signal=B:USR1@{WARN_S}", "time_limit_min": minutes,
        "grace_s": round(end_time - t_usr1, 1), "freeze_s": freeze,
        "frozen_after_usr1_s": round(t_freeze - t_usr1, 2),
        "thawed_after_usr1_s": round(t_thaw - t_usr1, 1), "fs_stalled": True,
        "saved_steps": saved, "committed_step": committed,
        "save_committed": bool(saved) and committed == saved[-1],
        "requeue_after_usr1_s": round(t_rq - t_usr1, 1) if t_rq else None,
        "requeue_call_s": rq.get("took_s") if rq else None,
        "requeue_before_end_s": round(end_time - t_rq, 1) if t_rq else None,
        "first_event_after_usr1": ended.get("kind") if ended else None,
        "verdicts": verdicts, "job_state_after": job.state,
        "restart_count_after": job.restart_count,
        "requeued": job.restart_count == 1 and job.state in ("PENDING", "REQUEUED",
                                                              "REQUEUE_HOLD", "COMPLETING"),
    }
    print(json.dumps(row, indent=1), flush=True)
    return row


def verdict(row: dict[str, Any]) -> dict[str, Any]:
    met = bool(row["save_committed"] and row["requeued"] and row["requeue_before_end_s"]
               and row["requeue_before_end_s"] > 0)
    return {"target": "a committed save and a requeued job, the requeue before the job's end "
                      "time, with slurmctld frozen and the checkpoint directory stalled",
            "met": met}


def section(root: str, minutes: int = 5, freeze: float = 60.0,
            command: str = "") -> dict[str, Any]:
    """One run on a sandbox under ``root`` (started and stopped here), as ``--json`` writes
    it."""
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    lifecycle.up(root, nodes=3, timing="production", hooks=False, timeout=180)
    try:
        row = measure(root, minutes, freeze)
    finally:
        lifecycle.down(root, quiet=True)
    v = verdict(row)
    print(f"time-limit USR1, slurmctld frozen {freeze:g} s, checkpoint directory stalled: "
          f"save committed {row['save_committed']}, requeued {row['requeued']} "
          f"{row['requeue_after_usr1_s']} s after the warning, "
          f"{row['requeue_before_end_s']} s before the end", flush=True)
    print(f"target {v['target']}: {'met' if v['met'] else 'NOT MET'}", flush=True)
    return {"section": "scale", "part": "time-limit USR1 with the controller frozen and the "
                                        "checkpoint directory stalled",
            "command": command or f"bench/scale_usr1.py --minutes {minutes} --freeze {freeze:g}",
            "started": started, "load_avg_at_start": [round(x, 2) for x in load0],
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "timing": "production", **row, **v}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=int, default=5, help="the job's --time")
    ap.add_argument("--freeze", type=float, default=60.0, help="seconds slurmctld is stopped")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = a.dir or tempfile.mkdtemp(prefix="rs-bench-usr1-")
    os.chmod(root, 0o755)
    out = section(root, a.minutes, a.freeze, " ".join(["bench/scale_usr1.py", *sys.argv[1:]]))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
            fh.write("\n")
    return 0 if out["met"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The per-node shim ``srun`` starts: ``python -m resilient_slurm.launcher.node [opts] -- CMD...``.

It fills ``{local_addr}`` (this node's address from ``--addrs-file``, a JSON map node ->
address, so no argv carries the whole node list; the option carrying it is dropped when
unknown) and ``{node}`` into CMD, runs it, and forwards SIGTERM/SIGINT/SIGUSR1/SIGUSR2 to it
(each signal once: Slurm signals every process of the step as well, and a second SIGTERM would
cut ft_launcher's own orderly stop short).

Records, each written atomically under ``--record-dir``:

* ``<node>.started.json`` as soon as CMD runs (``node``, ``step``: ``$SLURM_STEP_ID``, ``pid``,
  ``start``), rewritten with ``signalled`` (time, signal) when the step is asked to stop;
* ``<node>.json`` when CMD ended (``node``, ``rc``, ``start``, ``end``).

So the supervisor tells a node that never answered (no ``started``) from one killed by the
step's teardown (``started`` and ``signalled`` but no exit record) and signals the step by id.

When ``$RESILIENT_EVENTS_FILE`` is set, CMD's stderr passes through this shim line by line, and
the moment NVRx's rank monitor reports missing heartbeats ("Did not get subsequent heartbeat")
becomes a ``hang_detected`` event (node, rank, the timeout it waited), so the report can tell
when a hang was found, not only when training resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from resilient_slurm.events import EventKind, EventLog
from resilient_slurm.fsutil import atomic_write_json
from resilient_slurm.launcher import observe

# Placeholders the plan writes into the command and this shim fills in on each node.
LOCAL_ADDR = "{local_addr}"
NODE = "{node}"


def substitute(cmd: list[str], node: str, addr: str) -> list[str]:
    out = []
    for arg in cmd:
        if LOCAL_ADDR in arg:
            if not addr:
                continue
            arg = arg.replace(LOCAL_ADDR, addr)
        out.append(arg.replace(NODE, node))
    return out


def relay_stderr(stream: IO[bytes], events: EventLog) -> None:
    """Copy ``stream`` to our stderr; emit an event for each line ``observe`` recognises
    (hang reports, failed workers, restarts, rendezvous rounds, first heartbeats)."""
    out = sys.stderr.buffer
    reported: list[tuple[str, dict[str, object]]] = []
    for raw in iter(stream.readline, b""):  # never stop draining: a full pipe blocks training
        try:
            out.write(raw)
            out.flush()
        except OSError:
            pass
        seen = observe.parse_line(raw.decode("utf-8", "replace"))
        if seen is not None and seen[0] == EventKind.WORKER_FAILED:
            if seen in reported:
                # ft_launcher's min-healthy policy repeats "failed (exitcode C) ... (pid: P)"
                # every monitor interval (0.1 s) for a worker it keeps dead: one death, one
                # event (a pid dies once), not ten a second for the rest of the step.
                continue
            reported.append(seen)
        if seen is not None:
            try:
                events.emit(seen[0], **seen[1])
            except OSError as exc:  # the events file is an aid; the relay must go on
                print(f"resilient-launch node: cannot record {seen[0]}: {exc}",
                      file=sys.stderr)


def read_addrs(path: str) -> dict[str, str]:
    """node -> address from the supervisor's JSON map ({} when absent or unreadable)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def started_path(record_dir: str, node: str) -> str:
    return os.path.join(record_dir, f"{node}.started.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="resilient_slurm.launcher.node")
    ap.add_argument("--record-dir", required=True)
    ap.add_argument("--addrs-file", default="")
    ap.add_argument("--capture", action="store_true", help="keep CMD's stdout in the record")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
    if not cmd:
        ap.error("no command")
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    cmd = substitute(cmd, node, read_addrs(ns.addrs_file).get(node, ""))
    start = time.time()
    os.makedirs(ns.record_dir, exist_ok=True)
    events_file = os.environ.get("RESILIENT_EVENTS_FILE")
    watch = bool(events_file) and not ns.capture
    try:
        child = subprocess.Popen(  # noqa: S603 - argv list from the supervisor, no shell
            cmd, stdout=subprocess.PIPE if ns.capture else None,
            stderr=subprocess.PIPE if watch else None)
    except OSError as exc:
        os.makedirs(ns.record_dir, exist_ok=True)
        atomic_write_json(os.path.join(ns.record_dir, f"{node}.json"),
                          {"node": node, "rc": 127, "error": str(exc), "start": start,
                           "end": time.time()})
        return 127

    started: dict[str, object] = {"node": node, "step": os.environ.get("SLURM_STEP_ID"),
                                  "job": os.environ.get("SLURM_JOB_ID"), "pid": child.pid,
                                  "start": round(start, 3)}
    _write_started(ns.record_dir, node, started)
    seen: set[int] = set()

    def forward(signum: int, _frame: object) -> None:
        if signum in seen:
            return
        seen.add(signum)
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass
        if "signalled" not in started:
            started["signalled"] = round(time.time(), 3)
            started["signal"] = signal.Signals(signum).name
            _write_started(ns.record_dir, node, started)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    relay = None
    if watch and events_file and child.stderr is not None:
        relay = threading.Thread(target=relay_stderr, daemon=True,
                                 args=(child.stderr, EventLog(events_file, "node", node=node)))
        relay.start()
    stdout = child.communicate()[0] if ns.capture else None
    rc = child.wait()
    if relay is not None:
        relay.join(timeout=5)
    record: dict[str, object] = {"node": node, "rc": rc, "start": round(start, 3),
                                 "end": round(time.time(), 3), "argv0": os.path.basename(cmd[0])}
    if stdout is not None:
        record["stdout"] = stdout.decode("utf-8", "replace")[-60000:]
    os.makedirs(ns.record_dir, exist_ok=True)
    atomic_write_json(os.path.join(ns.record_dir, f"{node}.json"), record)
    return rc if rc >= 0 else 128 - rc


def _write_started(record_dir: str, node: str, record: dict[str, object]) -> None:
    try:
        atomic_write_json(started_path(record_dir, node), record)
    except OSError as exc:  # the record is evidence; the training must run regardless
        print(f"resilient-launch node: cannot write the started record: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

"""The per-node shim ``srun`` starts: ``python -m resilient_slurm.launcher.node [opts] -- CMD...``.

It fills ``{local_addr}`` (this node's address from ``--addrs``; the option carrying it is
dropped when unknown) and ``{node}`` into CMD, runs it, forwards SIGTERM/SIGINT/SIGUSR1 to it,
and writes ``<record-dir>/<node>.json`` (``node``, ``rc``, ``start``, ``end``) atomically, so
the supervisor knows each node's exit code; a node without a record never finished.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from resilient_slurm.fsutil import atomic_write_json

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


def parse_addrs(text: str) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in text.split(",") if "=" in item)
    return {k: v for k, v in pairs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="resilient_slurm.launcher.node")
    ap.add_argument("--record-dir", required=True)
    ap.add_argument("--addrs", default="")
    ap.add_argument("--capture", action="store_true", help="keep CMD's stdout in the record")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
    if not cmd:
        ap.error("no command")
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    cmd = substitute(cmd, node, parse_addrs(ns.addrs).get(node, ""))
    start = time.time()
    try:
        child = subprocess.Popen(  # noqa: S603 - argv list from the supervisor, no shell
            cmd, stdout=subprocess.PIPE if ns.capture else None, text=True)
    except OSError as exc:
        os.makedirs(ns.record_dir, exist_ok=True)
        atomic_write_json(os.path.join(ns.record_dir, f"{node}.json"),
                          {"node": node, "rc": 127, "error": str(exc), "start": start,
                           "end": time.time()})
        return 127

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    stdout = child.communicate()[0] if ns.capture else None
    rc = child.wait()
    record: dict[str, object] = {"node": node, "rc": rc, "start": round(start, 3),
                                 "end": round(time.time(), 3), "argv0": os.path.basename(cmd[0])}
    if stdout is not None:
        record["stdout"] = stdout[-60000:]
    os.makedirs(ns.record_dir, exist_ok=True)
    atomic_write_json(os.path.join(ns.record_dir, f"{node}.json"), record)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())

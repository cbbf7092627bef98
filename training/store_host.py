"""Hosts the TCPStore that in-process restart uses, outside the training ranks.

NVRx's default stores live on rank 0, so rank 0's death hangs every survivor. The launcher (or
a test) runs this instead: ``python -m resilient_slurm.training.store_host --port 0
--port-file F`` listens, writes the port it got to ``F`` (atomically) and serves until SIGTERM.
Ranks find it through ``RESILIENT_INPROCESS_STORE=host:port``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import tempfile
import threading

import torch.distributed as dist


def serve(host: str, port: int) -> dist.TCPStore:
    """A master TCPStore on ``host:port`` (0: any free port), not waiting for workers."""
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=300))


def _write_atomic(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".port-")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", default=None, help="write the listening port here")
    args = p.parse_args(argv)
    try:
        store = serve(args.host, args.port)
    except Exception as exc:  # e.g. the port is taken
        print(f"store_host: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    if args.port_file:
        _write_atomic(args.port_file, f"{store.port}\n")
    print(f"store_host: listening on {args.host}:{store.port}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: the kernel-log reader on a flood (issue 23 item 2).

A simulated node's log of N benign driver lines (Xid 13 and 43 from a buggy job, non-fatal
SXids) with one Xid 79 at the end, read by the streaming file reader and judged: prints the
time per read, lines per second, the reader's peak Python memory (sizes up to 200,000) and
whether the Xid 79 was found (it must be, at every size). Not a timed test.
Usage: ``python bench/klog_flood_bench.py
[--lines 20000,200000,1000000]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import tracemalloc

from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck.config import HealthConfig
from resilient_slurm.healthcheck.policy import load_policy
from resilient_slurm_lab.hardware.klogfile import FileSource

BENIGN = (
    "[86100.{i:06d}] NVRM: Xid (PCI:0000:53:00): 13, pid=42, name=python, Graphics SM Warp "
    "Exception\n",
    "[86100.{i:06d}] NVRM: Xid (PCI:0000:64:00): 43, pid=42, name=python, Ch 00000008\n",
    "[86100.{i:06d}] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Non-fatal, Link 07 "
    "LTSSM Fault Up\n",
)
FATAL = ("[86390.1] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, GPU has "
         "fallen off the bus.\n")


def one(n: int, tmp: str) -> tuple[float, float | None, bool]:
    path = os.path.join(tmp, f"kernel-{n}.log")
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(BENIGN[i % 3].format(i=i % 1_000_000))
        fh.write(FATAL)
    cfg = HealthConfig()
    pci = {"0000:53:00": (0, "hopper"), "0000:64:00": (1, "hopper"), "0000:86:00": (3, "hopper")}
    ctx = cl.LogContext(cfg, lambda g: load_policy(g, cfg), pci, "hopper")
    t0 = time.perf_counter()
    read = FileSource(path, "b", 86400.0).read(None, 600.0)
    found = any(r.code == "XID79" and r.status == "fail" for r in cl.evaluate_xid(read, ctx))
    spent = time.perf_counter() - t0
    peak = None
    if n <= 200_000:  # tracemalloc slows the read several times: a second pass for memory
        tracemalloc.start()
        FileSource(path, "b", 86400.0).read(None, 600.0)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return spent, peak, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", default="20000,200000,1000000")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="klog-flood-") as tmp:
        print(f"{'lines':>9} {'read+judge s':>12} {'lines/s':>10} {'peak MiB':>9}  Xid 79 found")
        for n in (int(x) for x in args.lines.split(",")):
            spent, peak, found = one(n, tmp)
            mem = f"{peak:>9.2f}" if peak is not None else f"{'-':>9}"
            print(f"{n:>9} {spent:>12.3f} {n / spent:>10.0f} {mem}  {found}")


if __name__ == "__main__":
    main()

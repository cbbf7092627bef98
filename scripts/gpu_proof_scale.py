"""The GPU proof's ``tiers-scale`` step (see docs/gpu-proof.md): ``bench/scale_state.py
--gpu-proof``. On the GPU: a save every step of 2 GiB of state with the copy on a side stream
(the added step time and the stall), the staging buffer registered with CUDA at its exact size,
and a restore into the device tensors in place (the device memory it adds); then a real
reshard (4 ranks -> 3) and restore of 256 MiB with CPU ranks over gloo. PASS means the state
came back bit for bit, the restore added no device memory, the buffer was pinned at the
snapshot's data size, and the reshard received at most 2x the new shard."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpu_proof_report import Line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "bench", "scale_state.py")


def scale_step(p: Any, cap: float) -> None:
    out = os.path.join(p.scratch, "scale.json")
    argv = [sys.executable, BENCH, "--gpu-proof", "--json", out]
    if p.dry or not p.gpu:
        why = "dry run" if p.dry else p.no_gpu
        p.add(Line("tiers-scale", "SKIP", f"{why}: planned `{' '.join(argv[1:])[:300]}`",
                   "arguments checked" if os.path.exists(BENCH) else "bench missing"))
        return
    r = p.run("tiers-scale", argv, cap)
    try:
        with open(out) as fh:
            res = json.load(fh)
    except (OSError, ValueError):
        res = {}
    g = res.get("gpu", {})
    real = res.get("reshard_real") or [{}]
    ratio = (real[0].get("max_recv_mib", 0) / real[0]["shard_mib"]
             if real[0].get("shard_mib") else float("nan"))
    ok = (r.rc == 0 and g.get("restored") is True and g.get("restore_device_extra_bytes") == 0
          and g.get("staging_pinned_bytes", 0) > 0 and ratio <= 2)
    fig = (f"2 GiB: step {g.get('plain_s', 0) * 1e3:.1f} ms, with a save "
           f"{g.get('saved_s', 0) * 1e3:.1f} ms (stall {g.get('stall_s', 0) * 1e3:.2f} ms); "
           f"restore added {g.get('restore_device_extra_bytes')} device bytes; reshard 4->3 "
           f"received {ratio:.2f}x the new shard" if g else "no result")
    p.add(Line("tiers-scale", "PASS" if ok else "FAIL", fig,
               "" if ok else f"exit {r.rc}: {r.out[-400:]}", r.wall_s, r.peak_rss_mib, res))

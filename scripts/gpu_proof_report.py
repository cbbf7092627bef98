"""The GPU proof's summary: one :class:`Line` per result, written as summary.txt and
summary.json beside logs.tar.gz (used by scripts/gpu_proof.py; format in docs/gpu-proof.md)."""

from __future__ import annotations

import json
import os
import tarfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

INSTALL_CAP_S = 45


@dataclass
class Line:
    step: str
    result: str  # PASS | FAIL | SKIP | INFO
    figure: str
    detail: str = ""
    wall_s: float | None = None
    peak_rss_mib: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


def install_line(seconds: float | None, wheels: str) -> Line:
    """The install as measured by gpu-proof.sh, or (dry run) the wheel folder as prepared."""
    if seconds is not None:
        return Line("install", "PASS" if seconds <= INSTALL_CAP_S else "FAIL",
                    f"offline venv install {seconds:.1f} s", wall_s=seconds)
    have = sorted(os.listdir(wheels)) if wheels and os.path.isdir(wheels) else []
    if not have:
        return Line("install", "SKIP", "dry run: no wheels here (scripts/gpu-proof-wheels.sh)")
    mib = sum(os.path.getsize(os.path.join(wheels, f)) for f in have) / 2**20
    need = ("nvidia_resiliency_ext-", "pip-", "setuptools-", "click-", "nvidia_ml_py-")
    missing = [n for n in need if not any(f.startswith(n) for f in have)]
    return Line("install", "FAIL" if missing or mib > 60 else "SKIP",
                f"dry run: wheels {len(have)} files, {mib:.1f} MiB (at most 60)",
                f"missing {missing}" if missing else "")


def finish(p: Any, total_s: float) -> int:
    counts = {k: sum(1 for x in p.lines if x.result == k) for k in ("PASS", "FAIL", "SKIP")}
    verdict = "FAIL" if counts["FAIL"] else "PASS"
    mode = "DRY RUN " if p.dry else "CPU REHEARSAL (not a proof) " if p.rehearse else ""
    head = (f"GPU proof {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} "
            f"{mode}{verdict}: {counts['PASS']} pass, {counts['FAIL']} "
            f"fail, {counts['SKIP']} skipped, {total_s:.0f} s")
    rows = [head] + [f"{x.result:<5} {x.step:<22} {x.figure}" + (f"\n      {x.detail}"
                                                                 if x.detail else "")
                     for x in p.lines]
    with open(os.path.join(p.out, "summary.txt"), "w") as fh:
        fh.write("\n".join(rows) + "\n")
    with open(os.path.join(p.out, "summary.json"), "w") as fh:
        json.dump({"verdict": verdict, "dry_run": p.dry, "total_s": round(total_s, 1),
                   "lines": [asdict(x) for x in p.lines]}, fh, indent=1)
    with tarfile.open(os.path.join(p.out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(p.logs, arcname="logs")
    print(head, flush=True)
    return 1 if counts["FAIL"] else 0



"""The ``scale`` section's memory-tier part: what a reshard moves, what a restore reads, what
a save adds to a step, and the sockets per process, against state size and world size.

    python bench/scale_state.py [--json bench/results/scale-state.json] [--quick]

* ``reshard_plan``: bytes each rank fetches on a change of world size, from the tiers' own
  planner (``checkpoint/reshard.plan``) over synthetic FSDP2 state of 64 MiB to 4 GiB and
  worlds of 4 to 32 ranks (old -> new); the transfer moves exactly the planned pieces
  (tests/checkpoint/test_reshard.py; the real runs below). Target: <= 2x the new shard.
* ``reshard_real`` / ``restore_real``: real multi-process gloo jobs (one rank per simulated
  node, tests/checkpoint/tiers_worker.py): bytes received and read per rank and the restore's
  seconds, against total state and world. Target: proportional to the own shard.
* ``step_cost``: one process, a fixed compute step plus AdamW on N MiB of parameters, a save
  every step with the side copy and without it; the added step time against state size.
* ``sockets``: the sockets the tiers add per training process at 4, 8 and 16 ranks. Target:
  constant.

Growth is fitted with ``bench/fits.py``; each target prints met / NOT MET.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = REPO / "tests" / "checkpoint" / "tiers_worker.py"
sys.path.insert(0, str(HERE))
import fits  # noqa: E402

MIB = 2**20


def plan_sweep(sizes_mib: list[int], worlds: list[int]) -> list[dict[str, Any]]:
    """Bytes per rank the planner fetches: 12 equal 2-D tensors (a model's weights and two
    AdamW moments), FSDP2 row shards."""
    from resilient_slurm.checkpoint import reshard

    def chunk(n: int, shards: int, s: int) -> tuple[int, int]:
        size = -(-n // shards)
        return min(s * size, n), min((s + 1) * size, n)

    out = []
    for total in sizes_mib:
        cols, tensors = 1024, 12
        rows = total * MIB // (tensors * cols * 4)
        for w in worlds:
            for old, new in ((w, w - 1), (w, w // 2), (w // 2, w)):
                tables = {}
                for o in range(old):
                    tab, at = {}, 64
                    for i in range(tensors):
                        a, b = chunk(rows, old, o)
                        n = (b - a) * cols * 4
                        tab[f"/t{i}"] = reshard.Entry("rows", a, b, (rows, cols), "float32",
                                                      at, n)
                        at += n
                    tables[o] = tab
                holdings = [{(o, 1, old)} if o < old else set() for o in range(new)]
                for o in range(new, old):  # the lost ranks' copies are on their peers
                    holdings[o % new].add((o, 1, old))
                reader = reshard.readers(holdings, 1, old, new)
                worst, ratio = 0, 0.0
                for me in range(new):
                    want = [(f"/t{i}", "rows", *chunk(rows, new, me), [rows, cols])
                            for i in range(tensors)]
                    pieces, why = reshard.plan(want, tables, reader, me, me if me < old else 0,
                                               (0, 64))
                    assert not why, why
                    moved = sum(p.nbytes for p in pieces if p.reader != me and p.row >= 0)
                    shard = sum((b - a) * cols * 4 for _, _, a, b, _ in want)
                    worst = max(worst, moved)
                    ratio = max(ratio, moved / shard if shard else 0.0)
                out.append({"total_mib": total, "old": old, "new": new,
                            "max_moved_mib": round(worst / MIB, 3),
                            "new_shard_mib": round(total / new, 3),
                            "moved_over_shard": round(ratio, 3),
                            "before_mib": round(total * (old - 1) / old, 1)})
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ranks(root: str, nodes: list[str], args: list[str], timeout: float = 900) -> str:
    """One worker rank per simulated node; node memory under ``root/<node>``."""
    port, procs = _port(), []
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RESILIENT_", "SLURM", "TORCHELASTIC"))}
    for rank, node in enumerate(nodes):
        env = {**base, "RANK": str(rank), "WORLD_SIZE": str(len(nodes)), "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RESILIENT_NODE": node, "RESILIENT_TIER1_DIR": os.path.join(root, node),
               "RESILIENT_CKPT_JOB": "job", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
        if p.returncode != 0:
            raise RuntimeError(out[-2000:])
    return "\n".join(outs)


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in re.findall(r"\[worker\] (\{.*\})", out)]


def width_for(total_mib: float) -> int:
    """The worker's MLP width whose fp32 weights + AdamW moments total about this."""
    return max(16, int((total_mib * MIB / 24) ** 0.5))


def real_runs(work: str, totals: list[int], worlds: list[tuple[int, int]]
              ) -> list[dict[str, Any]]:
    """Save on ``old`` ranks, lose a node (or not), restore on ``new``: per rank the bytes
    read and received and the restore's seconds."""
    out = []
    for total in totals:
        for old, new in worlds:
            root = os.path.join(work, f"r{total}-{old}-{new}")
            w = width_for(total)
            ranks(root, [f"n{i}" for i in range(old)], ["--width", str(w), "--exit-after", "2"])
            for i in range(new, old):
                shutil.rmtree(os.path.join(root, f"n{i}"), ignore_errors=True)
            got = lines(ranks(root, [f"n{i}" for i in range(new)],
                              ["--width", str(w), "--steps", "2"]))
            shard = max(x["shard_bytes"] for x in got)
            out.append({"total_mib": round(sum(x["shard_bytes"] for x in got) / MIB, 1),
                        "old": old, "new": new, "tier": got[0]["tier"],
                        "max_read_mib": round(max(x["read_bytes"] for x in got) / MIB, 3),
                        "max_recv_mib": round(max(x["recv_bytes"] for x in got) / MIB, 3),
                        "max_rchar_mib": round(max(x["rchar"] for x in got) / MIB, 3),
                        "shard_mib": round(shard / MIB, 3),
                        "restore_s_max": max(x["restore_s"] for x in got)})
            shutil.rmtree(root, ignore_errors=True)
            print(f"  {out[-1]}", flush=True)
    return out


STEP_CODE = r"""
import json, os, sys, time, torch, torch.distributed as dist
mib, side, steps = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo")
from resilient_slurm.checkpoint import Tiers
n = mib * 2**20 // 12 // 4
w = torch.nn.Parameter(torch.zeros(n))
opt = torch.optim.AdamW([w], lr=1e-3)
a = torch.randn(192, 192)
tiers = Tiers(root=sys.argv[4], side_copy=side, replicate=False)
def step(save, k):
    t0 = time.perf_counter()
    for _ in range(25):
        a @ a
    w.grad = torch.ones_like(w)
    opt.step()
    if save:
        tiers.save({"w": w, "o": opt.state_dict()["state"]}, k)
    return time.perf_counter() - t0
step(True, 0); tiers.wait()
plain, saved = [], []
for r in range(steps):
    plain += [step(False, 0) for _ in range(3)]
    saved += [step(True, r * 3 + i + 1) for i in range(3)]
tiers.close()
plain.sort(); saved.sort()
print(json.dumps({"mib": mib, "side": side, "plain_s": plain[len(plain) // 2],
                  "saved_s": saved[len(saved) // 2], "stall_s": tiers.timings.stall_total /
                  max(1, tiers.timings.saves), "copy_wait_s": tiers.timings.copy_wait_total}))
"""


def step_cost(work: str, sizes: list[int], steps: int) -> list[dict[str, Any]]:
    out = []
    for mib in sizes:
        for side in (True, False):
            root = os.path.join(work, f"step-{mib}-{int(side)}")
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("RESILIENT_")},
                   "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(_port()), "RESILIENT_CKPT_JOB": "job"}
            r = subprocess.run([sys.executable, "-c", STEP_CODE, str(mib), str(int(side)),
                                str(steps), root], env=env, capture_output=True, text=True,
                               timeout=900, check=True)
            x = json.loads(r.stdout.strip().splitlines()[-1])
            x["added_s"] = round(x["saved_s"] - x["plain_s"], 4)
            x["added_share"] = round(x["added_s"] / x["plain_s"], 3)
            out.append(x)
            shutil.rmtree(root, ignore_errors=True)
            print(f"  {x}", flush=True)
    return out


def sockets(work: str, worlds: list[int]) -> list[dict[str, Any]]:
    out = []
    for w in worlds:
        text = ranks(os.path.join(work, f"fd{w}"), [f"n{i}" for i in range(w)],
                     ["--width", "16", "--steps", "2"])
        tiers = [int(x) for x in re.findall(r"tier_sockets=(\d+)", text)]
        fds = [int(x) for x in re.findall(r" fds=(\d+)", text)]
        out.append({"world": w, "tier_sockets_max": max(tiers), "fds_max": max(fds),
                    "ranks_seen": len(tiers)})
        print(f"  {out[-1]}", flush=True)
    return out


GPU_CODE = r"""
import json, sys, time, torch, torch.distributed as dist
from resilient_slurm.checkpoint import Tiers
mib = int(sys.argv[1])
dist.init_process_group("gloo")
n = mib * 2**20 // 12 // 4
w = torch.nn.Parameter(torch.zeros(n, device="cuda"))
opt = torch.optim.AdamW([w], lr=1e-3)
a = torch.randn(4096, 4096, device="cuda")
tiers = Tiers(root=sys.argv[2], replicate=False)
def state():
    return {"w": w, "o": opt.state_dict()["state"]}
def step(save, k):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    w.grad = torch.ones_like(w)
    opt.step()
    stall = tiers.save(state(), k) if save else 0.0
    torch.cuda.synchronize()
    return time.perf_counter() - t0, stall
step(True, 0); tiers.wait()
plain = sorted(step(False, 0)[0] for _ in range(6))
saved = [step(True, i + 1) for i in range(6)]
tiers.wait()
want = {k: v.detach().clone() for k, v in [("w", w.detach())]}
snap = int(tiers.stats()["snapshot_bytes"])
with torch.no_grad():
    w.zero_()
before = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
got = tiers.load(state())
extra = torch.cuda.max_memory_allocated() - before
ok = got == 6 and torch.equal(w.detach(), want["w"])
print(json.dumps({"mib": mib, "plain_s": plain[3], "saved_s": sorted(x for x, _ in saved)[3],
                  "stall_s": sorted(s for _, s in saved)[3], "restored": ok,
                  "restore_device_extra_bytes": int(extra),
                  "staging_pinned_bytes": int(tiers.stats()["staging_pinned_bytes"]),
                  "snapshot_bytes": snap, "read_bytes": tiers.last_load.get("read_bytes")}))
tiers.close()
"""


def gpu_check(work: str, mib: int) -> dict[str, Any]:
    """One CUDA process: a save every step with the side stream (the added step time and the
    stall), the staging buffer registered at its exact size, and a restore into the device
    tensors in place (the device memory it adds: 0 when nothing is cloned)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RESILIENT_")},
           "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_port()), "RESILIENT_CKPT_JOB": "job"}
    r = subprocess.run([sys.executable, "-c", GPU_CODE, str(mib), os.path.join(work, "gpu")],
                       env=env, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        return {"error": (r.stdout + r.stderr)[-1500:]}
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def gpu_proof(out: str | None) -> int:
    """The GPU proof's ``tiers-scale`` step (scripts/gpu_proof_scale.py): the CUDA check at
    2 GiB, then a real reshard (4 ranks -> 3) and restore of 256 MiB with CPU ranks."""
    work = tempfile.mkdtemp(prefix="rs-scale-gpu-")
    try:
        res: dict[str, Any] = {"gpu": gpu_check(work, 2048)}
        res["reshard_real"] = real_runs(work, [256], [(4, 3)])
        res["restore_real"] = real_runs(work, [256], [(2, 2)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if out:
        Path(out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res))
    return 0 if "error" not in res["gpu"] else 1


def verdicts(res: dict[str, Any]) -> list[str]:
    out = []
    worst = max(p["moved_over_shard"] for p in res["reshard_plan"])
    out.append(f"reshard: bytes moved per rank <= 2x the new shard: worst {worst:.2f}x: "
               + ("met" if worst <= 2 else "NOT MET"))
    real = res["reshard_real"]
    if real:
        rw = max(x["max_recv_mib"] / x["shard_mib"] for x in real if x["shard_mib"])
        out.append(f"reshard (real gloo runs): received per rank <= 2x the new shard: worst "
                   f"{rw:.2f}x: " + ("met" if rw <= 2 else "NOT MET"))
    rest = res["restore_real"]
    if len(rest) >= 2:
        f = fits.fit([round(x["total_mib"]) for x in rest],
                     [x["max_read_mib"] / x["shard_mib"] for x in rest])
        ratio = max(x["max_read_mib"] / x["shard_mib"] for x in rest)
        out.append(f"restore: bytes read per rank / own shard against total state: "
                   f"{f.growth} (max {ratio:.2f}x): "
                   + ("met" if f.growth in ("constant", "decreasing") and ratio <= 1.5
                      else "NOT MET"))
    fd = res["sockets"]
    if len(fd) >= 2:
        f = fits.fit([x["world"] for x in fd], [x["tier_sockets_max"] for x in fd])
        out.append(f"sockets the tiers add per process against world size: {f.describe('')}"
                   ": " + ("met" if f.growth in ("constant", "decreasing") else "NOT MET"))
    sc = [x for x in res["step_cost"] if x["side"]]
    if len(sc) >= 2:
        f = fits.fit([x["mib"] for x in sc], [max(x["added_s"], 1e-4) for x in sc])
        out.append("save's added step time against state size (side copy, CPU): "
                   + f.describe("s") + "; figures only (no target on CPU)")
    return out


def run(quick: bool = False) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="rs-scale-")
    try:
        t0 = time.time()
        res: dict[str, Any] = {"section": "scale", "part": "state"}
        print("reshard plan sweep", flush=True)
        res["reshard_plan"] = plan_sweep([64, 512, 4096], [4, 8, 16, 32])
        print("reshard, real runs", flush=True)
        res["reshard_real"] = real_runs(work, [64] if quick else [16, 64],
                                        [(4, 3), (2, 4)])
        print("restore, real runs", flush=True)
        res["restore_real"] = real_runs(work, [16, 64] if quick else [16, 64, 256], [(2, 2)])
        print("step cost", flush=True)
        res["step_cost"] = step_cost(work, [16, 64] if quick else [16, 64, 256],
                                     2 if quick else 4)
        print("sockets", flush=True)
        res["sockets"] = sockets(work, [4, 8] if quick else [4, 8, 16])
        res["verdicts"] = verdicts(res)
        res["seconds"] = round(time.time() - t0, 1)
        res["load_avg_at_end"] = [round(x, 1) for x in os.getloadavg()]
        return res
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    ap.add_argument("--gpu-proof", action="store_true",
                    help="the GPU proof's tiers-scale step (needs CUDA)")
    a = ap.parse_args()
    if a.gpu_proof:
        return gpu_proof(a.json)
    res = run(a.quick)
    for line in res["verdicts"]:
        print(line, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

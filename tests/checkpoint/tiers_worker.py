"""A rank of a small FSDP2 (or HSDP: ``--replicas R``) job using the memory tiers through
``training/memory_tiers.load_into``, for tests of what a restore reads, moves and falls back
to. Prints one ``[worker] {json}`` line per rank: the step and tier restored, the bytes the
restore read from node memory, received and sent, the rank's own snapshot size, the bytes the
process read (``/proc/self/io`` rchar) during the restore, whether the state handed to the
tiers was the live tensors, and at the end the full model's digest."""

import argparse
import json
import math
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from resilient_slurm import checkpoint
from resilient_slurm.checkpoint import store
from resilient_slurm.training import digest
from resilient_slurm.training.memory_tiers import load_into

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--exit-after", type=int, default=0)
p.add_argument("--width", type=int, default=64)
p.add_argument("--replicas", type=int, default=1, help="HSDP: replicas x shards")
p.add_argument("--durable-dir", default=None)
p.add_argument("--durable-every", type=int, default=0)
p.add_argument("--poison-at", type=int, default=0, help="NaN weights saved at this step")
p.add_argument("--signal-at", type=int, default=0, help="rank 0 gets SIGTERM in this step")
p.add_argument("--check", action="store_true", help="reject a restore whose loss is not finite")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(args.width, 2 * args.width), nn.ReLU(),
                      nn.Linear(2 * args.width, 8))
if args.replicas > 1:
    mesh = init_device_mesh("cpu", (args.replicas, world // args.replicas),
                            mesh_dim_names=("replicate", "shard"))
    fully_shard(model, mesh=mesh)
else:
    fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
model(torch.zeros(1, args.width)).sum().mul(0).backward()
opt.zero_grad()


def sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


before_tiers = sockets()
tiers = checkpoint.configure(durable_dir=args.durable_dir, durable_every=args.durable_every)
probe = torch.ones(4, args.width)


def _local(t: Any) -> torch.Tensor:
    return t.to_local()  # a DTensor's shard


def rchar() -> int:
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar")).split()[1])


live: list[bool] = []
ptrs = {_local(p).data_ptr() for p in model.parameters()}


def load(state, **kw):
    live.append(all(t.to_local().data_ptr() in ptrs for t in state["model"].values()))
    return tiers.load(state, **kw)


def finite() -> bool:
    with torch.no_grad():
        return bool(math.isfinite(model(probe).square().mean().item()))


before, t0 = rchar(), time.perf_counter()
got = load_into(load, model, opt, check=finite if args.check else None)
read, restore_s = rchar() - before, time.perf_counter() - t0
start = got[0] if got else 0
own = [s for s in store.scan(tiers.job_dir) if s.owner == rank and s.step == start]
info = {"rank": rank, "step": start, "tier": tiers.last_load.get("tier"), "live": live[0],
        "read_bytes": tiers.last_load.get("read_bytes"),
        "recv_bytes": tiers.last_load.get("recv_bytes"),
        "sent_bytes": tiers.last_load.get("sent_bytes"), "rchar": read,
        "restore_s": round(restore_s, 4),
        "snapshot_bytes": own[0].nbytes if own else None,
        "shard_bytes": sum(_local(p).numel() * 4 * 3 for p in model.parameters())}
print("[worker] " + json.dumps(info), flush=True)

for step in range(start + 1, args.steps + 1):
    g = torch.Generator().manual_seed(step * 100 + rank % max(1, world // args.replicas))
    loss = model(torch.randn(16, args.width, generator=g)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == args.poison_at:
        with torch.no_grad():
            for prm in model.parameters():
                _local(prm).fill_(float("nan"))
    if step == args.signal_at and rank == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    msd, osd = get_state_dict(model, opt)
    checkpoint.save({"model": msd, "optim": osd}, step)
    if step == args.exit_after:
        tiers.wait()
        dist.barrier()
        os._exit(0)

if rank < 8:
    print(f"[worker] rank={rank} tier_sockets={sockets() - before_tiers} "
          f"fds={len(os.listdir('/proc/self/fd'))}", flush=True)
checkpoint.close()
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
if rank == 0:
    print(f"[worker] done digest={digest.tensor_digest(full)}", flush=True)  # type: ignore[arg-type]
dist.barrier()
sys.stdout.flush()
os._exit(0)

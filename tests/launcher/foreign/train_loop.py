"""A plain PyTorch DDP loop as its users write it for `torchrun`: no NVRx, no heartbeats, no
step reports, nothing of resilient_slurm; its own `torch.save` checkpoint every few steps
under `--ckpt-dir`, resumed from at start. resilient-launch's instrumentation alone gives it
hang detection, progress and the report's steps."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--step-time", type=float, default=0.2)
p.add_argument("--save-every", type=int, default=10)
p.add_argument("--ckpt-dir", default="")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DistributedDataParallel(nn.Linear(16, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
path = os.path.join(args.ckpt_dir, "ckpt.pt") if args.ckpt_dir else ""
start = 0
if path and os.path.exists(path):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"]
print(f"[script] rank={rank} start step={start} t={time.time():.3f}", flush=True)
for step in range(start + 1, args.steps + 1):
    loss = model(torch.randn(8, 16)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.step_time)
    if rank == 0:
        print(f"[script] step={step} loss={loss.item():.4f} t={time.time():.3f}", flush=True)
        if path and step % args.save_every == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
    dist.barrier()
if rank == 0:
    print(f"[script] done step={args.steps} t={time.time():.3f}", flush=True)
dist.destroy_process_group()

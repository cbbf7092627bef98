"""A DDP training script as a user writes it for `torchrun` + NVRx heartbeats, with no
checkpoint at all: every restart begins again at step 1. Nothing of resilient_slurm is
imported (fault injection aside, from the test folder)."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inject import maybe_fault  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--step-time", type=float, default=0.2)
p.add_argument("--fault", action="append", default=[])
p.add_argument("--fault-dir", default="/tmp")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
ft = RankMonitorClient()
ft.init_workload_monitoring()
model = DistributedDataParallel(nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if rank == 0:
    print(f"[script] start step=0 t={time.time():.3f}", flush=True)
for step in range(1, args.steps + 1):
    maybe_fault(args.fault, args.fault_dir, step, rank)
    loss = model(torch.randn(8, 16)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.step_time)
    ft.send_heartbeat()
    if rank == 0:
        print(f"[script] step={step} loss={loss.item():.4f} t={time.time():.3f}", flush=True)
if rank == 0:
    print(f"[script] done step={args.steps} t={time.time():.3f}", flush=True)
ft.shutdown_workload_monitoring()
dist.destroy_process_group()

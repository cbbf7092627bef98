"""An FSDP2 training script as a user writes it for `torchrun` + NVRx, not for resilient-slurm:
its own DCP checkpoints (``ckpt/iter_NNNN/`` marked complete by its own ``_SAVED`` file), NVRx
rank heartbeats, prints its steps. Nothing of resilient_slurm is imported (fault injection
aside, from the test folder)."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inject import maybe_fault  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--save-dir", required=True)
p.add_argument("--save-every", type=int, default=5)
p.add_argument("--step-time", type=float, default=0.2)
p.add_argument("--fault", action="append", default=[])
p.add_argument("--fault-dir", default="/tmp")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
ft = RankMonitorClient()
ft.init_workload_monitoring()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def latest(save_dir):
    done = [d for d in os.listdir(save_dir) if os.path.exists(os.path.join(save_dir, d, "_SAVED"))]
    return max(done, key=lambda d: int(d.split("_")[1]), default=None) if done else None


os.makedirs(args.save_dir, exist_ok=True)
start = 0
last = latest(args.save_dir)
if last is not None:
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.path.join(args.save_dir, last))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    start = int(last.split("_")[1])
if rank == 0:
    print(f"[script] start step={start} t={time.time():.3f}", flush=True)

for step in range(start + 1, args.steps + 1):
    maybe_fault(args.fault, args.fault_dir, step, rank)
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(16, 32, generator=g)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.step_time)
    ft.send_heartbeat()
    if rank == 0:
        print(f"[script] step={step} loss={loss.item():.4f} t={time.time():.3f}", flush=True)
    if step % args.save_every == 0:
        path = os.path.join(args.save_dir, f"iter_{step:04d}")
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        dist.barrier()
        if rank == 0:
            open(os.path.join(path, "_SAVED"), "w").close()

if rank == 0:
    print(f"[script] done step={args.steps} t={time.time():.3f}", flush=True)
ft.shutdown_workload_monitoring()
dist.destroy_process_group()

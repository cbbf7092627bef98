"""``train_dcp.py`` with its checkpoint calls swapped for resilient_slurm's memory tiers: one
import and two calls (``checkpoint.load`` where ``dcp.load`` stood, ``checkpoint.save`` where
``dcp.save`` stood), saving every step. A fault fires mid-step (after the step's compute,
before its save), so the previous step's background write had the compute time to finish.
Prints its steps, where it resumed from (and which tier), the per-save stall and, at the end,
the full weights' digest."""

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard

from resilient_slurm import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inject import maybe_fault  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--save-dir", required=True)
p.add_argument("--save-every", type=int, default=1)
p.add_argument("--durable-every", type=int, default=0,
               help="a durable save at every step that is a multiple of N")
p.add_argument("--step-time", type=float, default=0.2)
p.add_argument("--fault", action="append", default=[])
p.add_argument("--fault-dir", default="/tmp")
p.add_argument("--exit-after", type=int, default=0, help="leave abruptly after this step")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
ft = None
if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):  # under ft_launcher
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    ft = RankMonitorClient()
    ft.init_workload_monitoring()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
# one real step builds the optimizer state, so the state dict has every tensor to fill
model(torch.zeros(1, 32)).sum().mul(0).backward()
opt.zero_grad()

msd, osd = get_state_dict(model, opt)
state = {"model": msd, "optim": osd}
start = checkpoint.load(state, durable_dir=args.save_dir, durable_every=args.durable_every)
if start is not None:
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
tier = checkpoint.configure().last_load.get("tier")
start = start or 0
print(f"[script] rank={rank} start step={start} tier={tier} t={time.time():.3f} "
      f"node={os.environ.get('SLURMD_NODENAME', '-')}", flush=True)

for step in range(start + 1, args.steps + 1):
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(16, 32, generator=g)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.step_time)
    maybe_fault(args.fault, args.fault_dir, step, rank)  # mid-step: after the compute
    if ft is not None:
        ft.send_heartbeat()
    if step % args.save_every == 0:
        msd, osd = get_state_dict(model, opt)
        stall = checkpoint.save({"model": msd, "optim": osd}, step)
        if rank == 0:
            print(f"[script] step={step} loss={loss.item():.6f} stall_ms={stall * 1e3:.2f} "
                  f"t={time.time():.3f}", flush=True)
    if step == args.exit_after:
        checkpoint.configure().wait()  # the snapshot is in memory and on the peer
        dist.barrier()
        os._exit(0)

checkpoint.close()
full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
h = hashlib.sha256()
for k in sorted(full):
    h.update(k.encode())
    h.update(full[k].detach().contiguous().numpy().tobytes())
if rank == 0:
    st = checkpoint.stats()
    print(f"[script] tiers snapshot_bytes={st['snapshot_bytes']} "
          f"node_dir_bytes={st['node_dir_bytes']} peer={st['peer']} ({st['peer_why']})",
          flush=True)
    print(f"[script] done step={args.steps} digest={h.hexdigest()} t={time.time():.3f}",
          flush=True)
if ft is not None:
    ft.shutdown_workload_monitoring()
dist.barrier()
sys.stdout.flush()
os._exit(0)

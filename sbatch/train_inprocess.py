"""``train_fsdp.py --inprocess``: the same training, re-entered in the live processes on a fault.

Each iteration (the first, and one per restart) creates the process group on a fresh prefix of
the external store, rebuilds the model, FSDP, the optimizer and the ordered reduce, and
restores the newest step held in the memory tiers (``resilient_slurm.training.memstate`` over
``resilient_slurm.checkpoint``: the rank's snapshot in node memory, the peer node's copy), or,
with nothing there, the newest disk checkpoint as ``train_fsdp.py`` does. A rank that died is
left out (world 3 -> 2); the old world's snapshots (the dead rank's from the peer node's copy)
are resharded onto the survivors and the virtual shards keep the result bitwise equal to the
fault-free run. A relaunch by the level above (new processes) resumes from the same tiers.

Events (current rank 0, ``$RESILIENT_EVENTS_FILE``): ``resume`` per iteration with
``iteration``, ``level`` (``inprocess`` after a restart), ``source_state`` (``memory``,
``disk``, ``fresh``), ``lost_ranks`` (initial ranks gone) and ``lost_nodes``; ``recovered``
(step, iteration) when the first step after a restart completes; plus train_fsdp's events.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from resilient_slurm.checkpoint.checkpointer import Checkpointer
from resilient_slurm.checkpoint.layout import latest_commit
from resilient_slurm.events import (
    Checkpoint,
    Complete,
    EventKind,
    EventLog,
    Progress,
    Recovered,
    TrainingResume,
)
from resilient_slurm.sbatch.train_common import (
    TinyTransformer,
    batch,
    rng_state,
    set_rng_state,
)
from resilient_slurm.training import fsdp_state, inprocess, ordered_reduce
from resilient_slurm.training import inprocess_timeouts as ip_timeouts
from resilient_slurm.training.digest import tensor_digest
from resilient_slurm.training.liveness import Liveness
from resilient_slurm.training.step_hooks import RankInfo, StepHooksFactory


def _load_disk(ckpt: Checkpointer, model: nn.Module, optimizer: torch.optim.Optimizer,
               world: int) -> tuple[int, int | None, dict[str, Any] | None]:
    commit = latest_commit(ckpt.directory)
    if commit is None:
        return 0, None, None
    if commit.world_size == world:
        start, saved = ckpt.load(commit.step)  # type: ignore[misc]
        fsdp_state.restore(model, optimizer, saved["train"])
        return start, saved.get("virtual_dp"), saved["rng"]
    start, states = ckpt.load_all(commit.step)  # type: ignore[misc]
    fsdp_state.restore_resharded(model, optimizer, [s["train"] for s in states])
    return start, states[0].get("virtual_dp"), None


def train(ctx: inprocess.Context, args: argparse.Namespace, hooks: StepHooksFactory,
          liveness: Liveness) -> str:
    marks = [time.perf_counter()]
    ctx.init_process_group()
    marks.append(time.perf_counter())
    rank, world = ctx.rank, ctx.world_size
    node = os.environ.get("SLURMD_NODENAME")
    events_path = os.environ.get("RESILIENT_EVENTS_FILE")
    events = EventLog(events_path, "training", rank=0) if events_path and rank == 0 else None

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[train rank0 it{ctx.iteration}] {msg}", flush=True)

    step_hooks = hooks(RankInfo(rank, world, int(os.environ.get("LOCAL_RANK", 0)), args.steps,
                                args.checkpoint_dir))
    torch.manual_seed(args.seed)
    model = TinyTransformer(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    marks.append(time.perf_counter())
    backend = "sync" if args.sync_checkpoint else args.checkpoint_backend
    ckpt = Checkpointer(args.checkpoint_dir, every=args.checkpoint_every, keep=args.keep,
                        backend=backend, heartbeat=liveness.beat)
    marks.append(time.perf_counter())
    restored = ctx.memory.restore(model, optimizer)
    if restored is not None:
        start, vdp, rng, source = (restored.step, restored.extra["virtual_dp"],
                                   restored.extra["rng"], "memory")
        log(f"memory tiers: step {start} from {restored.tier}")
    else:
        start, vdp, rng = _load_disk(ckpt, model, optimizer, world)
        source = "disk" if start else "fresh"
    vdp = vdp or args.virtual_dp or world
    if rng is not None:
        set_rng_state(rng)
    shards = ordered_reduce.VirtualShards(vdp, world, rank)
    step_hooks.set_world(vdp, world)
    ordered_reduce.install(model, shards)
    marks.append(time.perf_counter())
    phases = " ".join(f"{name} {b - a:.3f}" for name, a, b in
                      zip(("pg", "build", "ckpt", "restore"), marks, marks[1:], strict=False))
    lost_nodes = sorted(set(ctx.nodes_of(ctx.lost)) - {""})
    standby_nodes = sorted(set(ctx.nodes_of(ctx.standby)) - {""})
    log(f"world {world} (initial {ctx.initial_world_size}, lost {ctx.lost}, standing by "
        f"{ctx.standby}), state from {source} at step {start} (s: {phases})")
    if events:
        events.emit(EventKind.RESUME, **TrainingResume(
            step=start, fresh=start == 0, world_size=world, node=node, virtual_dp=vdp,
            iteration=ctx.iteration, level="inprocess" if ctx.iteration else None,
            source_state=source, lost_ranks=ctx.lost, lost_nodes=lost_nodes,
            standby_nodes=standby_nodes or None,
            restart=os.environ.get("TORCHELASTIC_RESTART_COUNT")))
    loss_value, step_time = math.nan, 0.0
    for step in range(start + 1, args.steps + 1):
        liveness.beat()
        step_hooks.before_step(step)
        t1 = time.perf_counter()
        losses = []
        for rnd in range(shards.rounds):
            shards.round = rnd
            shard = shards.shard(rnd)
            s = 0 if shard is None else shard
            torch.manual_seed(args.seed * 7_919 + step * 104_729 + s)
            x, y = batch(args, step, s, torch.device("cpu"))
            loss = nn.functional.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1))
            (loss * (shards.loss_scale if shard is not None else 0.0)).backward()
            if shard is not None:
                losses.append(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ctx.completed(step, model, optimizer, extra={"virtual_dp": vdp, "rng": rng_state(),
                                                     "data": {"position": step}})
        if args.step_sleep > 0:  # the rest of a step's work: the snapshot is written meanwhile
            time.sleep(args.step_sleep)
        step_time = time.perf_counter() - t1
        loss_value = float(torch.stack(losses).mean()) if losses else math.nan
        if events and step == start + 1 and ctx.iteration:
            events.emit(EventKind.RECOVERED,
                        **Recovered(step=step, iteration=ctx.iteration, world_size=world))
        for committed in ckpt.poll():
            if events:
                events.emit(EventKind.CHECKPOINT, **Checkpoint(step=committed))
        if ckpt.due(step) or step == args.steps:
            ckpt.save(step, {"step": step, "train": fsdp_state.capture(model, optimizer),
                             "rng": rng_state(), "data": {"position": step},
                             "world_size": world, "virtual_dp": vdp})
        if step % args.log_every == 0 or step == args.steps:
            log(f"step {step} loss {loss_value:.4f} step_time {step_time * 1e3:.1f} ms "
                f"(peer copy {ctx.memory.last_refresh_s * 1e3:.1f} ms in the background, "
                f"{ctx.memory.peer_bytes} B)")
            if events:
                events.emit(EventKind.PROGRESS, **Progress(
                    step=step, loss=loss_value, step_time=step_time,
                    peer_copy_s=ctx.memory.last_refresh_s))
    with liveness.keepalive():
        ctx.memory.close(timeout_s=30.0)  # the last snapshot in node memory and on the peer
        ckpt.close()
        ckpt.wait_committed(args.steps, timeout=args.pg_timeout)
    digest = tensor_digest(fsdp_state.full_model_state(model))
    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, digest)
    if len(set(digests)) != 1:
        raise RuntimeError(f"digests differ across ranks: {digests}")
    if events:
        events.emit(EventKind.COMPLETE, **Complete(step=args.steps, digest=digest, loss=loss_value,
                                                   iteration=ctx.iteration))
    dist.barrier()
    dist.destroy_process_group()
    return digest


def _warm_up(args: argparse.Namespace) -> None:
    """One forward and backward before the Wrapper starts: first-use costs (kernels, autograd)
    are paid before the soft timeout runs (a slow first build caused false restarts)."""
    torch.manual_seed(args.seed)
    model = TinyTransformer(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)
    x, y = batch(args, 0, 0, torch.device("cpu"))
    nn.functional.cross_entropy(model(x).reshape(-1, args.vocab), y.reshape(-1)).backward()


def run_inprocess(args: argparse.Namespace, hooks: StepHooksFactory) -> int:
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // max(local_world, 1)))
    try:
        settings = inprocess.InprocessSettings.from_env(
            soft_timeout=args.soft_timeout, hard_timeout=args.hard_timeout,
            peer_every=args.peer_every, pg_timeout=args.pg_timeout)
        settings.check()
    except ValueError as exc:
        print(f"train_fsdp.py: {exc}", file=sys.stderr)
        return 2
    if os.environ.get("RANK", "0") == "0":
        print("[inprocess] NVRx Wrapper timeouts: " + ip_timeouts.describe(
            settings.given_timeouts(), ip_timeouts.installed_defaults()), flush=True)
    _warm_up(args)
    liveness = Liveness()  # one NVRx heartbeat client for the process's life
    try:
        digest = inprocess.run(lambda ctx: train(ctx, args, hooks, liveness), settings)
    except inprocess.RequirementError as exc:
        print(f"train_fsdp.py: {exc}", file=sys.stderr)
        return 2
    liveness.close()
    if digest is not None:
        print(f"weights digest: {digest}", flush=True)
    return 0

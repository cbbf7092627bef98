"""Example resilient training: a small transformer under FSDP2 with async checkpoints and
NVRx heartbeats.

Runs under ``ft_launcher`` (NVRx), plain ``torchrun``, or alone (one process). gloo on CPU,
NCCL on GPUs, chosen automatically. Resumes bitwise-exactly from the newest committed save
(model, optimizer, step, RNG states, data position), or with ``--memory-tiers`` from a newer
snapshot in node or peer memory: with a fixed seed on CPU, an interrupted and resumed run ends
with the same ``weights digest: <hex>`` line as an uninterrupted one (on CUDA too:
deterministic kernels are selected, see :func:`train_common.deterministic_cuda`), also when it
resumes on another number of ranks (elastic): the global batch is ``--virtual-dp`` fixed shards
whose gradients are summed in shard order (``resilient_slurm.training.ordered_reduce``), so the
result does not depend on the world size.

Events (rank 0, to ``$RESILIENT_EVENTS_FILE`` when set, source ``training``): ``resume``
(step resumed from, 0 = fresh), ``progress`` (step, loss, step_time) every ``--log-every``
steps and at each commit, ``checkpoint`` (step, stall) when a save is committed, ``complete``
(step, digest), ``stopped`` (step, signal) after SIGTERM/SIGUSR1: all ranks save the same step,
wait for its commit and exit 143. ``step_timing`` every ``--step-timing-every`` steps: per
node, compute and collective-wait seconds per step (``training.steptime``), to find
stragglers; its cost is printed at the end.

``main(argv, hooks=...)`` takes hooks called around every step (``training.step_hooks``: none
by default); the lab's fault injection wraps this script through them
(``python -m resilient_slurm_lab.faults.train``)."""

from __future__ import annotations

import argparse
import math
import os
import random
import socket
import sys
import time
import warnings
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
    Stopped,
    TrainingResume,
)
from resilient_slurm.sbatch.train_common import (
    TinyTransformer,
    batch,
    rng_state,
    set_rng_state,
    setup_distributed,
    shutdown,
)
from resilient_slurm.training import fsdp_state, memory_tiers, ordered_reduce
from resilient_slurm.training import inprocess_timeouts as ip_timeouts
from resilient_slurm.training.digest import tensor_digest
from resilient_slurm.training.liveness import Liveness
from resilient_slurm.training.step_hooks import RankInfo, StepHooksFactory, no_hooks
from resilient_slurm.training.steptime import StepTimer
from resilient_slurm.training.stop import EXIT_STOPPED, StopSignal

warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--keep", type=int, default=3, help="committed saves to keep")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--sync-checkpoint", action="store_true",
                   help="blocking torch.save instead of the async writer")
    p.add_argument("--checkpoint-backend", default="auto", choices=["auto", "nvrx", "fork"],
                   help="async writer (ignored with --sync-checkpoint)")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="artificial per-step compute time in seconds")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8, help="per virtual shard")
    p.add_argument("--virtual-dp", type=int, default=None,
                   help="virtual data-parallel shards per step (global batch = this x "
                        "--batch-size); fixed for the job's life: default the saved value, "
                        "else the world size at a fresh start")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads per rank (default: cores / local ranks); results are "
                        "bitwise reproducible only with the same value")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--pg-timeout", type=float, default=300.0,
                   help="process-group timeout in seconds (how long healthy ranks wait)")
    p.add_argument("--step-timing-every", type=int,
                   default=int(os.environ.get("RESILIENT_STEP_TIMING_EVERY", "10")),
                   help="emit per-node compute/wait timing every N steps (0: off; env "
                        "RESILIENT_STEP_TIMING_EVERY)")
    p.add_argument("--inprocess", action="store_true",
                   default=bool(os.environ.get("RESILIENT_INPROCESS_STORE")),
                   help="in-process restart (NVRx Wrapper): faults are recovered in the live "
                        "processes; needs RESILIENT_INPROCESS_STORE (sbatch/train_inprocess.py); "
                        "on by default when `resilient-launch --inprocess` set that")
    p.add_argument("--memory-tiers", action="store_true", help="snapshot every step to node "
                   "and peer memory too, resume from the newest (training/memory_tiers.py)")
    p.add_argument("--peer-every", type=int, default=1, choices=(0, 1),
                   help="with --inprocess: 1 (default) keeps a copy of every snapshot on the "
                   "peer node (memory tier 2), 0 none (a lost rank's state then comes from "
                   "disk)")
    for name in ("soft_timeout", "hard_timeout"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=None, metavar="S",
                       help=f"with --inprocess: {ip_timeouts.MEANING[name]} [default: "
                            f"${ip_timeouts.env_name(name)}, else NVRx's own, "
                            f"{ip_timeouts.NVRX_DEFAULTS[name]:g} s in NVRx 0.4.1-0.7]")
    p.epilog = ("With --inprocess, NVRx's Wrapper timeouts are NVRx's own unless set: "
                + ", ".join(f"${ip_timeouts.env_name(n)} [{ip_timeouts.NVRX_DEFAULTS[n]:g} s]"
                            for n in ip_timeouts.NAMES)
                + " (seconds; resilient-launch --inprocess checks its heartbeat timeouts "
                  "against the hard one). The flags above win for this script.")
    return p.parse_args(argv)


ADAPT_AFTER = 10  # steps of heartbeats before the heartbeat timeout is calculated


def main(argv: list[str] | None = None, hooks: StepHooksFactory = no_hooks) -> int:
    """Train; ``hooks`` builds each rank's calls around its steps (none by default)."""
    args = parse_args(argv)
    if args.step_timing_every < 0:
        print("train_fsdp.py: --step-timing-every must be >= 0", file=sys.stderr)
        return 2
    if args.virtual_dp is not None and args.virtual_dp < 1:
        print("train_fsdp.py: --virtual-dp must be >= 1", file=sys.stderr)
        return 2
    if args.inprocess:
        from resilient_slurm.sbatch.train_inprocess import run_inprocess

        return run_inprocess(args, hooks)
    rank, world, local_rank, device = setup_distributed(args.pg_timeout, args.threads)
    events_path = os.environ.get("RESILIENT_EVENTS_FILE")
    events = EventLog(events_path, "training", rank=0) if events_path and rank == 0 else None
    node = os.environ.get("SLURMD_NODENAME")

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[train rank0] {msg}", flush=True)

    liveness = Liveness()
    step_hooks = hooks(RankInfo(rank, world, local_rank, args.steps, args.checkpoint_dir))

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    model = TinyTransformer(args.vocab, args.d_model, args.layers, args.heads, args.seq_len)
    model.to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    backend = "sync" if args.sync_checkpoint else args.checkpoint_backend
    ckpt = Checkpointer(args.checkpoint_dir, every=args.checkpoint_every, keep=args.keep,
                        backend=backend, heartbeat=liveness.beat)
    start, saved_vdp, mem = 0, None, memory_tiers.MemoryTiers(args.memory_tiers)
    with liveness.keepalive():
        commit = latest_commit(ckpt.directory)
        if commit is not None and commit.world_size == world:
            start, saved = ckpt.load(commit.step)  # type: ignore[misc]
            fsdp_state.restore(model, optimizer, saved["train"])
            set_rng_state(saved["rng"])
            assert saved["data"]["position"] == start
            saved_vdp = saved.get("virtual_dp")
        elif commit is not None:  # elastic: the shards of another world size, merged
            start, states = ckpt.load_all(commit.step)  # type: ignore[misc]
            fsdp_state.restore_resharded(model, optimizer, [s["train"] for s in states])
            saved_vdp = states[0].get("virtual_dp")
            log(f"resharded save {start} from {commit.world_size} to {world} ranks")
        start = mem.resume(model, optimizer, start)  # collective, after any disk restore
    if saved_vdp and args.virtual_dp and saved_vdp != args.virtual_dp:
        log(f"keeping the saved --virtual-dp {saved_vdp} (asked {args.virtual_dp}): the global "
            "batch is fixed for the job's life")
    shards = ordered_reduce.VirtualShards(saved_vdp or args.virtual_dp or world, world, rank)
    step_hooks.set_world(shards.virtual_dp, world)
    if (planned := step_hooks.plan()) is not None:
        log(planned)
    if not ordered_reduce.install(model, shards):
        log("this torch has no FSDP custom reduce-scatter: gradients are averaged by FSDP, "
            "so a resume on another world size is not bitwise exact")
    log(f"world {world} on {device} ({ckpt.backend} checkpoints, {shards.virtual_dp} virtual "
        f"shards in {shards.rounds} round(s)), "
        f"{f'resuming from step {start}' if start else 'fresh start'}, node={node}")
    if events:
        events.emit(EventKind.RESUME, **TrainingResume(
            step=start, fresh=start == 0, world_size=world, node=node,
            virtual_dp=shards.virtual_dp, tier=mem.tier,
            restart=os.environ.get("TORCHELASTIC_RESTART_COUNT"),
            requeue=os.environ.get("SLURM_RESTART_COUNT")))

    stop = StopSignal()
    stopped: int | None = None
    loss_value, step_time = math.nan, 0.0
    timer = StepTimer(args.step_timing_every, node or socket.gethostname(), events)
    timer.install()
    # resilient-launch asks (RESILIENT_HEARTBEAT_FLOOR) when the user set no heartbeat timeout:
    # after ADAPT_AFTER steps, NVRx's own calculation from the heartbeats seen, with a floor.
    adapt_floor = float(os.environ.get("RESILIENT_HEARTBEAT_FLOOR") or 0)
    stalled = 0.0  # seconds saves blocked training since the last checkpoint event
    for step in range(start + 1, args.steps + 1):
        liveness.beat()
        if adapt_floor and step == start + ADAPT_AFTER + 1:  # the same step on every rank
            hb = liveness.adapt_timeouts(adapt_floor)
            if hb is not None:
                log(f"heartbeat timeout adapted to {hb:.1f} s (NVRx's calculation from "
                    f"{ADAPT_AFTER} steps, floor {adapt_floor:g} s)")
        step_hooks.before_step(step)
        t0 = time.perf_counter()
        timer.start_step()
        losses = []
        for rnd in range(shards.rounds):
            shards.round = rnd
            shard = shards.shard(rnd)  # None: idle this round (its gradient is discarded)
            s = 0 if shard is None else shard
            torch.manual_seed(args.seed * 7_919 + step * 104_729 + s)  # dropout, per shard
            x, y = batch(args, step, s, device)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), y.reshape(-1))
            (loss * (shards.loss_scale if shard is not None else 0.0)).backward()
            if shard is not None:
                losses.append(loss.detach())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mem.save(model, optimizer, step)
        if args.step_sleep > 0:
            time.sleep(args.step_sleep)
        compute = timer.compute_so_far() if timer.enabled else time.perf_counter() - t0
        delay = step_hooks.after_compute(step, compute)
        if delay > 0:
            time.sleep(delay)
        step_time = time.perf_counter() - t0
        loss_value = float(torch.stack(losses).mean()) if losses else math.nan
        for committed in ckpt.poll():
            log(f"checkpoint {committed} committed")
            if events:
                events.emit(EventKind.CHECKPOINT, **Checkpoint(step=committed,
                                                               save_s=round(stalled, 4)))
                stalled = 0.0
                events.emit(EventKind.PROGRESS,
                            **Progress(step=step, loss=loss_value, step_time=step_time))
        stopped = stop.agreed()  # a collective: waiting for a straggler ends here at the latest
        timer.end_step()
        timer.maybe_report(step, force=bool(stopped) or step == args.steps)
        if ckpt.due(step) or step == args.steps or stopped:
            state = {"step": step, "train": fsdp_state.capture(model, optimizer),
                     "rng": rng_state(), "data": {"position": step}, "world_size": world,
                     "virtual_dp": shards.virtual_dp}
            stall = ckpt.save(step, state)
            stalled += stall
            log(f"step {step} save scheduled, stall {stall * 1e3:.1f} ms")
        if step % args.log_every == 0 or step == args.steps:
            log(f"step {step} loss {loss_value:.4f} step_time {step_time * 1e3:.1f} ms")
            if events:
                events.emit(EventKind.PROGRESS,
                            **Progress(step=step, loss=loss_value, step_time=step_time))
        if stopped:
            break

    last = step if start < args.steps else start
    mem.close()  # before the process group goes (the tiers' writer has a group of its own)
    if timer.enabled and timer.wall_total > 0:
        log(f"step timing cost {timer.cost_total * 1e3:.1f} ms of {timer.wall_total:.2f} s "
            f"measured ({timer.cost_fraction() * 100:.3f} % of step time, {timer.source})")
    timer.uninstall()
    with liveness.keepalive():
        ckpt.close()
        if start < args.steps:
            ckpt.wait_committed(last, timeout=args.pg_timeout)
        for committed in ckpt.poll():
            if events:
                events.emit(EventKind.CHECKPOINT, **Checkpoint(step=committed))
    if stopped:
        log(f"stopped by signal {stopped} at step {last}, checkpoint committed")
        if events:
            events.emit(EventKind.STOPPED, **Stopped(step=last, signal=stopped, loss=loss_value))
        shutdown()
        return EXIT_STOPPED
    digest = tensor_digest(fsdp_state.full_model_state(model))
    digests: list[Any] = [None] * world
    dist.all_gather_object(digests, digest)
    if len(set(digests)) != 1:
        print(f"rank {rank}: digests differ across ranks: {digests}", file=sys.stderr)
        return 1
    print(f"weights digest: {digest}", flush=True)
    if events:
        events.emit(EventKind.COMPLETE, **Complete(step=args.steps, digest=digest, loss=loss_value))
    liveness.close()
    shutdown()
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is saved and the process group destroyed: leave without interpreter
    # finalization, where torch's gloo teardown was seen (once, in CI, on a loaded VM) to abort
    # with "terminate called without an active exception" after a successful run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

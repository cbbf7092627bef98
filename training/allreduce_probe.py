"""A single-node all-reduce bandwidth probe for the return-to-service validation when
nccl-tests' ``all_reduce_perf`` is not installed: ``python -m
resilient_slurm.training.allreduce_probe --gpus N``.

One process per GPU (NCCL), or two on a machine without CUDA (gloo, so the probe itself can be
exercised anywhere), all-reduce one buffer ``--iters`` times after a warm-up and print the bus
bandwidth as nccl-tests does (``# Avg bus bandwidth : X``, GB/s: algorithm bandwidth times
2(n-1)/n). Runs in its own interpreter: the hooks that start it never import torch.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, size: int, iters: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    buf = torch.ones(size // 4, dtype=torch.float32, device=device)
    for _ in range(3):
        dist.all_reduce(buf)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if cuda:
        torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / iters
    if rank == 0:
        algbw = size / elapsed / 1e9
        busbw = algbw * 2 * (world - 1) / world
        with open(out, "w", encoding="utf-8") as f:
            f.write(f"{busbw:.2f}\n")
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1, help="GPUs on the node (processes)")
    parser.add_argument("--bytes", type=int, default=64 << 20, help="buffer size")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        import tempfile

        import torch
        import torch.multiprocessing as mp
    except ImportError as exc:
        print(f"allreduce_probe: torch is not importable: {exc}", file=sys.stderr)
        return 3
    world = args.gpus if torch.cuda.is_available() else 2
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "busbw")
        mp.spawn(_worker, args=(world, _free_port(), args.bytes, args.iters, out), nprocs=world)
        with open(out, encoding="utf-8") as f:
            busbw = float(f.read())
    backend = "nccl" if torch.cuda.is_available() else "gloo (no CUDA)"
    print(f"# allreduce_probe: {world} processes, {backend}, {args.bytes} bytes")
    print(f"# Avg bus bandwidth    : {busbw:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

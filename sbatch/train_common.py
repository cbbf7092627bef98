"""What the example training scripts share (``train_fsdp.py``, ``train_inprocess.py``): the
tiny transformer, its synthetic batches (a pure function of seed, step and shard), the
process group's set-up and teardown (deterministic CUDA kernels where there is a GPU), and
the RNG state a checkpoint carries. Imported by both; imports neither.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import socket
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1,
                                       batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def batch(args: argparse.Namespace, step: int, shard: int,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data, a pure function of (seed, step, virtual shard): the data position is the
    step. Each sequence counts up by its own stride modulo the vocabulary."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1_009 + shard)
    start = torch.randint(0, args.vocab, (args.batch_size, 1), generator=g)
    stride = torch.randint(1, 4, (args.batch_size, 1), generator=g)
    seq = (start + stride * torch.arange(args.seq_len + 1)) % args.vocab
    return seq[:, :-1].to(device), seq[:, 1:].to(device)


def deterministic_cuda() -> None:
    """Bitwise-reproducible CUDA steps, so a resumed run's digest can equal a fault-free one:
    deterministic kernels where torch has them (warning where it has none), cuBLAS with a
    fixed workspace (read when its first handle is made, hence before any matmul), and the
    math attention kernel (the fused ones' backward passes accumulate in varying order)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def setup_distributed(timeout_s: float,
                      threads: int | None) -> tuple[int, int, int, torch.device]:
    use_cuda = torch.cuda.is_available()
    if "RANK" not in os.environ:  # alone: a one-process group on a free local port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        deterministic_cuda()
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // max(local_world, 1)))
    dist.init_process_group("nccl" if use_cuda else "gloo",
                            timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), local_rank, device


def shutdown() -> None:
    """Leave together: a rank tearing down gloo while a peer still talks can abort the peer."""
    dist.barrier()
    dist.destroy_process_group()


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])

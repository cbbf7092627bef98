"""Run ``tests/launcher/foreign/train_tiers.py`` as real multi-process torch.distributed jobs:
ranks on simulated nodes (each node its own memory directory), or under ft_launcher."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "launcher", "foreign", "train_tiers.py")
BIN = os.path.dirname(sys.executable)


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("RESILIENT_", "SLURM", "TORCHELASTIC", "FT_"))}
    out["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


WORKER = os.path.join(HERE, "tiers_worker.py")


def on_nodes(root: str, nodes: list[str], args: list[str], timeout: float = 240,
             extra_env: dict[str, str] | None = None, check: bool = True,
             script: str = SCRIPT) -> str:
    """One rank per simulated node ``nodes[r]`` running ``script``; node memory under
    ``root/<node>``. With ``check`` every rank must exit 0."""
    port, procs = _port(), []
    for rank, node in enumerate(nodes):
        e = {**env(), "RANK": str(rank), "WORLD_SIZE": str(len(nodes)), "LOCAL_RANK": "0",
             "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "RESILIENT_NODE": node, "RESILIENT_TIER1_DIR": os.path.join(root, node),
             "RESILIENT_CKPT_JOB": "job", **(extra_env or {})}
        procs.append(subprocess.Popen(
            [sys.executable, script, *(["--save-dir", os.path.join(root, "ckpt")]
                                       if script == SCRIPT else []), *args],
            env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outs.append(out)
        assert proc.returncode == 0 or not check, out[-3000:]
    return "\n".join(outs)


def under_ft_launcher(root: str, args: list[str], nproc: int = 2, timeout: float = 300) -> str:
    e = {**env(), "RESILIENT_TIER1_DIR": os.path.join(root, "shm")}
    argv = [os.path.join(BIN, "ft_launcher"), "--standalone", "--nproc-per-node", str(nproc),
            "--max-restarts", "3", "--monitor-interval", "0.5", "--term-timeout", "5",
            "--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "30",
            "--ft-enable-nic-monitor=false", SCRIPT, "--save-dir", os.path.join(root, "ckpt"),
            "--fault-dir", root, *args]
    proc = subprocess.run(argv, env=e, capture_output=True, text=True, timeout=timeout,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def starts(out: str) -> list[tuple[int, int, str]]:
    """``(rank, step, tier)`` of every start line, in order."""
    return [(int(r), int(s), t) for r, s, t in
            re.findall(r"\[script\] rank=(\d+) start step=(\d+) tier=(.+?) t=", out)]


def worker_lines(out: str) -> dict[int, dict]:
    """The ``[worker] {json}`` line of each rank, by rank."""
    import json

    lines = [json.loads(x) for x in re.findall(r"\[worker\] (\{.*\})", out)]
    return {int(x["rank"]): x for x in lines}


def digest(out: str) -> str:
    found = re.findall(r"digest=([0-9a-f]{64})", out)
    assert len(found) == 1, out[-3000:]
    return found[0]

"""Node ranks pinned across cycles: a node keeps its node rank (hence its ranks) from one cycle
to the next, and a hot spare takes exactly the node rank of the node it replaces. After a swap
the survivors then restore from their own node's memory tier and only the spare's ranks
fetch the lost node's state from a peer's copy (``training/memory_tiers.py``).

Contract: **node i of a cycle's node list (``plan.Cycle.nodes``) runs as node rank i**
(:func:`node_ranks`), its ranks ``i * nproc_per_node + local rank``. Three parties keep it:

* the supervisor keeps the order: a spare takes the swapped node's place in the list
  (``spares.Choice.nodes``); a shrink drops nodes and keeps the others' order;
* srun keeps it: ``--distribution=arbitrary`` (:data:`SRUN_DISTRIBUTION`) with the node list in
  order (never compressed into a hostlist, which sorts) starts task i (``SLURM_PROCID`` = i) on
  node i. Without it srun numbers the tasks in the allocation's order, so a spare that sorts
  after the survivors would shift every survivor after the lost node down one rank;
* NVRx keeps it: from 0.5 its rendezvous takes each node's "infrastructure rank" from
  ``SLURM_PROCID`` (``fault_tolerance/utils.py: get_infrastructure_rank``) and gives group ranks
  in that order. NVRx reads ``NVRX_INFRA_RANK_FROM_NODENAME``, ``CROSS_SLURM_PROCID`` and a
  block topology address (``SLURM_TOPOLOGY_ADDR_PATTERN=block.node``) before ``SLURM_PROCID``:
  where a site sets one of them, its order wins and ranks are not pinned. NVRx 0.4.x has no
  infrastructure rank: a fresh rendezvous sorts its participants by (``--local-addr``,
  ft_launcher's pid) and honours nothing else (``_ft_rendezvous.py: _assign_ranks``; the
  previous round's ranks are reused only inside one rendezvous, never across cycles). There
  the node shim runs ft_launcher through :func:`main` (:func:`program`), which puts
  ``SLURM_PROCID`` first in that sort key: the order 0.5+ takes from ``SLURM_PROCID`` itself.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

SRUN_DISTRIBUTION = "--distribution=arbitrary"  # task i on the i-th node of --nodelist
DEFAULT_FT_LAUNCHER = "ft_launcher"


def node_ranks(nodes: Sequence[str]) -> dict[str, int]:
    """Each node's node rank in a cycle on ``nodes`` (its position in the list)."""
    return {n: i for i, n in enumerate(nodes)}


def needs_pin(version: str) -> bool:
    """Whether this NVRx release (``0.4.1``...) ignores ``SLURM_PROCID`` in its rendezvous
    (before 0.5). An unknown version is not patched."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (0, 5)


def program(ft_launcher: str, version: str) -> list[str]:
    """The command that starts ft_launcher on each node: ``ft_launcher`` itself, or on NVRx
    0.4.x (when the user did not name another program) this module, which runs the same
    ft_launcher with its node ranks in ``SLURM_PROCID`` order."""
    if ft_launcher == DEFAULT_FT_LAUNCHER and needs_pin(version):  # named: plans read as such
        return [sys.executable, "-m", "resilient_slurm.launcher.cycle.rank_pin",
                DEFAULT_FT_LAUNCHER]
    return [ft_launcher]


def pin(rendezvous: Any, procid: int) -> None:
    """Make NVRx 0.4.x's node descriptor (``_ft_rendezvous._NodeDesc(addr, pid, local_id)``,
    ordered field by field) sort by ``procid`` first: ``addr`` gets it as a fixed-width
    prefix. ``addr`` only names the node in NVRx's log lines and records (the rendezvous
    address workers connect to is ``--local-addr`` itself, kept apart in the agent's spec)."""
    gen = rendezvous._NodeDescGenerator
    original = gen.generate

    def generate(self: Any, local_addr: str | None = None) -> Any:
        desc = original(self, local_addr)
        return dataclasses.replace(desc, addr=f"{procid:09d}-{desc.addr}")

    gen.generate = generate


def main() -> None:
    """``python -m resilient_slurm.launcher.cycle.rank_pin ft_launcher FT_LAUNCHER_ARGS...``: NVRx
    0.4.x's ft_launcher with its node ranks in srun's task order."""
    if sys.argv[1:2] != [DEFAULT_FT_LAUNCHER]:
        print(f"usage: python -m resilient_slurm.launcher.cycle.rank_pin {DEFAULT_FT_LAUNCHER} "
              "[ft_launcher's arguments]", file=sys.stderr, flush=True)
        sys.exit(2)
    del sys.argv[1]
    if sys.path[:1] in ([""], [os.getcwd()]):  # as the ft_launcher script: not the job's cwd
        del sys.path[0]
    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous, launcher

    procid = os.environ.get("SLURM_PROCID", "")
    if procid.isdigit():
        pin(_ft_rendezvous, int(procid))
    else:
        print("resilient-launch: SLURM_PROCID unset: node ranks follow NVRx's own order",
              file=sys.stderr, flush=True)
    sys.argv[0] = DEFAULT_FT_LAUNCHER
    sys.exit(launcher.main())


if __name__ == "__main__":
    main()

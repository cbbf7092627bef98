"""Node ranks pinned across a spare swap (``launcher/cycle/rank_pin.py``): the cycle after a swap
runs every surviving node at its node rank of the cycle before, and the spare at exactly the lost
node's, through srun's task order (``SLURM_PROCID``, which NVRx 0.5+ ranks nodes by) and, on
NVRx 0.4.x, through the installed NVRx's own rank assignment with the pin applied."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from importlib.metadata import version

import hypothesis.strategies as st
from hypothesis import given, settings

from resilient_slurm.launcher.cycle import plan, rank_pin
from resilient_slurm.launcher.recovery import spares
from resilient_slurm.launcher.recovery.spares import Health

FEATURES = plan.Features(frozenset(), "0.6.0")


def srun_task_order(argv: Sequence[str], allocation: Sequence[str], files: dict[str, str]
                    ) -> list[str]:
    """The node of each task (index: ``SLURM_PROCID``) srun starts for ``argv`` (srun(1)):
    with ``--distribution=arbitrary`` the tasks are laid out in the order ``--nodelist`` (or
    the ``--nodefile``) names the nodes; otherwise (block) one task per node in the job's node
    order, whatever order the list names them in."""
    listed = next(a.split("=", 1)[1].split(",") for a in argv if a.startswith("--nodelist="))\
        if any(a.startswith("--nodelist=") for a in argv) else \
        files[next(a.split("=", 1)[1] for a in argv if a.startswith("--nodefile="))].split()
    if "--distribution=arbitrary" in argv:
        return listed
    return sorted(listed, key=list(allocation).index)


def ranks_of(cycle: plan.Cycle, allocation: Sequence[str]) -> dict[str, int]:
    """node -> node rank NVRx 0.5+ gives it: group ranks in ``SLURM_PROCID`` order."""
    order = srun_task_order(cycle.argv, allocation, dict(cycle.files))
    assert sorted(order) == sorted(cycle.nodes)
    return {n: i for i, n in enumerate(order)}


@given(st.lists(st.integers(0, 40), unique=True, min_size=2, max_size=10),
       st.integers(1, 3), st.data())
def test_survivors_keep_their_node_rank_and_the_spare_takes_the_lost_ones(
        numbers, spare_count, data) -> None:
    allocation = [f"n{i}" for i in sorted(numbers)]  # the allocation's (Slurm's) order
    spare_count = min(spare_count, len(allocation) - 1)
    batch = data.draw(st.sampled_from(allocation))
    train, standby = spares.split(allocation, len(allocation) - spare_count, batch)
    alloc = plan.Allocation(job_id=5, nodes=tuple(allocation), batch_node=batch)
    opts = plan.LaunchOptions(script="t.py")
    addrs = {n: "127.0.0.1" for n in allocation}
    first = plan.plan_cycle(alloc, opts, FEATURES, train, addrs, 1, "/d/c1")
    before = ranks_of(first, allocation)
    assert before == rank_pin.node_ranks(train)
    lost = data.draw(st.sets(st.sampled_from(train), min_size=1, max_size=len(train)))
    choice = spares.choose({n: ["node down"] for n in lost}, standby,
                           {n: Health(True, "verdict ok") for n in standby})
    nodes = choice.nodes([n for n in train if n not in lost], train)
    after = ranks_of(plan.plan_cycle(alloc, opts, FEATURES, nodes, addrs, 2, "/d/c2"),
                     allocation)
    assert after == rank_pin.node_ranks(nodes)
    if not choice.unswapped:  # the same world: every node rank kept or taken over
        for n in train:
            if n not in lost:
                assert after[n] == before[n], (train, lost, nodes, before, after)
        for s in choice.swaps:
            assert after[s.spare] == before[s.out], (train, lost, nodes, before, after)
    else:  # a smaller world: the survivors keep their order
        kept = [n for n in train if n not in lost]
        assert sorted(kept, key=after.__getitem__) == kept


def test_long_node_lists_keep_their_order_in_the_nodefile(tmp_path) -> None:
    nodes = [f"gpu-{i:05d}" for i in range(3000, 0, -3)]  # not in sorted order
    alloc = plan.Allocation(job_id=9, nodes=tuple(sorted(nodes)))
    cycle = plan.plan_cycle(alloc, plan.LaunchOptions(script="t.py"), FEATURES, nodes,
                            {}, 1, str(tmp_path))
    assert ranks_of(cycle, alloc.nodes) == rank_pin.node_ranks(nodes)


def test_nvrx_041_runs_through_the_pin_and_newer_ones_as_they_are() -> None:
    assert rank_pin.needs_pin("0.4.1") and not rank_pin.needs_pin("0.5.0")
    assert not rank_pin.needs_pin("0.7.0") and not rank_pin.needs_pin("")
    assert rank_pin.program("ft_launcher", "0.4.1")[1:] == [
        "-m", "resilient_slurm.launcher.cycle.rank_pin", "ft_launcher"]
    assert rank_pin.program("ft_launcher", "0.6.0") == ["ft_launcher"]
    assert rank_pin.program("/opt/my_ft", "0.4.1") == ["/opt/my_ft"]  # the user's own
    argv = plan.ft_command(plan.LaunchOptions(script="t.py"), plan.Features(frozenset(), "0.4.1"),
                           2, "h:1", "r")
    assert argv[1:4] == ["-m", "resilient_slurm.launcher.cycle.rank_pin", "ft_launcher"]


@settings(deadline=None)  # the first example imports NVRx (and torch)
@given(st.permutations(range(6)), st.lists(st.integers(1, 99999), min_size=6, max_size=6,
                                            unique=True), st.booleans())
def test_the_installed_nvrx_ranks_nodes_in_slurm_procid_order(procids, pids, same_addr,
                                                              ) -> None:
    """The installed NVRx's own rank assignment, given each node's ``SLURM_PROCID``: 0.4.x's
    (participants sorted by address, then ft_launcher's pid) with the pin applied; 0.5+'s
    infrastructure rank read from ``SLURM_PROCID``."""
    installed = version("nvidia-resiliency-ext")
    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as rdzv

    if not rank_pin.needs_pin(installed):
        from nvidia_resiliency_ext.fault_tolerance import utils  # 0.5+: infrastructure ranks

        kept = os.environ.get("SLURM_PROCID")
        try:
            for p in procids:
                os.environ["SLURM_PROCID"] = str(p)
                assert utils.get_infrastructure_rank() == p
        finally:
            os.environ.pop("SLURM_PROCID", None)
            if kept is not None:
                os.environ["SLURM_PROCID"] = kept
        return
    original = rdzv._NodeDescGenerator.generate
    participants = {}
    try:
        for node, (p, pid) in enumerate(zip(procids, pids, strict=True)):
            rank_pin.pin(rdzv, p)
            addr = "127.0.0.1" if same_addr else f"10.0.{node}.{(7 * node) % 5}"
            desc = rdzv._NodeDescGenerator().generate(addr)
            participants[dataclasses.replace(desc, pid=pid)] = p
            rdzv._NodeDescGenerator.generate = original
    finally:
        rdzv._NodeDescGenerator.generate = original
    ranks = rdzv._DistributedRendezvousOpExecutor._assign_ranks(dict.fromkeys(participants, 0),
                                                                 {})
    assert ranks == participants

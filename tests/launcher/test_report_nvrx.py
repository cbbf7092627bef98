"""The report's fault rows from each NVRx release's real output (tests/launcher/nvrx_output/,
recorded by record.sh: one node, two ranks, rank 1 raises, then rank 0 is SIGKILLed).

NVRx >= 0.6's rank monitor logs no disconnect line carrying the global rank (0.4.1's
``Started periodic restart check``), so a SIGKILL is seen only as ft_launcher's ``failed
(exitcode: -9) local_rank: L``: the report turns (node, local rank) into the global rank from
the node's group rank in its rendezvous join and the cycle's ``--nproc-per-node``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nvrx_output_helpers import VERSIONS, events_of  # type: ignore[import-not-found]

from resilient_slurm.events import EventKind
from resilient_slurm.launcher.report import report
from resilient_slurm.launcher.shim import observe


def _cycle(nproc: str) -> dict[str, object]:
    return {"kind": EventKind.CYCLE_START, "ts": -1.0, "cycle": 1, "nodes": ["node1"],
            "nproc_per_node": nproc}


@pytest.mark.parametrize("version", VERSIONS)
def test_real_output_names_the_raising_and_the_killed_rank(version: str) -> None:
    ev = [_cycle("2"), *events_of(version)]
    rep = report.build(ev)
    assert [(f.what, f.rank, f.handled_by) for f in rep.faults] == [
        ("exception", 1, report.IN_JOB), ("SIGKILL", 0, report.IN_JOB)], report.render(rep, ev)
    assert rep.restarts == 2


@pytest.mark.parametrize("version", VERSIONS)
def test_real_output_without_a_cycle_record(version: str) -> None:
    """Events from before the cycle record carried nproc_per_node: a node of group rank 0
    still names the rank (its ranks start at 0 whatever the count)."""
    assert [(f["type"], f["rank"]) for f in report.observed_faults(events_of(version))] == [
        ("exception", 1), ("SIGKILL", 0)]


@given(nodes=st.integers(1, 16), nproc=st.integers(1, 8), data=st.data())
def test_killed_worker_rank_is_group_rank_times_nproc_plus_local(nodes: int, nproc: int,
                                                                 data: st.DataObject) -> None:
    order = data.draw(st.permutations(range(nodes)))  # node i joins as group rank order[i]
    victim = data.draw(st.integers(0, nodes - 1))
    local = data.draw(st.integers(0, nproc - 1))
    spelled = data.draw(st.sampled_from([str(nproc), "gpu", "auto", None]))
    ev: list[dict[str, object]] = [{**_cycle(str(spelled)), "nproc_per_node": spelled}]
    ev += [{"kind": EventKind.RENDEZVOUS, "ts": float(i), "node": f"n{i}", "round": None,
            "group_rank": g, "world": nodes} for i, g in enumerate(order)]
    ev.append({"kind": EventKind.WORKER_FAILED, "ts": 100.0, "node": f"n{victim}",
               "local_rank": local, "exitcode": -9, "signal": "SIGKILL", "pid": 7})
    (fault,) = report.observed_faults(ev)
    g = order[victim]
    if g == 0:
        want: object = local
    elif spelled == str(nproc):
        want = g * nproc + local
    else:  # not a number: the rank cannot be told, said as node:local rank
        want = f"n{victim}:{local}"
    assert (fault["type"], fault["rank"], fault["node"]) == ("SIGKILL", want, f"n{victim}")


def test_group_ranks_of_the_round_the_fault_happened_in() -> None:
    """A later round's join (the restart) does not rename the fault before it; a new cycle
    forgets the old cycle's group ranks."""
    def join(ts: float, node: str, g: int) -> dict[str, object]:
        return {"kind": EventKind.RENDEZVOUS, "ts": ts, "node": node, "round": None,
                "group_rank": g, "world": 2}

    def kill(ts: float) -> dict[str, object]:
        return {"kind": EventKind.WORKER_FAILED, "ts": ts, "node": "b", "local_rank": 1,
                "exitcode": -9, "signal": "SIGKILL", "pid": 7}

    ev = [_cycle("4"), join(0, "a", 0), join(1, "b", 1), kill(2), join(3, "b", 0),
          join(4, "a", 1), kill(5), {**_cycle("4"), "ts": 6.0, "cycle": 2}, kill(7)]
    assert [f["rank"] for f in report.observed_faults(ev)] == [5, 1, "b:1"]


# Verbatim from an NVRx 0.6.0 rank monitor on the Slurm 24.11 sandbox (as in test_node_shim.py):
# the monitor's global rank is "?", its local rank is in parentheses.
HANG_06 = ("2026-12-01 01:51:02,705 [WARNING] [vm] [workload:?(0) infra:0(0)] "
           "rank_monitor_server.py:497 [Cycle 1] Did not get subsequent heartbeat. "
           "Waited 8.00 seconds.")


@pytest.mark.parametrize(("grank", "nproc", "local", "want"),
                         [(1, "1", 0, 1), (0, "4", 3, 3), (2, "4", 1, 9), (1, "gpu", 0, "a:0")])
def test_hang_on_06_is_named_by_its_global_rank(grank, nproc, local, want) -> None:
    seen = observe.parse_line(HANG_06.replace("workload:?(0)", f"workload:?({local})"))
    assert seen is not None and seen[0] == EventKind.HANG_DETECTED
    join = next(e for e in events_of("0.6.0") if e["kind"] == EventKind.RENDEZVOUS)
    # its last heartbeat (20 - 8) older than the other report's (20.5 - 2) by more than the
    # window: the evidence that names it (one report alone names nobody)
    other = {"kind": seen[0], "ts": 20.5, "node": "b", "local_rank": 0, "waited_s": 2.0}
    ev = [_cycle(nproc), {**join, "node": "a", "group_rank": grank, "ts": 0.0},
          {"kind": seen[0], "ts": 20.0, "node": "a", **seen[1]}, other]
    (fault,) = report.observed_faults(ev)
    assert (fault["type"], fault["rank"], fault["ts"]) == ("hang", want, 12.0)


def test_hang_with_the_global_rank_keeps_it() -> None:
    seen = observe.parse_line(HANG_06.replace("workload:?(0)", "workload:5(1)"))
    assert seen is not None and seen[1] == {"rank": 5, "heartbeat": "subsequent",
                                            "waited_s": 8.0}


@given(rank=st.one_of(st.none(), st.integers(0, 10**6)), local=st.one_of(
    st.none(), st.integers(0, 10**4)), waited=st.floats(0, 1e5, allow_nan=False))
def test_06_hang_line_property(rank, local, waited) -> None:
    """Any workload rank / local rank spelling (``?`` when unknown): the global rank when
    given, else the local rank when given, never a crash or a wrong key."""
    line = HANG_06.replace("workload:?(0)", f"workload:{'?' if rank is None else rank}("
                           f"{'?' if local is None else local})")
    line = line.replace("Waited 8.00", f"Waited {waited:.2f}")
    seen = observe.parse_line(line)
    assert seen is not None and seen[0] == EventKind.HANG_DETECTED
    want = {"rank": rank, "heartbeat": "subsequent", "waited_s": float(f"{waited:.2f}")}
    if rank is None and local is not None:
        want["local_rank"] = local
    assert seen[1] == want


def test_workers_stopped_after_a_step_signal_are_no_fault() -> None:
    """``scancel -s USR1 JOB``: each node's shim records the signal, then stops its
    ft_launcher; the workers' exit 143 may reach the events before the launcher's own
    stop_cycle. It is the signal's consequence, never an observed fault."""
    def dead(ts: float, node: str) -> dict[str, object]:
        return {"kind": EventKind.WORKER_FAILED, "ts": ts, "node": node, "local_rank": 0,
                "exitcode": 143, "signal": None, "pid": 7}

    signalled = {"kind": EventKind.STEP_SIGNAL, "ts": 1.0, "node": "a", "signal": "SIGUSR1"}
    stop = {"kind": EventKind.STOP_CYCLE, "ts": 4.0, "reason": "SIGUSR1 received"}
    assert report.observed_faults([_cycle("2"), signalled, dead(2, "a"), dead(3, "b"),
                                   stop]) == []
    # without the signal the same deaths are a fault
    assert [f["type"] for f in report.observed_faults([_cycle("2"), dead(2, "a"), stop])] \
        == ["exit 143"]

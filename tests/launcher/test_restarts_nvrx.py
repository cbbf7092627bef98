"""Restart counting on every NVRx release (launcher/shim/restarts.py, observe.py's rendezvous line),
against each release's real output recorded by tests/launcher/nvrx_output/record.sh: one node,
two ranks, an exception then a SIGKILL, so two in-job restarts (0.4.1 recorded on Debian 12,
0.6.0 in the Debian 13 root of scripts/slurm24, 0.7.0 in the sid root of scripts/slurm26)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nvrx_output_helpers import DATA, VERSIONS, events_of  # type: ignore[import-not-found]

from resilient_slurm.events import EventKind
from resilient_slurm.launcher.recovery import level0
from resilient_slurm.launcher.shim import observe, restarts


def test_both_releases_recorded() -> None:
    assert {"0.4.1", "0.6.0", "0.7.0"} <= set(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_real_output_counts_two_restarts(version: str) -> None:
    assert (DATA / version / "rc").read_text().strip() == "0"  # the run completed
    ev = events_of(version)
    joins = [e for e in ev if e["kind"] == EventKind.RENDEZVOUS]
    assert len(joins) == 3 and all(e["world"] == 1 and e["group_rank"] == 0 for e in joins)
    assert restarts.from_events(ev) == 2
    assert observe.restarts_in_cycle(ev, 0) == 2
    failed = [e for e in ev if e["kind"] == EventKind.WORKER_FAILED]
    assert [e["signal"] for e in failed] == [None, "SIGKILL"]
    assert [e["attempts_left"] for e in ev if e["kind"] == EventKind.WORKER_RESTART] == [3, 2]


def test_barrier_rendezvous_has_no_round() -> None:
    ev = events_of("0.6.0")
    assert all(e["round"] is None for e in ev if e["kind"] == EventKind.RENDEZVOUS)
    assert [e["round"] for e in events_of("0.4.1") if e["kind"] == EventKind.RENDEZVOUS] \
        == [0, 1, 2]


def test_cycle_info_records_06() -> None:
    d = DATA / "0.6.0" / "cycle_info"
    assert restarts.cycle_info_rounds(str(d)) == 3
    assert restarts.in_cycle([], 0.0, str(d)) == 2  # from the records alone, no log line
    assert restarts.cycle_info_rounds(str(d), since=4e9) == 0  # older than the cycle
    assert restarts.cycle_info_rounds(str(DATA / "missing")) == 0


def test_level0_record_restarts_on_06_rendezvous() -> None:
    """A level 1 restart (a new barrier rendezvous) starts level 0's record over on 0.6."""
    join = next(e for e in events_of("0.6.0") if e["kind"] == EventKind.RENDEZVOUS)
    resume = {"kind": EventKind.RESUME, "source": "training", "level": "inprocess",
              "lost_nodes": ["node2"], "ts": 1.0}
    assert level0.left_out_nodes([resume], 0) == {"node2"}
    assert level0.left_out_nodes([resume, {**join, "ts": 2.0}], 0) == set()


# NVRx 0.7.0's barrier message, from its source (ft_rendezvous_barrier.py, same f-string as
# 0.6.0's): 0.7 needs Python >= 3.12, so no run of it is recorded on these machines.
LINE_07 = ("2026-12-01 10:00:00,000 [INFO] [vm] [workload:?(?) infra:0(0)] "
           "ft_rendezvous_barrier.py:2522 The node 'nodeA_77_0' has joined the rendezvous "
           "'rs-77-r0-c1' as rank 3 in a world of size 4.")


def test_07_message_from_source() -> None:
    assert observe.parse_line(LINE_07) == (EventKind.RENDEZVOUS,
                                           {"round": None, "group_rank": 3, "world": 4})


NAME = st.text(st.characters(codec="ascii", categories=("L", "N"), include_characters="_-."),
               min_size=1, max_size=12)


@given(prefix=st.text(st.characters(codec="ascii", exclude_characters="\n'"), max_size=40),
       node=NAME, rid=NAME, rank=st.integers(0, 4095), world=st.integers(1, 4096),
       rnd=st.one_of(st.none(), st.integers(0, 10**6)))
@settings(max_examples=200, deadline=None)
def test_rendezvous_line_property(prefix: str, node: str, rid: str, rank: int, world: int,
                                  rnd: int | None) -> None:
    joined = "has joined the rendezvous" if rnd is None else \
        f"has joined round {rnd} of the rendezvous"
    line = f"{prefix}The node '{node}' {joined} '{rid}' as rank {rank} in a world of size {world}."
    assert observe.parse_line(line) == (EventKind.RENDEZVOUS,
                                        {"round": rnd, "group_rank": rank, "world": world})


@given(nodes=st.integers(1, 6), faults=st.integers(0, 8), data=st.data())
@settings(max_examples=200, deadline=None)
def test_barrier_joins_count_faults_not_nodes(nodes: int, faults: int, data: st.DataObject) -> None:
    """Every node joins each round once: the count is the faults, whatever the interleaving
    (and a node whose line was lost still leaves the others' count)."""
    joins = [f"node{n}" for n in range(nodes) for _ in range(faults + 1)]
    order = data.draw(st.permutations(joins))
    ev = [{"kind": "rendezvous", "ts": float(i), "node": n, "round": None}
          for i, n in enumerate(order)]
    assert restarts.from_events(ev) == faults
    assert restarts.from_events(ev, since=len(ev) + 1.0) == 0


def test_cycle_info_names(tmp_path: Path) -> None:
    for name in ("cycle_info.77.0.0", "cycle_info.77.0.1", "cycle_info.77.current",
                 "cycle_info.77.0.1.tmp", "other"):
        (tmp_path / name).write_text("{}")
    os.utime(tmp_path / "cycle_info.77.0.0", (1, 1))
    assert restarts.cycle_info_rounds(str(tmp_path)) == 2
    assert restarts.cycle_info_rounds(str(tmp_path), since=1000.0) == 1

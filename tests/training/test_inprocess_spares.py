"""Hot spares in level 0 (``resilient-launch --inprocess --spares K``): the spares' ranks
stand by inside NVRx's Wrapper and one takes a lost rank's place in the live processes.

Two layers: the rank assignment ``InprocessSettings(active_world=N)`` hands NVRx (its own
``MaxActiveWorldSize`` over ``FillGaps``, driven here as the Wrapper drives it), and a run of
``train_fsdp.py --inprocess`` on 4 local ranks with 3 training: a SIGKILL of a training rank
is taken by the standby with the world still 3, from the peer node's copy, 0 steps lost, and
the digest of a fault-free 3-rank run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.train

pytest.importorskip("torch")
nvrx = pytest.importorskip("nvidia_resiliency_ext.inprocess")

from resilient_slurm.training.inprocess import ACTIVE_WORLD_ENV, InprocessSettings  # noqa: E402
from tests.training.inprocess_harness import run_job  # noqa: E402

STEPS = 16
FAULT_STEP = 7


def _assign(settings: InprocessSettings, world: int, terminated_rounds: list[set[int]]
            ) -> dict[int, tuple[str, int | None, int | None]]:
    """initial rank -> (mode, active rank, active world) after each round of terminations,
    every surviving rank running the assignment on its own state (as in the Wrapper)."""
    ra = settings.rank_assignment()
    states = {}
    for r in range(world):
        ctx = nvrx.rank_assignment.RankAssignmentCtx(nvrx.state.State(rank=r, world_size=world),
                                                     None, set())
        states[r] = ra(ctx).state
    for terminated in terminated_rounds:
        nxt = {}
        for init, st in states.items():
            if st.rank in terminated:
                continue
            ctx = nvrx.rank_assignment.RankAssignmentCtx(st, None, set(terminated))
            nxt[init] = ra(ctx).state
        states = nxt
    return {i: (st.mode.name, st.active_rank, st.active_world_size) for i, st in states.items()}


def test_standby_fills_the_lost_ranks_place_then_the_world_shrinks() -> None:
    s = InprocessSettings(store="h:1", active_world=3)
    assert _assign(s, 4, []) == {0: ("ACTIVE", 0, 3), 1: ("ACTIVE", 1, 3),
                                 2: ("ACTIVE", 2, 3), 3: ("INACTIVE", None, 3)}
    # rank 1 lost: the standby (initial 3) becomes rank 1, the survivors keep theirs
    assert _assign(s, 4, [{1}]) == {0: ("ACTIVE", 0, 3), 2: ("ACTIVE", 2, 3),
                                    3: ("ACTIVE", 1, 3)}
    # no standby left: the next loss shrinks the world (the last rank fills the gap)
    assert _assign(s, 4, [{1}, {0}]) == {2: ("ACTIVE", 0, 2), 3: ("ACTIVE", 1, 2)}


def test_a_node_of_ranks_is_replaced_rank_for_rank() -> None:
    # 2 ranks per node, 2 training nodes + 1 spare node: the spare node's local ranks take
    # the lost node's ranks in order
    s = InprocessSettings(store="h:1", active_world=4)
    got = _assign(s, 6, [{0, 1}])
    assert {i: a for i, (m, a, w) in got.items()} == {2: 2, 3: 3, 4: 0, 5: 1}
    assert {w for _, _, w in got.values()} == {4}


def test_without_spares_the_survivors_shift_down() -> None:
    s = InprocessSettings(store="h:1")
    assert _assign(s, 3, [{0}]) == {1: ("ACTIVE", 0, 2), 2: ("ACTIVE", 1, 2)}


@pytest.mark.parametrize("active, min_world", [(-1, 1), (2, 3)])
def test_active_world_below_the_minimum_is_refused(active: int, min_world: int) -> None:
    with pytest.raises(ValueError, match="active_world"):
        InprocessSettings(store="h:1", active_world=active, min_world=min_world).check()


def test_active_world_from_the_environment() -> None:
    assert InprocessSettings.from_env({"RESILIENT_INPROCESS_STORE": "h:1", ACTIVE_WORLD_ENV: "3"}
                             ).active_world == 3
    assert InprocessSettings.from_env({"RESILIENT_INPROCESS_STORE": "h:1"}).active_world == 0


def test_sigkill_taken_by_the_standby_with_the_world_unchanged(tmp_path: Path) -> None:
    free = run_job(tmp_path / "free", STEPS)
    assert free.rcs == [0, 0, 0]
    (digest,) = free.digests()
    res = run_job(tmp_path / "spare", STEPS, (f"sigkill@{FAULT_STEP}@rank1",), world=4,
                  env_extra={ACTIVE_WORLD_ENV: "3"})
    out = "\n".join(f"--- rank{i}\n{o[-2500:]}" for i, o in enumerate(res.outputs))
    assert res.rcs[1] == -9 and [res.rcs[i] for i in (0, 2, 3)] == [0, 0, 0], out
    first = [e for e in res.kind("resume") if not e.get("iteration")]
    assert first and first[0]["world_size"] == 3 and first[0]["standby_nodes"] == ["n3"], first
    (after,) = [e for e in res.kind("resume") if (e.get("iteration") or 0) > 0]
    assert after["level"] == "inprocess" and after["source_state"] == "memory", after
    assert after["world_size"] == 3, "the standby kept the world size"
    assert after["step"] == FAULT_STEP - 1, "steps were lost"
    assert after["lost_ranks"] == [1] and after["lost_nodes"] == ["n1"], after
    assert not after.get("standby_nodes"), "the only standby is training now"
    # the standby (n3, now rank 1) took rank 1's snapshot from the peer node's copy
    assert "memory tiers: step 6 from own memory" in res.outputs[0], res.outputs[0][-2000:]
    assert res.digests() == {digest}, out

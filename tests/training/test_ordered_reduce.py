"""Virtual data-parallel shards: every shard is computed once per step, by one rank."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("torch")

from resilient_slurm.training.ordered_reduce import VirtualShards  # noqa: E402


@given(vdp=st.integers(1, 40), world=st.integers(1, 40))
def test_each_shard_is_computed_exactly_once(vdp: int, world: int) -> None:
    views = [VirtualShards(vdp, world, r) for r in range(world)]
    done = [v.shard(k) for v in views for k in range(v.rounds)]
    assert sorted(s for s in done if s is not None) == list(range(vdp))
    assert views[0].rounds == -(-vdp // world)
    assert views[0].loss_scale == 1.0 / vdp
    for v in views:  # a rank's view of a peer agrees with the peer's own view
        assert [v.shard(k, rank=world - 1) for k in range(v.rounds)] == \
            [views[-1].shard(k) for k in range(v.rounds)]


def test_last_round_and_bad_degree() -> None:
    v = VirtualShards(3, 2, 1)
    assert (v.rounds, v.shard(0), v.shard(1)) == (2, 1, None)
    assert not v.last()
    v.round = 1
    assert v.last()
    with pytest.raises(ValueError, match=">= 1"):
        VirtualShards(0, 2, 0)

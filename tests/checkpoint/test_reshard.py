"""Reshard by overlap (checkpoint/reshard.py), over layouts and world sizes: FSDP2 ``Shard(0)``
and HSDP (replicas x shards) on the old and the new world, uneven and empty shards, replicas
held on several nodes. Every row of every new shard comes from exactly one old shard that holds
it, the bytes a rank fetches are exactly its new shard (never the model), each old snapshot is
read by one rank, and a layout it cannot reshard is refused with the reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from resilient_slurm.checkpoint import reshard  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}


def chunk(n: int, shards: int, s: int) -> tuple[int, int]:
    """FSDP2's rows of shard ``s`` (torch.chunk: ceil-sized chunks, the last ones short or
    empty)."""
    size = -(-n // shards) if n else 0
    return min(s * size, n), min((s + 1) * size, n)


def _bytes(t: Any) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


@st.composite
def worlds(draw: st.DrawFn) -> tuple[int, int]:
    """(replicas, shards): FSDP2 when replicas == 1, else HSDP."""
    return draw(st.integers(1, 3)), draw(st.integers(1, 8))


@st.composite
def cases(draw: st.DrawFn) -> dict:
    tensors = draw(st.lists(st.tuples(st.integers(0, 23), st.integers(1, 3),
                                      st.sampled_from(sorted(DTYPES))), min_size=1, max_size=5))
    return {"tensors": tensors, "old": draw(worlds()), "new": draw(worlds()),
            "seed": draw(st.integers(0, 2**16)), "extra_holders": draw(st.integers(0, 3))}


def _old_world(case: dict) -> tuple[dict, dict, dict, int]:
    """Old snapshots as bytes and tables (as the packed format lays them out), the global
    tensors, and the old world size."""
    g = torch.Generator().manual_seed(case["seed"])
    full = {f"/t{i}": (torch.rand(rows, cols, generator=g) * 1000).to(DTYPES[dt])
            for i, (rows, cols, dt) in enumerate(case["tensors"])}
    reps, shards = case["old"]
    world = reps * shards
    data, tables = {}, {}
    for owner in range(world):
        blob, tab, at = bytearray(64), {}, 64  # 64 bytes standing in for the skeleton
        for name, t in full.items():
            a, b = chunk(t.shape[0], shards, owner % shards)
            raw = _bytes(t[a:b])
            tab[name] = reshard.Entry("rows" if shards > 1 or reps > 1 else "whole", a, b,
                                      tuple(t.shape), str(t.dtype)[6:], at, len(raw))
            blob += raw + bytes(-len(raw) % 64)
            at = len(blob)
        data[owner], tables[owner] = bytes(blob), tab
    return data, tables, full, world


@settings(max_examples=50, deadline=None)
@given(cases())
def test_every_new_shard_is_assembled_from_overlapping_rows_only(case) -> None:
    data, tables, full, old_world = _old_world(case)
    reps, shards = case["new"]
    new_world = reps * shards
    g = torch.Generator().manual_seed(case["seed"] + 1)
    # holdings: each old owner's snapshot on its own rank's node (when that rank still exists)
    # and on a few other ranks (peer copies)
    holdings: list[set] = [set() for _ in range(new_world)]
    for owner in range(old_world):
        holders = {owner % new_world}
        for _ in range(case["extra_holders"]):
            holders.add(int(torch.randint(new_world, (1,), generator=g)))
        for r in holders:
            holdings[r].add((owner, 9, old_world))
    reader = reshard.readers(holdings, 9, old_world, new_world)
    assert sorted(reader) == list(range(old_world))  # each old snapshot read once
    assert all((o, 9, old_world) in holdings[r] for o, r in reader.items())
    for me in range(new_world):
        s = me % shards
        wanted = []
        for name, t in full.items():
            a, b = chunk(t.shape[0], shards, s)
            wanted.append((name, "rows", a, b, list(t.shape)))
        own = me if me < old_world else 0
        pieces, why = reshard.plan(wanted, tables, reader, me, own, (0, 64))
        assert why == ""
        assert pieces[0].row == -1 and pieces[0].owner == own  # the skeleton, once
        moved = 0
        for name, _kind, a, b, _shape in wanted:
            t = full[name]
            got = torch.empty_like(t[a:b])
            covered = torch.zeros(b - a, dtype=torch.int64)
            for p in (p for p in pieces if p.name == name):
                e = tables[p.owner][name]
                rows = p.nbytes // e.row_bytes if e.row_bytes else 0
                # the piece lies inside the old shard it is read from
                assert e.offset <= p.offset and p.offset + p.nbytes <= e.offset + e.nbytes
                raw = torch.frombuffer(bytearray(data[p.owner][p.offset:p.offset + p.nbytes]),
                                       dtype=torch.uint8) if p.nbytes else torch.empty(0)
                if rows:
                    got[p.row:p.row + rows] = raw.view(t.dtype).view(rows, *t.shape[1:])
                    covered[p.row:p.row + rows] += 1
                moved += p.nbytes
            assert bool((covered == 1).all())  # every row exactly once
            assert _bytes(got) == _bytes(t[a:b])
        shard_bytes = sum(t[slice(*chunk(t.shape[0], shards, s))].numel() * t.element_size()
                          for t in full.values())
        assert moved == shard_bytes  # bytes fetched: exactly the new shard, not the model


@settings(max_examples=20, deadline=None)
@given(cases(), st.sampled_from(["other", "shape", "missing"]))
def test_a_layout_it_cannot_reshard_is_refused_with_the_reason(case, what) -> None:
    _, tables, full, old_world = _old_world(case)
    name = next(iter(full))
    t = full[name]
    if what == "other":  # tensor parallel (Shard(1)) on the new world
        wanted = [(name, "other", -1, -1, list(t.shape))]
    elif what == "shape":
        wanted = [(name, "rows", 0, 1, [t.shape[0] + 1, *t.shape[1:]])]
    else:
        wanted = [("/not-saved", "rows", 0, 1, [1])]
    reader = {o: 0 for o in range(old_world)}
    pieces, why = reshard.plan(wanted, tables, reader, 0, 0, (0, 64))
    assert pieces == [] and why.startswith(name if what != "missing" else "/not-saved")

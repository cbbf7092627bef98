"""Tier-1/2 files: any mix of torn, missing or damaged files never yields a wrong load."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from resilient_slurm.checkpoint import peers, restore, store  # noqa: E402

WORLD, STEPS, NODES = 3, 4, 2
DAMAGE = ["intact", "no_data", "no_marker", "truncate", "flip", "bad_json", "wrong_step",
          "wrong_owner", "no_dir", "marker_only_tmp"]


def _blob(owner: int, step: int) -> bytes:
    return bytes(f"owner {owner} step {step} ", "ascii") * (7 + owner + step)


def _damage(path: str, kind: str, owner: int, step: int) -> None:
    data, marker = os.path.join(path, store.DATA), os.path.join(path, store.MARKER)
    if kind == "no_data":
        os.unlink(data)
    elif kind == "no_marker":
        os.unlink(marker)
    elif kind == "truncate":
        with open(data, "r+b") as fh:
            fh.truncate(os.path.getsize(data) // 2)
    elif kind == "flip":
        raw = bytearray(open(data, "rb").read())
        raw[len(raw) // 3] ^= 0x5A
        open(data, "wb").write(bytes(raw))
    elif kind == "bad_json":
        with open(marker, "r+b") as fh:
            fh.truncate(os.path.getsize(marker) // 2)
    elif kind == "wrong_step":
        os.replace(path, store.step_path(os.path.dirname(os.path.dirname(path)), owner,
                                         step + 100))
    elif kind == "wrong_owner":
        other = store.step_path(os.path.dirname(os.path.dirname(path)), (owner + 1) % WORLD + 5,
                                step)
        os.makedirs(os.path.dirname(other), exist_ok=True)
        os.replace(path, other)
    elif kind == "no_dir":
        store.remove(path)
    elif kind == "marker_only_tmp":  # killed between the data's temp file and its rename
        os.replace(data, data + ".tmp123")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(DAMAGE), min_size=WORLD * STEPS * NODES,
                max_size=WORLD * STEPS * NODES))
def test_torn_or_missing_snapshots_never_load_wrong(tmp_path_factory, damage) -> None:
    root = tmp_path_factory.mktemp("tiers")
    nodes = [str(root / f"node{n}") for n in range(NODES)]
    intact: dict[tuple[int, int], int] = {}
    i = 0
    for job_dir in nodes:
        for owner in range(WORLD):
            for step in range(1, STEPS + 1):
                snap = store.write(job_dir, owner, step, WORLD, _blob(owner, step))
                _damage(snap.path, damage[i], owner, step)
                if damage[i] == "intact":
                    intact[(owner, step)] = intact.get((owner, step), 0) + 1
                i += 1
    scans = [{(s.owner, s.step, s.world): s for s in store.scan(d)} for d in nodes]
    # what a load does (checkpoint/restore.py): choose over the markers, read and verify only
    # the chosen step, each owner once; a copy that fails its digest is dropped and the
    # choice made again, until a step verifies or none is left
    holdings = [set(s) for s in scans]
    reads: list[tuple[int, int]] = []
    chosen = None
    for _ in range(WORLD * STEPS * NODES + 1):
        chosen = peers.choose([sorted(h) for h in holdings], WORLD)
        if chosen is None:
            break
        who = restore.readers(holdings, chosen, WORLD)
        assert sorted(who) == list(range(WORLD))  # every owner read once, by one holder
        bad = []
        for owner, node in who.items():
            snap = scans[node][(owner, chosen, WORLD)]
            buf = bytearray(snap.nbytes)
            reads.append((owner, chosen))
            if not store.read_into(snap, memoryview(buf)):
                bad.append((node, (owner, chosen, WORLD)))
            else:
                assert bytes(buf) == _blob(owner, chosen)  # every byte read is what was written
        if not bad:
            break
        for node, key in bad:
            holdings[node].discard(key)
    complete = [s for s in range(1, STEPS + 1) if all((o, s) in intact for o in range(WORLD))]
    assert chosen == max(complete, default=None)  # the newest intact step, never a torn one
    # only chosen steps were read: never a step older than the one loaded
    assert all(step >= (chosen or 0) for _, step in reads)


def test_prune_keeps_the_newest_k_and_deletes_the_marker_first(tmp_path) -> None:
    job = str(tmp_path)
    for step in range(1, 6):
        store.write(job, 0, step, 1, b"x" * step)
    assert store.prune(job, 0, keep=2) == [1, 2, 3]
    assert [s.step for s in store.scan(job)] == [4, 5]
    assert store.bytes_used(job) == 9


def test_topology_puts_the_copy_on_the_next_node() -> None:
    topo = peers.topology(["a", "a", "b", "b", "c", "c"])
    assert topo.peer == (2, 3, 4, 5, 0, 1)
    assert topo.source(0) == 4 and topo.source(3) == 1
    assert peers.topology(["a", "a"]).peer == (None, None)
    assert "one node" in peers.topology(["a", "a"]).why
    assert peers.topology(["a", "b", "b"]).peer == (None, None, None)


def test_plan_sends_each_missing_snapshot_from_the_lowest_holder() -> None:
    held = [[(0, 5, 3), (1, 5, 3), (2, 5, 3)], [(1, 5, 3)], []]
    assert peers.choose(held, 3) == 5
    assert peers.plan(held, 5, 3) == [(0, 2)]
    assert peers.choose(held, 2) is None
    assert peers.choose([[(0, 5, 2)], [(0, 6, 2)]], 2) is None


def test_drop_after_deletes_only_newer_steps(tmp_path) -> None:
    job = str(tmp_path)
    for owner in (0, 1):
        for step in (4, 5, 6):
            store.write(job, owner, step, 2, b"x")
    assert sorted(store.drop_after(job, 5)) == [(0, 6), (1, 6)]
    assert {(s.owner, s.step) for s in store.scan(job)} == {(0, 4), (0, 5), (1, 4), (1, 5)}


def test_a_save_overwrites_the_oldest_kept_file_in_place(tmp_path) -> None:
    """With ``recycle_keep`` a save reuses the oldest kept snapshot's file (same inode: tmpfs
    pages reused, not allocated and freed per save), unpublished before it is changed; the
    newest ``keep`` stay listed and each reads back exactly."""
    job = str(tmp_path / "job")
    blobs = {s: _blob(0, s) * (1 + s % 2) for s in range(1, 6)}  # sizes differ: truncated
    inodes = {}
    for step, blob in blobs.items():
        snap = store.write(job, 0, step, 1, blob, recycle_keep=2)
        store.prune(job, 0, 2)
        inodes[step] = os.stat(snap.data).st_ino
        assert [s.step for s in store.scan(job)] == sorted(blobs)[max(0, step - 2):step]
    assert inodes[3] == inodes[1] and inodes[4] == inodes[2] and inodes[5] == inodes[3]
    for snap in store.scan(job):
        assert store.read(snap) == blobs[snap.step]
    # while a recycled file is being rewritten it is not listed: the marker goes first
    old = store.recyclable(job, 0, 6, 2)
    assert old is not None and old.endswith("step-4")
    os.unlink(os.path.join(old, store.MARKER))
    assert [s.step for s in store.scan(job)] == [5]
    # keep=1 never recycles its only snapshot
    assert store.recyclable(job, 0, 6, 1) is None


def test_a_copy_carries_its_owners_crc_and_a_bad_one_is_never_loaded(tmp_path) -> None:
    job = str(tmp_path / "job")
    blob = _blob(1, 3)
    good = store.write(job, 1, 3, 2, blob, crc=store.crc32(blob))
    assert [s.step for s in store.scan(job)] == [3] and good.crc32 == store.crc32(blob)
    store.write(job, 1, 4, 2, blob, crc=store.crc32(blob) ^ 1)  # damaged in transit
    assert [s.step for s in store.scan(job, verify=True)] == [3]
    listed = store.scan(job)[-1]  # listed by its marker, refused when read
    assert listed.step == 4 and not store.read_into(listed, memoryview(bytearray(len(blob))))


def test_without_a_checksum_a_torn_file_is_still_never_listed(tmp_path) -> None:
    job = str(tmp_path / "job")
    blob = _blob(0, 1)
    snap = store.write(job, 0, 1, 1, blob, checksum=False)
    assert snap.crc32 == store.NO_CRC and store.read(store.scan(job)[0]) == blob
    _damage(snap.path, "flip", 0, 1)  # the documented trade: a flipped byte goes unseen
    assert [s.step for s in store.scan(job, verify=True)] == [1]
    _damage(snap.path, "truncate", 0, 1)
    assert store.scan(job) == []
    store.write(job, 0, 2, 1, blob, crc=store.NO_CRC)  # a peer copy of an unchecksummed one
    assert [s.step for s in store.scan(job)] == [2]


holding = st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(1, 4))


@given(st.lists(st.lists(holding, max_size=12), min_size=1, max_size=4), st.integers(1, 4))
@settings(max_examples=300, deadline=None)
def test_choose_other_is_the_newest_complete_set_of_another_world(held, world) -> None:
    """What a shrunk (or grown) world reshards from: the newest (step, world size) != ``world``
    whose every owner 0..W-1 some rank holds; never a set with an owner missing."""
    got = peers.choose_other(held, world)
    owners: dict[tuple[int, int], set[int]] = {}
    for h in held:
        for owner, step, w in h:
            owners.setdefault((step, w), set()).add(owner)
    complete = [k for k, o in owners.items() if k[1] != world and set(range(k[1])) <= o]
    assert got == (max(complete) if complete else None)
    if got is not None:
        step, w = got
        for owner in range(w):
            src = peers.holder(held, (owner, step, w))
            assert (owner, step, w) in held[src]
            assert all((owner, step, w) not in held[r] for r in range(src))

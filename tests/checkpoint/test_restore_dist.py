"""What a restore reads, moves and falls back to, in real multi-process torch.distributed jobs
(gloo, CPU, one rank per simulated node): only the chosen snapshot is read, once, into the
live tensors; a snapshot that fails its digest, or a restored state whose loss is not finite,
falls back to the next source with an event and never loops; HSDP reshards by overlap."""

from __future__ import annotations

import json
import os
import shutil

import pytest

pytest.importorskip("torch")

from resilient_slurm.checkpoint import store  # noqa: E402

from .tier_helpers import WORKER, on_nodes, worker_lines  # noqa: E402


def run(root: str, nodes: list[str], args: list[str], **kw) -> str:
    return on_nodes(root, nodes, args, script=WORKER, **kw)


def _digest(out: str) -> str:
    found = [x.split("=")[1] for x in out.split() if x.startswith("digest=")]
    assert len(found) == 1, out[-3000:]
    return found[0]


@pytest.mark.train
def test_a_restore_reads_only_its_own_snapshot_into_the_live_tensors(tmp_path) -> None:
    """Each node holds 2 steps of its rank's snapshot and 2 of its peer's (4 files); the
    restore reads the chosen one of its own rank, once (by bytes counted and by the bytes
    the process read), and fills the tensors the model trains with (no clone)."""
    root = str(tmp_path)
    run(root, ["a", "b"], ["--width", "256", "--exit-after", "4"])
    out = run(root, ["a", "b"], ["--width", "256"])
    lines = worker_lines(out)
    for rank in (0, 1):
        x = lines[rank]
        assert (x["step"], x["tier"], x["live"]) == (4, "own memory", True), x
        assert x["read_bytes"] == x["snapshot_bytes"] and x["recv_bytes"] == 0, x
        assert x["rchar"] < 1.5 * x["snapshot_bytes"], x  # not the node's other 3 files


@pytest.mark.train
def test_a_corrupt_snapshot_falls_back_to_the_peer_copy_with_an_event(tmp_path) -> None:
    """Rank 1's own step 4 has a flipped byte (its marker intact): the restore reads it, the
    digest fails, and the copy on node a is sent instead; the event says why."""
    root = str(tmp_path)
    ref = _digest(run(str(tmp_path / "ref"), ["a", "b"], []))
    run(root, ["a", "b"], ["--exit-after", "4"])
    data = os.path.join(store.step_path(os.path.join(root, "b", "job"), 1, 4), store.DATA)
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0x40
    open(data, "wb").write(bytes(raw))
    events = str(tmp_path / "events.jsonl")
    out = run(root, ["a", "b"], [], extra_env={"RESILIENT_EVENTS_FILE": events})
    lines = worker_lines(out)
    assert (lines[0]["step"], lines[0]["tier"]) == (4, "own memory")
    assert (lines[1]["step"], lines[1]["tier"]) == (4, "peer copy")
    assert lines[1]["recv_bytes"] == lines[1]["snapshot_bytes"]
    assert _digest(out) == ref
    evs = [json.loads(x) for x in open(events)]
    fb = [e for e in evs if e["kind"] == "tier_fallback"]
    assert len(fb) == 1 and "failed its digest" in fb[0]["reason"], evs


@pytest.mark.train
def test_a_restore_whose_loss_is_nan_falls_back_to_the_durable_tier_once(tmp_path) -> None:
    """The weights saved at step 5 are NaN (the digest is fine: it is what was written); the
    restore's check (a probe batch's loss) rejects them on every rank, node memory is dropped
    and the durable save of step 3 is loaded; the run ends with the fault-free weights, and a
    second restart never tries the NaN snapshot again."""
    root = str(tmp_path / "run")
    durable = ["--durable-dir", str(tmp_path / "ckpt"), "--durable-every", "3", "--check"]
    ref = _digest(run(str(tmp_path / "ref"), ["a", "b"], [
        "--durable-dir", str(tmp_path / "ref-ckpt"), "--durable-every", "3", "--check"]))
    run(root, ["a", "b"], [*durable, "--poison-at", "5", "--exit-after", "5"])
    events = str(tmp_path / "events.jsonl")
    out = run(root, ["a", "b"], [*durable, "--exit-after", "4"],
              extra_env={"RESILIENT_EVENTS_FILE": events})
    lines = worker_lines(out)
    assert [(x["step"], x["tier"]) for x in lines.values()] == [(3, "durable")] * 2, out[-2000:]
    fb = [json.loads(x) for x in open(events)]
    assert [e["tier"] for e in fb if e["kind"] == "tier_fallback"] == ["own memory"], fb
    out = run(root, ["a", "b"], durable, extra_env={"RESILIENT_EVENTS_FILE": events})
    assert [x["step"] for x in worker_lines(out).values()] == [4, 4]
    assert _digest(out) == ref


@pytest.mark.train
def test_hsdp_reshards_by_overlap_onto_a_smaller_world(tmp_path) -> None:
    """HSDP on 4 ranks (2 replicas x 2 shards) stops after step 4; node d is gone (its rank's
    copy is on node a) and the job goes on as FSDP2 on 3 ranks: each rank fetches only the
    rows of old shards that overlap its new shard, and the run ends with the weights of the
    same shrink restored by DCP from a durable save."""
    ref_root = str(tmp_path / "ref")
    hsdp = ["--replicas", "2", "--width", "32"]
    durable = ["--durable-dir", os.path.join(ref_root, "ckpt")]
    run(ref_root, list("abcd"), [*hsdp, "--exit-after", "4", *durable, "--durable-every", "4"])
    for node in "abcd":
        shutil.rmtree(os.path.join(ref_root, node))
    ref = run(ref_root, list("abc"), ["--width", "32", *durable])
    assert [x["tier"] for x in worker_lines(ref).values()] == ["durable"] * 3
    root = str(tmp_path / "mem")
    run(root, list("abcd"), [*hsdp, "--exit-after", "4"])
    shutil.rmtree(os.path.join(root, "d"))
    out = run(root, list("abc"), ["--width", "32"])
    lines = worker_lines(out)
    for rank in range(3):
        x = lines[rank]
        assert (x["step"], x["tier"]) == (4, "memory, resharded from 4 ranks"), x
        assert x["recv_bytes"] <= 2 * x["shard_bytes"], x
    assert _digest(out) == _digest(ref)


@pytest.mark.train
def test_the_durable_tier_goes_by_step_and_a_sigterm_flushes_the_newest_step(tmp_path) -> None:
    """``durable_every=3`` counts steps, not saves since the process started: a run resumed
    at step 4 saves step 6 durably (not 7). Rank 0 alone gets SIGTERM during step 8: both
    ranks write step 8 to the durable tier and wait for its commit before the signal ends
    them; a ``progress`` event marks each durable commit. Then, with every node's memory
    gone, the job resumes from step 8 on disk."""
    root = str(tmp_path)
    durable = ["--durable-dir", str(tmp_path / "ckpt"), "--durable-every", "3"]
    events = str(tmp_path / "events.jsonl")
    env = {"RESILIENT_EVENTS_FILE": events}
    run(root, ["a", "b"], [*durable, "--exit-after", "4"], extra_env=env)
    out = run(root, ["a", "b"], [*durable, "--steps", "10", "--signal-at", "8"],
              extra_env=env, check=False)
    assert "signal 15: step 8 committed to the durable tier" in out, out[-3000:]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["step_000006", "step_000008"]
    evs = [json.loads(x) for x in open(events)]
    assert [e["step"] for e in evs if e["kind"] == "progress" and "durable" in e] == [3, 6, 8]
    for node in ("a", "b"):
        shutil.rmtree(os.path.join(root, node))
    out = run(root, ["c", "d"], [*durable, "--steps", "8"])
    assert [(x["step"], x["tier"]) for x in worker_lines(out).values()] == [(8, "durable")] * 2


def _tier_sockets(out: str) -> list[int]:
    import re

    return [int(x) for x in re.findall(r"tier_sockets=(\d+)", out)]


@pytest.mark.train
def test_the_tiers_open_as_many_sockets_on_six_ranks_as_on_three(tmp_path) -> None:
    """The tiers' gloo groups connect lazily: a rank talks to its peer, its source and the
    ring's neighbours, so the sockets the tiers add per process do not grow with the world
    (a full mesh adds W-1 per group)."""
    small = _tier_sockets(run(str(tmp_path / "3"), list("abc"), ["--steps", "2"]))
    large = _tier_sockets(run(str(tmp_path / "6"), list("abcdef"), ["--steps", "2"]))
    assert len(small) == 3 and len(large) == 6
    assert max(large) <= max(small), (small, large)


@pytest.mark.train
def test_a_reshard_over_the_size_limit_loads_the_durable_tier_and_says_why(tmp_path) -> None:
    """Two ranks stop after step 4 (a durable save of step 3); the job goes on with one rank
    and ``RESILIENT_RESHARD_MAX_BYTES`` below its new shard: the durable save is loaded, not
    node memory's newer step, with a ``tier_fallback`` event naming the limit."""
    root = str(tmp_path)
    durable = ["--durable-dir", str(tmp_path / "ckpt"), "--durable-every", "3"]
    run(root, ["a", "b"], [*durable, "--exit-after", "4"])
    shutil.rmtree(os.path.join(root, "b"))
    events = str(tmp_path / "events.jsonl")
    out = run(root, ["a"], [*durable, "--steps", "4"],
              extra_env={"RESILIENT_EVENTS_FILE": events, "RESILIENT_RESHARD_MAX_BYTES": "1"})
    assert [(x["step"], x["tier"]) for x in worker_lines(out).values()] == [(3, "durable")]
    fb = [json.loads(x) for x in open(events)]
    fb = [e for e in fb if e["kind"] == "tier_fallback"]
    assert len(fb) == 1 and "over reshard_max_bytes 1" in fb[0]["reason"], fb

"""Memory tiers in real multi-process torch.distributed jobs (gloo, CPU): a SIGKILL under
ft_launcher resumes from tier 1, a lost node's rank from its peer's tier-2 copy, a torn tier is
skipped, and with no memory left the durable tier serves; every run ends with the fault-free
weights."""

from __future__ import annotations

import os
import re
import shutil

import pytest

pytest.importorskip("torch")

from resilient_slurm import checkpoint  # noqa: E402
from resilient_slurm.checkpoint import store  # noqa: E402

from .tier_helpers import BIN, digest, on_nodes, starts, under_ft_launcher  # noqa: E402

STEPS = ["--steps", "10", "--step-time", "0"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("ref"))
    return digest(on_nodes(root, ["a", "b"], STEPS))


@pytest.mark.train
def test_a_lost_node_restores_from_the_peer_copy(tmp_path, reference) -> None:
    root = str(tmp_path)
    on_nodes(root, ["a", "b"], [*STEPS, "--exit-after", "6"])
    shutil.rmtree(os.path.join(root, "b"))  # node b is gone; node c replaces it, empty
    out = on_nodes(root, ["a", "c"], STEPS)
    assert sorted(starts(out)) == [(0, 6, "own memory"), (1, 6, "peer copy")]
    assert digest(out) == reference
    # the replacement node got its rank's snapshot back and keeps rank 0's copy again; each
    # node holds keep=2 snapshots per owner, no more (memory bounded)
    for node in ("a", "c"):
        held = {(s.owner, s.step) for s in store.scan(os.path.join(root, node, "job"))}
        assert held == {(0, 9), (0, 10), (1, 9), (1, 10)}, (node, held)


@pytest.mark.train
def test_a_torn_newest_snapshot_is_skipped(tmp_path, reference) -> None:
    root = str(tmp_path)
    on_nodes(root, ["a", "b"], [*STEPS, "--exit-after", "6"])
    for node in ("a", "b"):  # rank 1's step 6 torn on both nodes: step 5 is the newest whole
        data = os.path.join(store.step_path(os.path.join(root, node, "job"), 1, 6), store.DATA)
        with open(data, "r+b") as fh:
            fh.truncate(100)
    out = on_nodes(root, ["a", "b"], STEPS)
    assert sorted(starts(out)) == [(0, 5, "own memory"), (1, 5, "own memory")]
    assert digest(out) == reference


@pytest.mark.train
def test_a_resume_drops_the_snapshots_it_replaces(tmp_path) -> None:
    """Rank 1's step 6 torn: the run resumes from 5, and rank 0's step 6 (and its copy) from
    the run that died go, so a later load can never pair them with the new run's shards."""
    root = str(tmp_path)
    on_nodes(root, ["a", "b"], [*STEPS, "--exit-after", "6"])
    data = os.path.join(store.step_path(os.path.join(root, "b", "job"), 1, 6), store.DATA)
    os.unlink(data)
    data = os.path.join(store.step_path(os.path.join(root, "a", "job"), 1, 6), store.DATA)
    os.unlink(data)
    out = on_nodes(root, ["a", "b"], ["--steps", "5", "--step-time", "0"])  # resume, no step
    assert sorted(starts(out)) == [(0, 5, "own memory"), (1, 5, "own memory")]
    for node in ("a", "b"):
        steps = {s.step for s in store.scan(os.path.join(root, node, "job"))}
        assert steps == {5}, (node, steps)


@pytest.mark.train
def test_with_no_memory_left_the_durable_tier_serves(tmp_path, reference) -> None:
    root = str(tmp_path)
    on_nodes(root, ["a", "b"], [*STEPS, "--exit-after", "7", "--durable-every", "3"])
    assert sorted(os.listdir(os.path.join(root, "ckpt"))) == ["step_000003", "step_000006"]
    for node in ("a", "b"):
        shutil.rmtree(os.path.join(root, node))
    out = on_nodes(root, ["c", "d"], [*STEPS, "--durable-every", "3"])
    assert sorted(starts(out)) == [(0, 6, "durable"), (1, 6, "durable")]
    assert digest(out) == reference


@pytest.mark.train
def test_a_smaller_world_reshards_from_node_memory(tmp_path) -> None:
    """Three ranks on nodes a, b, c stop after step 6; node c is gone and the job goes on with
    two ranks (a shrink). No disk checkpoint at all: the memory tiers' world-3 set (rank 2's
    copy on node a) is merged and cut onto two ranks. The weights equal those of the same
    shrink restored by DCP's own resharding from a durable save of step 6."""
    ref_root = str(tmp_path / "ref")
    on_nodes(ref_root, ["a", "b", "c"], [*STEPS, "--exit-after", "6", "--durable-every", "6"])
    for node in ("a", "b", "c"):
        shutil.rmtree(os.path.join(ref_root, node))
    ref = on_nodes(ref_root, ["a", "b"], STEPS)
    assert sorted(starts(ref)) == [(0, 6, "durable"), (1, 6, "durable")]
    root = str(tmp_path / "mem")
    on_nodes(root, ["a", "b", "c"], [*STEPS, "--exit-after", "6"])
    shutil.rmtree(os.path.join(root, "c"))
    out = on_nodes(root, ["a", "b"], STEPS)
    tier = "memory, resharded from 3 ranks"
    assert sorted(starts(out)) == [(0, 6, tier), (1, 6, tier)]
    assert digest(out) == digest(ref)
    for node in ("a", "b"):  # the world-2 run's own snapshots replace the world-3 ones
        held = {(s.owner, s.step, s.world) for s in store.scan(os.path.join(root, node, "job"))}
        assert {(o, st) for o, st, w in held if w == 2} == {(0, 9), (0, 10), (1, 9), (1, 10)}


@pytest.mark.train
@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "ft_launcher")), reason="no ft_launcher")
def test_sigkill_under_ft_launcher_resumes_from_the_step_it_died_at(tmp_path) -> None:
    """No durable checkpoint at all: rank 1 is SIGKILLed during step 7 (steps 1-6 done), the
    restarted ranks start at step 6 from their own node memory: 0 lost steps. (Killed right
    after ``save`` returns, a rank can lose the one save still being written: see
    docs/checkpointing.md.)"""
    root = str(tmp_path)
    steps = ["--steps", "10", "--step-time", "0.2"]
    ref = digest(under_ft_launcher(str(tmp_path / "ref"), steps))
    out = under_ft_launcher(root, [*steps, "--fault", "sigkill@7:1"])
    assert "[script] fault=sigkill step=7 rank=1" in out
    assert sorted(starts(out)) == [(0, 0, "None"), (0, 6, "own memory"), (1, 0, "None"),
                                   (1, 6, "own memory")]
    assert digest(out) == ref
    assert not os.path.exists(os.path.join(root, "ckpt", "step_000006"))


def _snapshot_bytes(out: str) -> int:
    found = re.findall(r"snapshot_bytes=(\d+)", out)
    assert found, out[-3000:]
    return int(found[0])


@pytest.mark.train
def test_a_memory_cap_turns_tier_2_off_on_every_rank_then_refuses(tmp_path, reference) -> None:
    """The tiers take at most ``RESILIENT_TIER_MAX_BYTES`` per rank: a cap that fits tier 1 but
    not a peer's copies turns tier 2 off on both ranks (said in a line per rank, training
    unchanged); a cap below tier 1 refuses the first save on every rank with the reason."""
    free = on_nodes(str(tmp_path / "free"), ["a", "b"], STEPS)
    assert re.search(r"\[resilient-checkpoint\] rank 0: snapshot .*tier 2: keep 2 of rank 1", free)
    size = _snapshot_bytes(free)
    root = str(tmp_path / "capped")
    out = on_nodes(root, ["a", "b"], STEPS, extra_env={"RESILIENT_TIER_MAX_BYTES": str(4 * size)})
    assert digest(out) == reference
    assert re.search(r"rank 0: .*tier 2: off; .*; tier 2 off:", out), out[-2000:]
    assert re.search(r"rank 1: .*tier 2: off; .*; tier 2 off", out), out[-2000:]
    for node, rank in (("a", 0), ("b", 1)):  # each node holds its own rank only
        held = {s.owner for s in store.scan(os.path.join(root, node, "job"))}
        assert held == {rank}, (node, held)
    out = on_nodes(str(tmp_path / "tiny"), ["a", "b"], STEPS, check=False,
                   extra_env={"RESILIENT_TIER_MAX_BYTES": str(size)})
    assert out.count("memory tiers do not fit max_bytes") >= 2, out[-3000:]
    assert "refused: tier 1 alone needs" in out


@pytest.mark.train
def test_two_nodes_sharing_one_memory_folder_are_refused(tmp_path) -> None:
    """Simulated nodes a and b given one folder (no ``{node}``): a peer's copy would overwrite
    its owner's own snapshot there, so the first save refuses on both ranks, with the way out;
    neither waits for the other."""
    out = on_nodes(str(tmp_path), ["a", "b"], STEPS, check=False, timeout=120,
                   extra_env={"RESILIENT_TIER1_DIR": str(tmp_path / "shared")})
    assert out.count("is also node") == 1, out[-3000:]  # the rank that came second says why
    # a CheckpointError that is also a configuration error (resilient_slurm.fatal): no retry
    assert out.count("NodeMemoryShared") >= 2, out[-3000:]
    assert issubclass(store.NodeMemoryShared, checkpoint.CheckpointError)
    assert "each node needs a folder of its own (RESILIENT_TIER1_DIR)" in out
    assert not store.scan(str(tmp_path / "shared" / "job"))

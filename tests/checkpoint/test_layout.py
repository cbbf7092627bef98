"""Commit protocol and retention, torch-free (the launcher relies on this module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from resilient_slurm.checkpoint import layout


def _write_rank(d: str, rank: int, session: str, step: int, world: int, done: bool = True) -> None:
    os.makedirs(d, exist_ok=True)
    with open(layout.rank_file(d, rank, session), "wb") as fh:
        fh.write(b"x" * (10 + rank))
    if done:
        layout.write_done(d, rank, session, step, world)


def _save(root: str, step: int, world: int = 2, session: str = "s1") -> str:
    d = layout.step_dir(root, step)
    for r in range(world):
        _write_rank(d, r, session, step, world)
    assert layout.try_commit(d, step, session, world)
    return d


def test_layout_module_does_not_import_torch() -> None:
    code = ("import sys; import resilient_slurm.checkpoint.layout as l, "
            "resilient_slurm_lab.faults.injector as f; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_empty_or_missing_dir_has_no_latest(tmp_path) -> None:
    assert layout.latest_committed_step(str(tmp_path / "absent")) is None
    assert layout.latest_committed_step(str(tmp_path)) is None


def test_commit_needs_every_rank(tmp_path) -> None:
    d = layout.step_dir(str(tmp_path), 5)
    _write_rank(d, 0, "s1", 5, 2)
    assert not layout.try_commit(d, 5, "s1", 2)
    assert layout.latest_committed_step(str(tmp_path)) is None
    _write_rank(d, 1, "s1", 5, 2, done=False)  # file written, marker not yet
    assert not layout.try_commit(d, 5, "s1", 2)
    layout.write_done(d, 1, "s1", 5, 2)
    assert layout.try_commit(d, 5, "s1", 2)
    assert layout.latest_committed_step(str(tmp_path)) == 5
    commit = layout.latest_commit(str(tmp_path))
    assert commit is not None and commit.files == ("rank_00000-s1.pt", "rank_00001-s1.pt")


def test_ranks_of_different_sessions_never_commit_together(tmp_path) -> None:
    d = layout.step_dir(str(tmp_path), 7)
    _write_rank(d, 0, "old", 7, 2)
    _write_rank(d, 1, "new", 7, 2)
    assert not layout.try_commit(d, 7, "old", 2)
    assert not layout.try_commit(d, 7, "new", 2)


def test_marker_size_mismatch_is_not_done(tmp_path) -> None:
    d = layout.step_dir(str(tmp_path), 3)
    _write_rank(d, 0, "s", 3, 1)
    with open(layout.rank_file(d, 0, "s"), "ab") as fh:  # file changed after the marker
        fh.write(b"more")
    assert not layout.try_commit(d, 3, "s", 1)


def test_torn_and_corrupt_markers_are_ignored(tmp_path) -> None:
    root = str(tmp_path)
    _save(root, 10)
    torn = layout.step_dir(root, 20)
    _write_rank(torn, 0, "s1", 20, 2)
    bad = layout.step_dir(root, 30)
    os.makedirs(bad)
    with open(os.path.join(bad, layout.COMMIT_MARKER), "w") as fh:
        fh.write('{"step": 30, "world_')
    wrong = layout.step_dir(root, 40)
    os.makedirs(wrong)
    with open(os.path.join(wrong, layout.COMMIT_MARKER), "w") as fh:
        json.dump({"step": 41, "world_size": 1, "session": "s", "files": ["a"]}, fh)
    assert layout.latest_committed_step(root) == 10
    assert layout.describe(root) == {"committed": [10], "uncommitted": [20, 30, 40]}


def test_retention_keeps_newest_and_protected(tmp_path) -> None:
    root = str(tmp_path)
    for step in (10, 20, 30, 40, 50):
        _save(root, step)
    _write_rank(layout.step_dir(root, 45), 0, "s1", 45, 2)  # stale torn save
    _write_rank(layout.step_dir(root, 60), 0, "s1", 60, 2)  # in progress
    deleted = layout.apply_retention(root, keep=2, protect=[20])
    assert sorted(deleted) == [10, 30, 45]
    assert layout.describe(root) == {"committed": [20, 40, 50], "uncommitted": [60]}


def test_retention_rejects_zero_keep(tmp_path) -> None:
    with pytest.raises(ValueError):
        layout.apply_retention(str(tmp_path), keep=0)


def test_remove_save_hides_commit_first(tmp_path) -> None:
    d = _save(str(tmp_path), 10)
    layout.remove_save(d)
    assert not os.path.exists(d)
    assert layout.latest_committed_step(str(tmp_path)) is None


def test_session_names_are_checked() -> None:
    with pytest.raises(ValueError):
        layout.rank_stem(0, "../evil")

"""The frameworks' checkpoints found without flags (launcher/cycle/progress.py, ckpt_meta.py,
launch_env.script_checkpoint_dir): the directory from the script's own argument as its users
spell it, or from the saves the instrumented ranks reported; the layouts of Lightning
(``last.ckpt`` by its metadata), Hugging Face Trainer, Accelerate, torchtitan (DCP)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.events import EventKind, EventLog, read_events
from resilient_slurm.launcher.cycle import progress
from resilient_slurm.launcher.cycle.ckpt_meta import torch_zip_step
from resilient_slurm.launcher.cycle.launch_env import CHECKPOINT_FLAGS, script_checkpoint_dir


@given(st.sampled_from(sorted(CHECKPOINT_FLAGS)), st.booleans(), st.sampled_from(["", "cfg."]),
       st.lists(st.sampled_from(["--lr", "3e-4", "--bf16", "-v"]), max_size=3))
def test_the_scripts_own_spelling(flag: str, with_eq: bool, prefix: str,
                                  before: list[str]) -> None:
    given_ = [f"--{prefix}{flag}=/ck"] if with_eq else [f"--{prefix}{flag}", "/ck"]
    args = [*[a for a in before if a.startswith("--")], *given_, "--epochs", "3"]
    assert script_checkpoint_dir(args) == "/ck"


def test_no_checkpoint_argument() -> None:
    assert script_checkpoint_dir(["--lr", "1", "--output", "x", "--save_steps", "10"]) is None
    assert script_checkpoint_dir(["--output_dir", "--bf16"]) is None  # no value given


def test_hf_trainer_accelerate_torchtitan_layouts(tmp_path: Path) -> None:
    hf = tmp_path / "out"
    for n in (10, 20):
        (hf / f"checkpoint-{n}").mkdir(parents=True)
    (hf / "checkpoint-10" / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    (hf / "checkpoint-20" / "model.safetensors").write_text("being written")
    ck = progress.newest_checkpoint(str(hf))
    assert ck is not None and (ck.step, ck.layout) == (10, "hf-trainer")

    acc = tmp_path / "project" / "checkpoints"
    (acc / "checkpoint_3").mkdir(parents=True)
    (acc / "checkpoint_3" / "random_states_0.pkl").write_bytes(b"x")
    (acc / "checkpoint_4").mkdir()
    ck = progress.newest_checkpoint(str(tmp_path / "project"))
    assert ck is not None and (ck.step, ck.layout) == (3, "accelerate")

    titan = tmp_path / "dump" / "checkpoint"
    (titan / "step-20").mkdir(parents=True)
    (titan / "step-20" / ".metadata").write_bytes(b"x")
    ck = progress.newest_checkpoint(str(tmp_path / "dump"))
    assert ck is not None and (ck.step, ck.layout) == (20, "dcp")


def test_lightning_last_ckpt_step_from_its_metadata(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    torch.save({"epoch": 0, "global_step": 42, "state_dict": {"w": torch.ones(3)},
                "pytorch-lightning_version": "2.6"}, d / "last.ckpt")
    torch.save({"global_step": 30}, d / "epoch=0-step=30.ckpt")
    assert torch_zip_step(str(d / "last.ckpt")) == 42
    ck = progress.newest_checkpoint(str(d))
    assert ck is not None and (ck.step, ck.layout, Path(ck.path).name) == (
        42, "lightning", "last.ckpt")
    (d / "last.ckpt").write_bytes(b"not a zip")  # torn or foreign: ignored, never an error
    ck = progress.newest_checkpoint(str(d))
    assert ck is not None and ck.step == 30


def test_directory_learned_from_the_ranks_saves(tmp_path: Path) -> None:
    events = str(tmp_path / "events.jsonl")
    out = tmp_path / "out"
    (out / "checkpoint-10").mkdir(parents=True)
    (out / "checkpoint-10" / "trainer_state.json").write_text("{}")
    log = EventLog(events, "training")
    log.emit(EventKind.CHECKPOINT, step=10, layout="hf-trainer", path=str(out / "checkpoint-10"))
    assert progress.learned_dir(events) == str(out)
    assert progress.checkpoint_root(str(tmp_path / "run3" / "last.ckpt")) == str(
        tmp_path / "run3")
    assert progress.checkpoint_root(str(tmp_path / "ck" / "step-12" / "model.pt")) == str(
        tmp_path / "ck")
    tracker = progress.Tracker(None, events, None, EventLog(events, "launcher"))
    assert tracker.step() == 10 and tracker.checkpoint_dir == str(out)


def test_no_progress_signal_said_at_start(tmp_path: Path, capsys) -> None:
    """Uninstrumented ranks and no checkpoint directory: said at the start, while the user can
    still act, not only after training ended; instrumented ranks: nothing to say."""
    events = str(tmp_path / "events.jsonl")
    progress.Tracker(None, events, None, EventLog(events, "launcher")).at_start(True)
    assert "no progress signal" not in capsys.readouterr().out
    tracker = progress.Tracker(None, events, None, EventLog(events, "launcher"))
    tracker.at_start(False)
    assert "no progress signal (ranks not instrumented" in capsys.readouterr().out
    tracker.finished_cycle()  # said once
    assert capsys.readouterr().out == ""
    kinds = [e["kind"] for e in read_events(events)]
    assert kinds == ["no_progress_signal"]

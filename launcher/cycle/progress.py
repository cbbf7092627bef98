"""Is the training getting anywhere? Progress from any script, not only ours.

Two sources, either enough:

* **step reports** in the job's events file (``$RESILIENT_EVENTS_FILE``): ``progress`` events
  with an integer ``step``, written by our training library or by any script through
  :func:`report_step` (a one-line call per step; a no-op outside ``resilient-launch``);
* the **newest complete checkpoint** under the checkpoint directory, whatever wrote it
  (:func:`newest_checkpoint`): a numbered directory holding a completion marker (ours
  ``COMMITTED``, ``DONE``, ``_SUCCESS``... or a name the user gives) or a finished
  ``torch.distributed.checkpoint`` save (its ``.metadata`` is written last); Megatron's
  ``latest_checkpointed_iteration.txt``; Lightning's ``...step=N....ckpt``; NVRx local
  checkpoints ``iter_NNNNNNN_<rank>_local.pt`` (not while ``.dirty``).

The progress mark is the highest step either source shows. A cycle that ends without raising
it made no progress. With neither source there is no progress signal at all, and the launcher
issues no no-progress verdict (it says so in its log): restarts alone prove nothing.

Rank heartbeats say a rank is alive, not how far it got: they drive hang detection and the
report's "first heartbeat after a restart", never this verdict.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from resilient_slurm.checkpoint.layout import COMMIT_MARKER
from resilient_slurm.events import Checkpoint as CheckpointEvent
from resilient_slurm.events import EventKind, EventLog, NoProgressSignal, read_events
from resilient_slurm.events import Progress as ProgressEvent
from resilient_slurm.launcher.cycle.ckpt_meta import torch_zip_step

# Completion markers: our own checkpoint layout's first (checkpoint/layout.py), then common ones.
MARKERS = (COMMIT_MARKER, "DONE", "done", ".done", "COMPLETE", "complete", ".complete",
           "_SUCCESS", "SUCCESS", "_COMPLETE",
           # the frameworks' last file of a save: Hugging Face Trainer's checkpoint-N/,
           # Accelerate's checkpoint_N/ (rank 0's RNG state, after models and optimizers)
           "trainer_state.json", "random_states_0.pkl")
FRAMEWORK_OF = {"trainer_state.json": "hf-trainer", "random_states_0.pkl": "accelerate"}
DCP_METADATA = ".metadata"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_NUMBER = re.compile(r"(\d+)(?!.*\d)")  # the last number in a name
_LIGHTNING = re.compile(r"step=(\d+).*\.ckpt$")
_STEP_FOLDER = re.compile(r"^(checkpoint|step|iter|global_step|ckpt)[-_]?\d+$", re.I)
_LIGHTNING_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")  # its step: in the file (ckpt_meta)
_NVRX_LOCAL = re.compile(r"^iter_(\d+)_\d+_local\.pt$")
MAX_DEPTH = 3


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: str
    layout: str  # "marker:NAME", "dcp", "megatron", "lightning", "hf-trainer", "accelerate",
    # "nvrx-local"


@dataclass(frozen=True)
class Progress:
    """The progress mark: ``step`` (None when unknown) and where it came from (``source``
    None: no progress signal exists)."""

    step: int | None
    source: str | None

    @property
    def known(self) -> bool:
        return self.source is not None


def _step_of(name: str) -> int | None:
    m = _NUMBER.search(name)
    return int(m.group(1)) if m else None


def _candidates(root: str, entries: Iterable[os.DirEntry[str]],
                markers: tuple[str, ...]) -> Iterable[Checkpoint]:
    for e in entries:
        name = e.name
        if e.is_file(follow_symlinks=False):
            if name == MEGATRON_TRACKER:
                try:
                    text = open(e.path, encoding="utf-8").read(64).strip()
                except OSError:
                    continue
                if text.isdigit():
                    yield Checkpoint(int(text), e.path, "megatron")
            elif (m := _LIGHTNING.search(name)) is not None:
                yield Checkpoint(int(m.group(1)), e.path, "lightning")
            elif _LIGHTNING_LAST.match(name) and (step := torch_zip_step(e.path)) is not None:
                yield Checkpoint(step, e.path, "lightning")
            elif (m := _NVRX_LOCAL.match(name)) is not None:
                yield Checkpoint(int(m.group(1)), e.path, "nvrx-local")
            continue
        if not e.is_dir(follow_symlinks=False):
            continue
        step = _step_of(name)
        if step is None:
            continue
        for marker in markers:
            if os.path.isfile(os.path.join(e.path, marker)):
                yield Checkpoint(step, e.path, FRAMEWORK_OF.get(marker, f"marker:{marker}"))
                break
        else:
            if os.path.isfile(os.path.join(e.path, DCP_METADATA)):
                yield Checkpoint(step, e.path, "dcp")
    del root


def newest_checkpoint(checkpoint_dir: str | None, marker: str | None = None,
                      max_depth: int = MAX_DEPTH) -> Checkpoint | None:
    """The highest-step complete checkpoint under ``checkpoint_dir`` in any layout above;
    ``marker`` adds the user's own completion-marker file name. None when there is none (or
    the directory does not exist). Looks ``max_depth`` levels down."""
    if not checkpoint_dir:
        return None
    markers = ((marker,) if marker else ()) + MARKERS
    best: Checkpoint | None = None
    todo = [(checkpoint_dir, 0)]
    while todo:
        path, depth = todo.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except OSError:
            continue
        for ck in _candidates(path, entries, markers):
            if best is None or ck.step > best.step:
                best = ck
        if depth + 1 < max_depth:
            todo += [(e.path, depth + 1) for e in entries
                     if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    return best


def reported_step(events_path: str, since: float = 0.0) -> int | None:
    """The highest ``step`` of a ``progress`` event at or after ``since``."""
    best = None
    for e in read_events(events_path):
        step = e.get("step")
        if e.get("kind") == EventKind.PROGRESS and isinstance(step, int) \
                and not isinstance(step, bool) and float(e.get("ts", 0)) >= since:
            best = step if best is None else max(best, step)
    return best


def checkpoint_root(path: str) -> str:
    """The checkpoint directory a saved path lies in: a file's folder, and above a folder
    named by its step (``checkpoint-10/``, ``step-20/``, ``checkpoint_3/``)."""
    path = os.path.normpath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    if _STEP_FOLDER.match(os.path.basename(folder)):
        folder = os.path.dirname(folder)
    return folder


def learned_dir(events_path: str) -> str | None:
    """The checkpoint directory of the newest save the instrumented ranks reported
    (``checkpoint`` events of the training with a ``path``), or None."""
    path = None
    for e in read_events(events_path):
        if e.get("kind") == EventKind.CHECKPOINT and e.get("source") == "training" \
                and isinstance(e.get("path"), str):
            path = e["path"]
    return checkpoint_root(path) if path else None


def observe(checkpoint_dir: str | None, events_path: str, marker: str | None = None) -> Progress:
    """The job's progress mark now, from step reports and checkpoints."""
    reported = reported_step(events_path)
    ckpt = newest_checkpoint(checkpoint_dir, marker)
    if reported is None and ckpt is None:
        return Progress(None, None)
    if ckpt is None or (reported is not None and reported >= ckpt.step):
        return Progress(reported, "step reports")
    return Progress(ckpt.step, f"checkpoint ({ckpt.layout}) {ckpt.path}")


class Tracker:
    """The launcher's reading of progress over one batch script's run: :meth:`step` (the mark
    now), :meth:`finished_cycle` (the mark a cycle ended with; without any progress signal it
    says once, in ``log`` and on stdout, that the no-progress verdict is off) and
    :meth:`note_checkpoint` (a ``checkpoint`` event for each newer complete checkpoint)."""

    def __init__(self, checkpoint_dir: str | None, events_path: str, marker: str | None,
                 log: EventLog) -> None:
        self.checkpoint_dir, self.events_path, self.marker = checkpoint_dir, events_path, marker
        self.log = log
        self.checkpoint_seen: int | None = None  # the newest checkpoint step recorded
        self.said_no_signal = False

    def _learn(self) -> None:
        """Without a checkpoint directory: the one the instrumented ranks' saves show."""
        if self.checkpoint_dir is None:
            self.checkpoint_dir = learned_dir(self.events_path)

    def step(self) -> int | None:
        self._learn()
        return observe(self.checkpoint_dir, self.events_path, self.marker).step

    def finished_cycle(self) -> Progress:
        self._learn()
        p = observe(self.checkpoint_dir, self.events_path, self.marker)
        if not p.known:
            self._say_no_signal("no step reports, no complete checkpoint under "
                                f"{self.checkpoint_dir or 'any --checkpoint-dir'}")
        return p

    def at_start(self, instrumented: bool) -> None:
        """Said at the start, while the user can still act: no progress signal can come from
        uninstrumented ranks without a checkpoint directory (step reports only if the script
        sends them itself)."""
        if not instrumented and not self.checkpoint_dir and not self.step():
            self._say_no_signal("ranks not instrumented (--no-instrument) and no checkpoint "
                                "directory: only the script's own report_step calls")

    def _say_no_signal(self, detail: str) -> None:
        if self.said_no_signal:
            return
        self.said_no_signal = True
        why = (f"no progress signal ({detail}): the no-progress verdict is off; failed "
               "cycles are requeued until --max-requeues is spent")
        self.log.emit(EventKind.NO_PROGRESS_SIGNAL, **NoProgressSignal(detail=why))
        print(f"resilient-launch: {why}", flush=True)

    def note_checkpoint(self) -> None:
        """The progress of a script that reports no steps, for the report's goodput."""
        self._learn()
        ckpt = newest_checkpoint(self.checkpoint_dir, self.marker)
        if ckpt is not None and (self.checkpoint_seen is None or ckpt.step > self.checkpoint_seen):
            self.checkpoint_seen = ckpt.step
            self.log.emit(EventKind.CHECKPOINT, **CheckpointEvent(
                step=ckpt.step, layout=ckpt.layout, path=ckpt.path))


# -- the training-side API --------------------------------------------------------------------
_LOG: EventLog | None = None
CALLED = False  # report_step was called in this process


def report_step(step: int, **fields: object) -> None:
    """Tell ``resilient-launch`` that training completed ``step`` (call once per step, or
    every few steps; rank 0 only by default). It feeds the no-progress verdict and the
    report's steps, lost steps and goodput. Outside ``resilient-launch`` (no
    ``$RESILIENT_EVENTS_FILE``) it does nothing. Never raises on a full or missing disk.

    .. code-block:: python

        from resilient_slurm.launcher.cycle.progress import report_step
        ...
        report_step(step)  # after optimizer.step()
    """
    global _LOG, CALLED
    CALLED = True  # the ranks' instrumentation then leaves step reports to the script
    path = os.environ.get("RESILIENT_EVENTS_FILE")
    if not path or os.environ.get("RANK", "0") != "0":
        return
    if _LOG is None or _LOG.path != path:
        _LOG = EventLog(path, "training", node=os.environ.get("SLURMD_NODENAME"))
    try:
        # the caller's own **fields are free (report_step's contract): only step and rank typed
        _LOG.emit(EventKind.PROGRESS, **ProgressEvent(step=int(step), rank=0), **fields)
    except OSError:
        pass

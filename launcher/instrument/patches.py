"""What the bootstrap attaches to the libraries a script imports, each when (and only if) the
script imports it (``imports.when_imported``):

* ``torch``: the optimizer-step post hook (``Agent.on_step``) and ``torch.save`` (a save to a
  path is kept alive and reported as a checkpoint);
* ``torch.distributed.checkpoint``: ``save`` and ``async_save`` (DCP; torchtitan's ``step-N``);
* NVRx's ``RankMonitorClient.init_workload_monitoring``: the script's own heartbeat client
  (not ours: :func:`ours`) makes the agent step aside (``Agent.yield_to_user``);
* Lightning's ``Trainer.save_checkpoint`` (``last.ckpt`` included), Hugging Face's
  ``Trainer._save_checkpoint`` (``checkpoint-N/``), Accelerate's ``Accelerator.save_state``
  (``checkpoint_N``): kept alive and reported with their paths; Lightning's evaluation loop and
  Hugging Face's ``Trainer.evaluate``: kept alive (no optimizer step while they run);
* the end of training (Lightning's ``fit``, Hugging Face's ``train``, ``torch.distributed``'s
  ``destroy_process_group`` returning, the interpreter's exit): ``Agent.pause``, the heartbeat
  client closed so teardown and what follows is no hang.

Each wrapper calls the original with the same arguments and returns its result; what the
wrapper adds never raises into the script.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

from resilient_slurm.launcher.instrument.agent import Agent, is_ours

MARK = "__resilient_instrumented__"


def _path(x: Any) -> str | None:
    if isinstance(x, (str, os.PathLike)):
        p = os.fspath(x)
        return p if isinstance(p, str) else None
    return None


def _wrap(owner: Any, name: str, agent: Agent, layout: str | None,
          where: Callable[[tuple[Any, ...], dict[str, Any], Any], str | None]) -> None:
    """Replace ``owner.name`` by a wrapper that runs the original inside ``agent.saving``;
    ``where(args, kwargs, result)`` names the checkpoint's path (None: unknown)."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        box: list[Any] = []
        found: list[str | None] = []

        def path() -> str | None:
            if not found:
                try:
                    found.append(where(args, kwargs, box[0] if box else None))
                except Exception:  # noqa: BLE001 - the path is information only
                    found.append(None)
            return found[0]

        with agent.saving(path if layout else None, layout or ""):
            box.append(original(*args, **kwargs))
        return box[0]

    setattr(wrapper, MARK, True)
    setattr(owner, name, wrapper)


def _until_end(owner: Any, name: str, agent: Agent) -> None:
    """Replace ``owner.name`` (a training loop: Lightning's ``fit``, Hugging Face's ``train``,
    ``destroy_process_group``) by a wrapper that pauses the agent when it returns or raises."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            agent.pause()

    setattr(wrapper, MARK, True)
    setattr(owner, name, wrapper)


def _arg(i: int, key: str) -> Callable[[tuple[Any, ...], dict[str, Any], Any], str | None]:
    def where(args: tuple[Any, ...], kwargs: dict[str, Any], _result: Any) -> str | None:
        return _path(kwargs[key] if key in kwargs else args[i] if len(args) > i else None)
    return where


def on_torch(agent: Agent) -> Callable[[ModuleType], None]:
    def attach(torch: ModuleType) -> None:
        optimizer = importlib.import_module("torch.optim.optimizer")  # loaded with torch
        optimizer.register_optimizer_step_post_hook(agent.on_step)
        atexit.register(agent.pause)
        _wrap(torch, "save", agent, "torch.save", _arg(1, "f"))
    return attach


def on_dcp(agent: Agent) -> Callable[[ModuleType], None]:
    def where(args: tuple[Any, ...], kwargs: dict[str, Any], _r: Any) -> str | None:
        cid = kwargs.get("checkpoint_id")
        writer = kwargs.get("storage_writer")
        return _path(cid) or _path(getattr(writer, "path", None))

    def attach(dcp: ModuleType) -> None:
        _wrap(dcp, "save", agent, "dcp", where)
        _wrap(dcp, "async_save", agent, "dcp", where)
    return attach


def on_distributed(agent: Agent) -> Callable[[ModuleType], None]:
    def attach(dist: ModuleType) -> None:
        _until_end(dist, "destroy_process_group", agent)
    return attach


def on_nvrx_client(agent: Agent) -> Callable[[ModuleType], None]:
    def attach(mod: ModuleType) -> None:
        cls = mod.RankMonitorClient
        original = cls.init_workload_monitoring
        if getattr(original, MARK, False):
            return

        @functools.wraps(original)
        def init(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not is_ours():
                agent.yield_to_user()
            return original(self, *args, **kwargs)

        setattr(init, MARK, True)
        cls.init_workload_monitoring = init
    return attach


def on_lightning_trainer(agent: Agent) -> Callable[[ModuleType], None]:
    def attach(mod: ModuleType) -> None:
        _wrap(mod.Trainer, "save_checkpoint", agent, "lightning", _arg(1, "filepath"))
        _until_end(mod.Trainer, "fit", agent)
    return attach


def on_lightning_eval(agent: Agent) -> Callable[[ModuleType], None]:
    def attach(mod: ModuleType) -> None:
        loop = getattr(mod, "_EvaluationLoop", None)
        if loop is not None:
            _wrap(loop, "run", agent, None, lambda *_: None)
    return attach


def on_hf_trainer(agent: Agent) -> Callable[[ModuleType], None]:
    def where(args: tuple[Any, ...], _kwargs: dict[str, Any], _r: Any) -> str | None:
        trainer = args[0]
        return os.path.join(trainer.args.output_dir,
                            f"checkpoint-{trainer.state.global_step}")

    def attach(mod: ModuleType) -> None:
        _wrap(mod.Trainer, "_save_checkpoint", agent, "hf-trainer", where)
        _wrap(mod.Trainer, "evaluate", agent, None, lambda *_: None)
        _until_end(mod.Trainer, "train", agent)
    return attach


def on_accelerate(agent: Agent) -> Callable[[ModuleType], None]:
    def where(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> str | None:
        return _path(result) or _arg(1, "output_dir")(args, kwargs, None)

    def attach(mod: ModuleType) -> None:
        _wrap(mod.Accelerator, "save_state", agent, "accelerate", where)
    return attach


# module -> what to attach when the script imports it
TARGETS: tuple[tuple[str, Callable[[Agent], Callable[[ModuleType], None]]], ...] = (
    ("torch", on_torch),
    ("torch.distributed.checkpoint", on_dcp),
    ("torch.distributed", on_distributed),
    ("nvidia_resiliency_ext.fault_tolerance.rank_monitor_client", on_nvrx_client),
    ("pytorch_lightning.trainer.trainer", on_lightning_trainer),
    ("lightning.pytorch.trainer.trainer", on_lightning_trainer),
    ("pytorch_lightning.loops.evaluation_loop", on_lightning_eval),
    ("lightning.pytorch.loops.evaluation_loop", on_lightning_eval),
    ("transformers.trainer", on_hf_trainer),
    ("accelerate.accelerator", on_accelerate),
)

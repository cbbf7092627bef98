"""What ``boot/sitecustomize.py`` runs at every interpreter start in the step: in a training
rank with instrumentation on (``$RESILIENT_INSTRUMENT``), the post-import hooks of
``patches.TARGETS`` and the pynvml deprecation filter; then, in every process, the user's own
``sitecustomize`` (the next one on ``sys.path``). Imports neither torch nor NVRx: a process
that never imports torch is never touched further."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import traceback
import warnings

from resilient_slurm.launcher.instrument import ENABLE_ENV

AGENT: object | None = None
_said: set[str] = set()


def is_rank(env: dict[str, str] | os._Environ[str]) -> bool:
    """A training rank started by ft_launcher/torchrun (not ft_launcher, not the node shim)."""
    return bool(env.get("RANK")) and bool(env.get("LOCAL_RANK")) \
        and bool(env.get("TORCHELASTIC_RUN_ID") or env.get("FT_RANK_MONITOR_IPC_SOCKET"))


def _report(module: str, exc: BaseException) -> None:
    key = f"{module}:{type(exc).__name__}"
    if key not in _said:
        _said.add(key)
        print(f"resilient-launch instrument: not attached to {module} "
              f"({type(exc).__name__}: {exc}); the script runs without it", file=sys.stderr,
              flush=True)


def instrument(env: dict[str, str]) -> object:
    """Attach the agent's hooks for the modules the script will import; the agent."""
    from resilient_slurm.launcher.instrument import imports, patches
    from resilient_slurm.launcher.instrument.agent import Agent

    agent = Agent(env)
    imports.install(_report)
    for module, attach in patches.TARGETS:
        imports.when_imported(module, attach(agent))
    return agent


def start(boot_file: str) -> None:
    """Instrument this process if it is a rank and instrumentation is on; chain to the
    user's ``sitecustomize``. Never raises."""
    global AGENT
    try:
        if os.environ.get(ENABLE_ENV) == "1" and is_rank(os.environ) and AGENT is None:
            # nvidia-resiliency-ext still depends on the deprecated `pynvml` package
            warnings.filterwarnings("ignore", message="The pynvml package is deprecated",
                                    category=FutureWarning)
            AGENT = instrument(dict(os.environ))
    except Exception as exc:  # noqa: BLE001 - never break the script
        _report("the bootstrap", exc)
    chain(boot_file)


def chain(boot_file: str) -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (the user's or the distribution's) as
    ``sitecustomize``; an error in it is printed as Python's ``site`` prints it."""
    here = os.path.realpath(os.path.dirname(boot_file))
    paths = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - as site.execsitecustomize does
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        if sys.flags.verbose:
            traceback.print_exc()

"""What the three hooks share: argument parsing, set-up, and the guard around a run.

The prolog (``prolog/hook.py``), the epilog (``epilog/hook.py``) and the HealthCheckProgram
(``hooks/health.py``, the no-argument form of ``resilient-health``) all run through
:func:`guarded`.

They take only ``--config PATH`` and ``--node NAME`` (tests, manual runs); everything else comes
from the config file (default ``/etc/resilient-slurm/config.toml``). Root hooks take **no**
configuration from the environment (no ``RESILIENT_SLURM_*`` variable, not even the config
path): the file must be owned by root (or the running user) and not writable by group or
others, checked on every run. Exit statuses: ``hooks/exits.py`` (``HOOK_EXITS``, rendered into
``--help``); a non-zero prolog/epilog status also makes Slurm drain the node (we drain first,
with our own reason).

The hardware they check is this machine's. A caller outside the product may pass another to
an entry point (``prolog_main(argv, hardware=...)``, the lab's wrappers for its sandbox):
:func:`guarded` makes it the hardware of the whole run. Nothing in the config file or the
environment can.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from resilient_slurm import __version__
from resilient_slurm.config import DEFAULT_PATH, Config, ConfigError, load_config
from resilient_slurm.events import EventKind, HookNote
from resilient_slurm.healthcheck.exits import EXIT_USAGE, render
from resilient_slurm.hooks import runner
from resilient_slurm.hooks.config import HooksConfig  # noqa: F401 - registers [hooks]
from resilient_slurm.hooks.context import ContextError, HookContext, from_env
from resilient_slurm.hooks.exits import EXIT_HOOK_ERROR, HOOK_EXITS

if TYPE_CHECKING:  # the health engine is imported only when a hook runs checks
    from resilient_slurm.healthcheck.model import Report
    from resilient_slurm.healthcheck.seams import Hardware

# What a hook does once its context is read: returns the hook's exit status.
HookBody = Callable[[Config, HookContext, runner.SafeEvents], int]


def _parse(prog: str, argv: Sequence[str] | None, about: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=about, epilog=render(HOOK_EXITS),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=f"config file (default: {DEFAULT_PATH})")
    parser.add_argument("--node", help="node name (default: $SLURMD_NODENAME)")
    parser.add_argument("--version", action="version", version=f"{prog} {__version__}")
    return parser.parse_args(argv)


def check_config_file(path: str) -> None:
    """The config root reads: owned by root or us, not writable by group or others, not a
    symlink (ConfigError naming the file otherwise)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return  # the default file may be absent: defaults apply
    except OSError as exc:
        raise ConfigError("", f"config file {path}: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (0, os.geteuid()):
            raise ConfigError("", f"config file {path}: a symlink owned by uid {st.st_uid}")
        st = os.stat(path)
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError("", f"config file {path}: owned by uid {st.st_uid}, must be root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError("", f"config file {path}: writable by group or others "
                          f"(mode {stat.S_IMODE(st.st_mode):o}); chmod go-w")


def _setup(prog: str, argv: Sequence[str] | None, about: str) -> tuple[Config, HookContext]:
    args = _parse(prog, argv, about)
    ctx = from_env(os.environ, node=args.node)
    path = args.config or DEFAULT_PATH
    check_config_file(path)
    config = runner.for_node(load_config(path, env={}), ctx.node)
    runner.ensure_state_dir(config)
    return config, ctx


def guarded(source: str, argv: Sequence[str] | None, about: str, body: HookBody,
            hardware: Hardware | None = None) -> int:
    """Run ``body`` as hook ``source``: parse ``argv``, read the config and Slurm's context,
    then the body with every check on ``hardware`` (default: this machine's; another one is
    passed only by a caller outside the product, as the lab's hook wrappers do)."""
    try:
        config, ctx = _setup(f"resilient-{source}", argv, about)
    except (ConfigError, ContextError) as exc:
        print(f"resilient-{source}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"resilient-{source}: state directory: {exc}", file=sys.stderr)
        return EXIT_HOOK_ERROR
    events = runner.event_log(config, source, ctx)
    try:
        with _on(hardware):
            status = int(body(config, ctx, events))
    except ConfigError as exc:  # e.g. a scenario or profile named by the config is bad
        events.emit(EventKind.HOOK_ERROR, **HookNote(cause=str(exc)))
        print(f"resilient-{source}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if _ABANDONED:
        # A data source (e.g. NVML) is still wedged in a thread: leave without joining it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


_ABANDONED: list[str] = []


def _on(hardware: Hardware | None) -> contextlib.AbstractContextManager[None]:
    """The run's hardware (``healthcheck/seams.py``'s ``using``); nothing imported for the
    default, this machine."""
    if hardware is None:
        return contextlib.nullcontext()
    from resilient_slurm.healthcheck.seams import using

    return using(hardware)


def check(config: Config, ctx: HookContext, check_set: str, budget: float,
          **kwargs: Any) -> Report:
    from resilient_slurm.healthcheck.seams import check_node

    report = check_node(runner.with_budget(config, budget), check_set=check_set, node=ctx.node,
                        **kwargs)
    _ABANDONED.extend(getattr(report, "abandoned", None) or [])
    return report


def job_file(config: Config, ctx: HookContext) -> str | None:
    if ctx.job_id is None:
        return None
    return runner.state_path(config, os.path.join("jobs", f"{ctx.job_id}.json"))


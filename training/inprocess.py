"""In-process restart (level 0): re-enter the training function in the live process.

NVRx's ``inprocess.Wrapper`` restarts a function on every healthy rank after an exception, a
hang or the death of a rank, without new processes: only the process group is rebuilt. This
module makes it work on CPU/gloo and keeps the state that must survive::

    from resilient_slurm.training import inprocess

    def train(ctx: inprocess.Context) -> str:   # called again after every fault
        ctx.init_process_group()                # per iteration, on this iteration's store prefix
        model, optim = build(ctx.rank, ctx.world_size)   # rebuilt per iteration
        got = ctx.memory.restore(model, optim)  # memory tiers' snapshot (or None: disk / fresh)
        for step in range(start, steps + 1):
            ...
            ctx.completed(step, model, optim, extra={"rng": ...})  # memory tiers
        return digest

    result = inprocess.run(train, inprocess.InprocessSettings.from_env())

What it adds to stock NVRx 0.4.1 (each measured on this machine, see FINDINGS.md):

* **gloo abort** (with the waker, in ``resilient_slurm.training.gloo_abort``): gloo cannot
  abort a pending collective. :class:`SocketAbort` shuts down
  (``SHUT_RDWR``) the TCP sockets the process group opened (recorded around
  ``init_process_group``: no other socket of the process, NCCL's or the user's), never a
  listening one (that aborts the process), so a pending collective fails at once.
* **waking a rank asleep in a syscall**: the asynchronous ``RankShouldRestart`` is delivered
  only when the main thread runs bytecode. From the abort until finalize, a thread sends the
  main thread ``SIGURG`` (a no-op Python handler) every 50 ms, so ``time.sleep`` or a blocking
  read returns into the interpreter.
* **imports never interrupted**: a restart waits for a first import (``import_guard``).
* **stores outside the ranks**: the Wrapper's store and the app store are clients of a
  ``TCPStore`` hosted by the launcher (``resilient-inprocess-store``), under a prefix per
  launch, so the death of rank 0 does not take them down.
* **timings**: monitor process interval 0.2 s with progress watchdog 1 s (the monitor skips
  its timeout checks when a timestamp arrives). The Wrapper's timeouts (soft, hard, heartbeat,
  barrier, completion) are NVRx's own unless set (:class:`InprocessSettings`, the environment:
  ``training/inprocess_timeouts.py``).

This module must not use ``from __future__ import annotations``: the Wrapper finds the
``CallWrapper`` parameter of the wrapped function by its annotation, which must be a class
(tests/training/test_inprocess_annotations.py guards it).
"""

import dataclasses
import datetime
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess as nvrx

from resilient_slurm.checkpoint import peers
from resilient_slurm.fatal import EXIT_CONFIG, ConfigurationError
from resilient_slurm.training import inprocess_timeouts as ip_timeouts
from resilient_slurm.training import nccl_requirements
from resilient_slurm.training.gloo_abort import SocketAbort, Waker
from resilient_slurm.training.import_guard import ImportGuard
from resilient_slurm.training.memstate import MemoryState

STORE_ENV = "RESILIENT_INPROCESS_STORE"  # host:port of the store the launcher hosts
PREFIX_ENV = "RESILIENT_INPROCESS_PREFIX"  # one namespace per launch (level-1 restart)
MIN_WORLD_ENV = "RESILIENT_INPROCESS_MIN_WORLD"  # fewer ranks: leave it to the level above
ACTIVE_WORLD_ENV = "RESILIENT_INPROCESS_ACTIVE_WORLD"  # ranks beyond it stand by (hot spares)
EXIT_BELOW_MIN = 75  # a rank left alone below the minimum exits with this code
LOG_ENV = "RESILIENT_INPROCESS_LOG"  # monitor process log path, may contain {rank}
log = logging.getLogger(__name__)


@dataclasses.dataclass
class InprocessSettings:
    """In-process restart knobs (seconds). ``store`` is ``host:port`` of an external store."""

    store: str
    prefix: str = "ip"
    # NVRx's Wrapper timeouts: None is NVRx's own default (training/inprocess_timeouts.py)
    soft_timeout: float | None = None
    hard_timeout: float | None = None
    heartbeat_timeout: float | None = None
    barrier_timeout: float | None = None
    completion_timeout: float | None = None
    monitor_process_interval: float = 0.2
    progress_watchdog_interval: float = 1.0
    monitor_thread_interval: float = 1.0
    last_call_wait: float = 0.1
    heartbeat_interval: float = 1.0
    pg_timeout: float = 60.0
    peer_every: int = 1
    min_world: int = 1
    active_world: int = 0  # 0: every rank trains; N: ranks N.. stand by and fill a gap
    wake_interval: float = 0.05
    max_iterations: int = 20
    logfile: str | None = None  # monitor process log, may contain {rank}

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> "InprocessSettings":
        """From the environment (module constants, ``RESILIENT_INPROCESS_<NAME>_TIMEOUT``);
        ``overrides`` not None win. ValueError for a missing store or a bad value."""
        env = dict(os.environ) if env is None else env
        overrides = {k: v for k, v in overrides.items() if v is not None}
        for name, value in ip_timeouts.from_env(env).items():
            overrides.setdefault(name, value)
        store = overrides.pop("store", None) or env.get(STORE_ENV)
        if not store:
            raise ValueError(f"in-process restart needs an external store: set {STORE_ENV}="
                             "host:port (resilient-launch --inprocess hosts one)")
        # ft_launcher gives each rendezvous round a fresh MASTER_PORT: a fresh namespace
        prefix = overrides.pop("prefix", None) or env.get(PREFIX_ENV) or (
            f"ip-{env.get('TORCHELASTIC_RUN_ID', 'run')}-{env.get('MASTER_ADDR', 'local')}-"
            f"{env.get('MASTER_PORT', '0')}")
        overrides.setdefault("logfile", env.get(LOG_ENV) or None)
        if env.get(MIN_WORLD_ENV, "").isdigit():
            overrides.setdefault("min_world", int(env[MIN_WORLD_ENV]))
        if env.get(ACTIVE_WORLD_ENV, "").isdigit():
            overrides.setdefault("active_world", int(env[ACTIVE_WORLD_ENV]))
        return cls(store=store, prefix=prefix, **overrides)

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.store.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad store address {self.store!r}: expected host:port")
        return host, int(port)

    def given_timeouts(self) -> dict[str, float | None]:
        return {n: getattr(self, n) for n in ip_timeouts.NAMES}

    def timeouts(self) -> dict[str, float]:
        """The Wrapper's timeouts in force: the ones set here, else the installed NVRx's."""
        return ip_timeouts.effective(self.given_timeouts(), ip_timeouts.installed_defaults())

    def check(self) -> None:
        ip_timeouts.check(self.timeouts())
        if self.peer_every not in (0, 1):
            raise ValueError("peer_every must be 0 (no peer node's copy) or 1 (a copy of "
                             "every snapshot on the peer node)")
        if self.active_world < 0 or 0 < self.active_world < self.min_world:
            raise ValueError(f"active_world {self.active_world} must be 0 (every rank trains) "
                             f"or at least min_world {self.min_world}")

    def rank_assignment(self) -> Any:
        """NVRx's rank assignment: by default the survivors shift down (the world shrinks);
        with ``active_world`` N, ranks N and up stand by (inactive, torch imported, waiting
        in the Wrapper) and a standby takes a lost rank's place (FillGaps: the survivors keep
        their ranks, the world stays N while standbys last, then shrinks)."""
        ra = nvrx.rank_assignment
        if not self.active_world:
            return nvrx.Compose(ra.ActivateAllRanks(), ra.ShiftRanks())
        return nvrx.Compose(ra.MaxActiveWorldSize(self.active_world), ra.FillGaps())


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


class ExternalStore(torch.distributed.PrefixStore, nvrx.store.StoreMixin):
    """The Wrapper's store: a client of a TCPStore hosted outside the ranks, under a prefix.
    No rank is critical (stock NVRx makes rank 0 host it and wait for everyone at exit)."""

    def __init__(self, host_name: str, port: int, prefix: str, timeout_s: float = 60.0):
        self._client = torch.distributed.TCPStore(host_name, port, is_master=False,
                                                  timeout=_td(timeout_s))
        super().__init__(f"{prefix}/wrapper/", self._client)

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return ()


def _trace(what: str) -> None:
    if os.environ.get("RESILIENT_INPROCESS_TRACE"):
        print(f"[inprocess {time.time():.3f}] {what}", flush=True)


class _Abort(nvrx.abort.Abort):
    def __init__(self, sockets: SocketAbort, waker: Waker) -> None:
        self.sockets, self.waker = sockets, waker

    def __call__(self, state: Any) -> Any:
        _trace("abort")
        self.waker.start()
        n = self.sockets.shutdown()
        log.info("abort: shut down %d process-group sockets", n)
        if torch.cuda.is_available():  # NCCL has a real abort
            nvrx.abort.AbortTorchDistributed()(state)
        return state


class _Finalize(nvrx.finalize.Finalize):
    def __init__(self, waker: Waker) -> None:
        self.waker = waker

    def __call__(self, state: Any) -> Any:
        _trace("finalize")
        self.waker.stop()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:  # its sockets are already shut: teardown may complain
                log.info("destroy_process_group after abort: %s", exc)
        return state


class _Kept:
    """What survives a restart besides the user's own objects."""

    def __init__(self, settings: InprocessSettings) -> None:
        self.settings = settings
        self.memory = MemoryState(settings.peer_every)
        self.sockets = SocketAbort()
        self.imports = ImportGuard()
        self.app_client: torch.distributed.Store | None = None


@dataclasses.dataclass
class Context:
    """What the training function gets on each (re-)entry."""

    rank: int
    world_size: int
    initial_rank: int
    initial_world_size: int
    iteration: int
    lost: list[int]  # initial ranks no longer active (killed or shrunk away)
    standby: list[int]  # initial ranks standing by (InprocessSettings.active_world), not training
    store: torch.distributed.Store  # the app store, under this iteration's prefix
    job_store: torch.distributed.Store  # the app store, one prefix for the launch's life
    memory: MemoryState
    call: Any  # NVRx CallWrapper: ping(), atomic()
    _kept: _Kept

    def init_process_group(self, backend: str | None = None) -> None:
        """Create this iteration's process group on the app store (sockets recorded)."""
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self._kept.sockets.forget()
        self.memory.new_group()
        with self._kept.sockets.recording() if backend == "gloo" else nullcontext():
            dist.init_process_group(backend,
                                    store=torch.distributed.PrefixStore("pg/", self.store),
                                    rank=self.rank, world_size=self.world_size,
                                    timeout=_td(self._kept.settings.pg_timeout))

    def completed(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  extra: dict[str, Any] | None = None) -> None:
        """After ``step`` completed on this rank: snapshot it into the memory tiers (node
        memory, and the peer node's copy), written in the background."""
        self.memory.record(step, self.world_size, self.rank, model, optimizer, extra)

    def ping(self) -> None:
        self.call.ping()

    def nodes_of(self, initial_ranks: list[int]) -> list[str]:
        """The node each initial rank ran on (recorded by :func:`run` before the first
        iteration; "" for a rank that never recorded one), without waiting for missing keys."""
        out = []
        for r in initial_ranks:
            key = f"{NODE_KEY}/{r}"
            out.append(self.job_store.get(key).decode()
                       if self.job_store.check([key]) else "")
        return out

    @contextmanager
    def atomic(self) -> Iterator[None]:
        with self.call.atomic():
            yield


TrainFn = Callable[[Context], Any]


def _iteration(call: nvrx.CallWrapper, fn, kept):  # type: ignore[no-untyped-def]
    """The function the Wrapper re-enters (``fn`` a :data:`TrainFn`, ``kept`` a
    :class:`_Kept`). The Wrapper checks every parameter's annotation with ``issubclass``: the
    ``call`` annotation must be the class itself and the others must stay unannotated (a
    string, a generic such as ``Callable[...]`` or ``object`` would break or match)."""
    state = call.state
    _trace(f"iteration {state.iteration}")
    kept.app_client = kept.app_client or _app_client(kept.settings)
    present = _initial_ranks(call, 0, state.world_size)
    lost = sorted(set(range(state.initial_world_size)) - present)
    standby = sorted(_initial_ranks(call, state.active_world_size, state.world_size))
    ctx = Context(rank=state.active_rank, world_size=state.active_world_size,
                  initial_rank=state.initial_rank, initial_world_size=state.initial_world_size,
                  iteration=state.iteration, lost=lost, standby=standby,
                  store=torch.distributed.PrefixStore(
                      f"{kept.settings.prefix}/app/{state.iteration}/", kept.app_client),
                  job_store=torch.distributed.PrefixStore(
                      f"{kept.settings.prefix}/job/", kept.app_client),
                  memory=kept.memory, call=call, _kept=kept)
    if state.active_world_size < kept.settings.min_world:
        print(f"[inprocess] {state.active_world_size} rank(s) left, fewer than "
              f"{kept.settings.min_world}: leaving the restart to the launcher", flush=True)
        raise SystemExit(EXIT_BELOW_MIN)
    if state.iteration >= kept.settings.max_iterations:
        print(f"[inprocess] restart limit ({kept.settings.max_iterations}) reached: leaving "
              "the restart to the launcher", flush=True)
        raise SystemExit(EXIT_BELOW_MIN)  # an Exception here would only restart again
    try:
        with kept.imports.holding(call.atomic_lock):  # a restart waits for a first import
            return fn(ctx)
    except ConfigurationError as exc:  # the same on every attempt: never re-entered
        print(f"[inprocess] configuration error, not restarted: {exc}", flush=True)
        raise SystemExit(EXIT_CONFIG) from exc


def _initial_ranks(call: Any, first: int, end: int) -> set[int]:
    """Initial ranks of this iteration's ranks ``first..end-1`` (the Wrapper's numbering: the
    active ones first, then those standing by), from the Wrapper's store."""
    state = call.state
    if first >= end:
        return set()
    try:
        store = nvrx.store.PrefixStore(state.iteration, call.base_store)
        got = store.get_initial_ranks(range(first, end))
        return {int(x) for x in got}
    except Exception:  # informational only
        return set(range(state.initial_world_size)) if first == 0 else set()


def _app_client(settings: InprocessSettings) -> torch.distributed.Store:
    host, port = settings.host_port()
    return torch.distributed.TCPStore(host, port, is_master=False,
                                      timeout=_td(settings.timeouts()["barrier_timeout"]))


NODE_KEY = "node"  # job store: node/<initial rank> -> the node's name


def _record_node(settings: InprocessSettings) -> None:
    """Record which node this rank (``RANK``, its initial rank) runs on, once per launch,
    before the Wrapper starts: a standby never enters the training function, and a lost
    rank's node is named from this record."""
    rank = os.environ.get("RANK", "")
    if not rank.isdigit():
        return
    node = peers.node_name()
    client = _app_client(settings)
    torch.distributed.PrefixStore(f"{settings.prefix}/job/", client).set(
        f"{NODE_KEY}/{rank}", node)
    del client


def wrapper(settings: InprocessSettings, waker: Waker, sockets: SocketAbort) -> Any:
    host, port = settings.host_port()
    return nvrx.Wrapper(
        store_factory=ExternalStore,
        store_kwargs={"host_name": host, "port": port, "prefix": settings.prefix},
        abort=_Abort(sockets, waker),
        finalize=_Finalize(waker),
        monitor_thread_interval=_td(settings.monitor_thread_interval),
        monitor_process_interval=_td(settings.monitor_process_interval),
        progress_watchdog_interval=_td(settings.progress_watchdog_interval),
        heartbeat_interval=_td(settings.heartbeat_interval),
        **{n: _td(v) for n, v in settings.given_timeouts().items() if v is not None},
        last_call_wait=_td(settings.last_call_wait),
        monitor_process_logfile=settings.logfile,
        rank_assignment=settings.rank_assignment(),
    )


RequirementError = nccl_requirements.RequirementError
check_requirements = nccl_requirements.enforce


def run(fn: TrainFn, settings: InprocessSettings) -> Any:
    """Run ``fn(ctx)`` under in-process restart on every rank (RANK, WORLD_SIZE set); returns
    its value on ranks active at the end, None on ranks left inactive. Call from the main
    thread, before any process group exists. :class:`RequirementError` when NVRx's NCCL
    requirements are not met where CUDA runs (:func:`check_requirements`)."""
    settings.check()
    check_requirements()
    if os.environ.get("RESILIENT_INPROCESS_TRACE") == "debug":
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
    kept = _Kept(settings)
    _record_node(settings)
    waker = Waker(settings.wake_interval)
    wrapped = wrapper(settings, waker, kept.sockets)(_iteration)
    # The Wrapper runs `while gc.collect()` before each restart: with torch imported a full
    # collection took 0.6-0.9 s here. Objects alive now (modules, classes) are never garbage:
    # freeze them out of the collector's scans.
    gc.freeze()
    try:
        result = wrapped(None, fn, kept)
        # Let the monitor process see its stop flag before this process exits; else it may
        # report the exit as a terminated rank and interrupt ranks still leaving.
        time.sleep(2 * settings.monitor_process_interval)
        return result
    finally:
        waker.stop()
        gc.unfreeze()

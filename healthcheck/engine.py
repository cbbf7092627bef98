"""The engine: gather once (each source in its own daemon thread), evaluate many, report.

``run_checks`` returns within ``health.watchdog_s`` whatever the hardware or tools do: every
gatherer runs in a daemon thread with its own timeout bounded by the watchdog; a gatherer
that has not finished by the deadline turns its checks ``unknown`` (``WATCHDOG``), and its
thread is abandoned (``Report.abandoned``), which does not keep the process alive.

Check sets: ``prolog`` (fast, scoped to ``gpu_indices``), ``periodic`` (HealthCheckProgram),
``epilog`` (Xids since ``since_position`` plus what a job leaves behind). ``gpu_indices`` scopes
the NVML checks and ``dcgmi diag`` (``-i``); None: every GPU.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from resilient_slurm import fsutil, proc
from resilient_slurm.config import Config, ConfigError

from . import checks_fabric as cf
from . import checks_gpu as cg
from . import checks_log as cl
from . import checks_net as _net  # noqa: F401 - declares efa, infiniband
from . import checks_rates as cr
from . import tools
from . import validate_checks as vc
from .gpu import GpuSnapshot, gather_gpus
from .klog.sources import LogRead, PositionStore, norm_pci, safe_read
from .model import FAIL, OK, UNKNOWN, WARN, Report, Result
from .policy import generation_of, load_policy
from .profiles import Selection, select_profile
from .registry import REGISTRY, SET_NAMES, RunContext
from .sysfs import nvidia_pci_devices, read_rdma
from .xid.history import AppXidHistory

if TYPE_CHECKING:  # built by the set-up (.seams.seams_for), which imports the engine
    from .seam_value import Seams

# Derived from the declarations beside each evaluator (registry.declare): check -> (gatherer,
# NVML fields it needs), and the checks of each set in declaration order.
# One order whatever imported the check modules first (a run's results, and so the first
# failing result a drain reason names, follow it): by module, then as declared.
_MODULE_ORDER = ("checks_fabric", "checks_gpu", "checks_log", "checks_net", "checks_rates",
                 "tools", "validate_checks")
_ORDERED = sorted(REGISTRY.values(), key=lambda d: _MODULE_ORDER.index(
    d.evaluate.__module__.rsplit(".", 1)[-1]))
CHECKS: dict[str, tuple[str, tuple[str, ...]]] = {
    d.name: (d.source, d.fields) for d in _ORDERED}
CHECK_SETS: dict[str, list[str]] = {
    s: [d.name for d in _ORDERED if s in d.sets] for s in SET_NAMES}
WATCHDOG_MARGIN_S = 0.3  # evaluation and output after the deadline
TOOL_MARGIN_S = 0.25  # a tool's kill lands this long before the gather deadline


@dataclass
class _Gathered:
    values: dict[str, Any] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)


def _tool(argv: list[str], timeout: float, seams: Seams) -> proc.Outcome:
    env = dict(os.environ)
    env["PATH"] = seams.tool_path
    return proc.run(argv, timeout, env=env, search_path=seams.tool_path)


def select_checks(config: Config, check_set: str, only: list[str] | None) -> list[str]:
    if check_set not in CHECK_SETS:
        raise ConfigError("check_set", f"unknown check set {check_set!r} "
                          f"(known: {', '.join(CHECK_SETS)})")
    names = list(only) if only else list(CHECK_SETS[check_set])
    for n in names:
        if n not in CHECKS:
            raise ConfigError("--only", f"unknown check {n!r} (known: {', '.join(CHECKS)})")
    for n in config.health.checks:
        if n not in CHECKS:
            raise ConfigError(f"health.checks.{n}", f"unknown check (known: {', '.join(CHECKS)})")
    return names


def run_checks(seams: Seams, *, check_set: str = "periodic", only: list[str] | None = None,
               profile: str | None = None, node: str, gpu_indices: list[int] | None = None,
               since_position: dict[str, Any] | None = None,
               started: float | None = None, advance: bool = True) -> Report:
    """Run a check set on ``node`` through ``seams`` (:func:`.seams.seams_for`: real or
    simulated is decided there, by the hardware it was given, never here) and return the
    :class:`Report` (never raises for hardware; raises :class:`ConfigError` for bad
    configuration or arguments). The config is ``seams.config``.

    Returns within ``health.watchdog_s`` of ``started`` (a ``time.monotonic()`` value; default
    now): a CLI passes its process start so the whole command keeps the budget.
    ``advance=False`` (a manual ``resilient-health check``) reads from the saved kernel-log
    position but never moves it (nor the app-Xid history): the hooks still see what it saw.
    """
    start = time.monotonic()
    config = seams.config
    cfg = config.health
    t0 = min(start, started) if started is not None else start
    deadline = max(start + 0.5, t0 + cfg.watchdog_s - WATCHDOG_MARGIN_S)
    names = select_checks(config, check_set, only)
    sel = select_profile(cfg, node, profile, seams.profile)
    report = Report(node=node, simulated=seams.simulated, profile=sel.name,
                    check_set=check_set)
    enabled = [n for n in names if cfg.checks.get(n) is None or cfg.checks[n].enabled]
    for n in names:
        if n not in enabled:
            report.results.append(Result(n, OK, "DISABLED", f"disabled by config "
                                         f"health.checks.{n}.enabled"))
    if seams.setup_error:  # e.g. no space for the simulated tree: nothing vouches
        report.results += [Result(n, UNKNOWN, "SETUP_ERROR", seams.setup_error)
                           for n in enabled]
    else:
        _run(config, seams, sel, enabled, report, deadline, gpu_indices, since_position,
             advance)
    report.results.insert(0, sel.result(node, cfg.allow_unmatched_profile))
    report.duration_s = time.monotonic() - start
    return report


def _gatherers(config: Config, seams: Seams, sel: Selection, names: list[str],
               gpu_indices: list[int] | None, after: dict[str, Any] | None,
               deadline: float) -> dict[str, Callable[[], Any]]:
    cfg = config.health
    wanted = {CHECKS[n][0] for n in names}
    fields = {f for n in names for f in CHECKS[n][1]}

    def left(limit: float) -> float:
        # Tools time out (and their process groups die) just before the engine stops waiting.
        return max(0.1, min(limit, deadline - TOOL_MARGIN_S - time.monotonic()))

    def storage() -> list[tuple[str, proc.Outcome]]:
        return [(p, proc.run(tools.storage_argv(p, cfg.storage_require_mount),
                             left(cfg.storage_timeout_s))) for p in cfg.storage_paths]

    level = cfg.dcgm_diag_level
    # A hook scoped to a job diagnoses the job's GPUs only (others' jobs may own the rest).
    diag_scope = ["-i", ",".join(str(i) for i in gpu_indices)] if gpu_indices else []
    table: dict[str, Callable[[], Any]] = {
        "nvml": lambda: gather_gpus(seams.gpu, left(cfg.nvml_timeout_s), indices=gpu_indices,
                                    fields=fields),
        "kernlog": lambda: safe_read(seams.klog, after, left(cfg.kernel_log_timeout_s),
                                     seams.klog_gap),
        "rdma": lambda: read_rdma(seams.sysfs_root),
        "fi_info": lambda: _tool(["fi_info", "-p", "efa"], left(cfg.tool_timeout_s), seams),
        "dcgm_diag": lambda: _tool(["dcgmi", "diag", "-r", str(level), "-j", *diag_scope],
                                   left(cfg.dcgm_diag_timeout_s), seams),
        "dcgm_health": lambda: _dcgm_health(seams, left, cfg.tool_timeout_s),
        "storage": storage,
        "allreduce": lambda: _allreduce(seams, sel, left, cfg.validate_timeout_s),
        "loopback": lambda: _loopback(seams, sel, left, cfg.validate_timeout_s),
        "services": lambda: {u: _tool(cf.probe_argv(u), left(cfg.tool_timeout_s), seams)
                             for u in cf.units_for(sel.spec)},
    }
    return {k: v for k, v in table.items() if k in wanted}


def _allreduce(seams: Seams, sel: Selection, left: Callable[[float], float],
               timeout: float) -> vc.Probe:
    """nccl-tests' all_reduce_perf on every GPU; without it, the torch.distributed probe (a
    separate interpreter: this process never imports torch)."""
    out = _tool(vc.allreduce_argv(sel.spec.gpus), left(timeout), seams)
    if out.kind != proc.MISSING:
        return vc.Probe("all_reduce_perf", out)
    import sys

    argv = [sys.executable, "-m", "resilient_slurm.training.allreduce_probe",
            "--gpus", str(max(1, sel.spec.gpus))]
    return vc.Probe("torch all-reduce probe", _tool(argv, left(timeout), seams))


def _loopback(seams: Seams, sel: Selection, left: Callable[[float], float],
              timeout: float) -> vc.Probe | None:
    """The fabric's loopback test: the server in the background, then the client."""
    plan = vc.loopback_argvs(sel.spec)
    if plan is None:
        return None
    tool, server, client = plan
    env = dict(os.environ)
    env["PATH"] = seams.tool_path
    with proc.background(list(server), env=env, search_path=seams.tool_path) as started:
        if started is not None:
            return vc.Probe(tool, started)  # the server could not start: that outcome
        time.sleep(0.5)  # let it listen
        return vc.Probe(tool, _tool(list(client), left(timeout), seams))


def _dcgm_health(seams: Seams, left: Callable[[float], float],
                 timeout: float = 15.0) -> tuple[proc.Outcome, proc.Outcome | None]:
    """``dcgmi health -c``; if the host engine has no watches yet, set them (``-s a``)."""
    check = _tool(["dcgmi", "health", "-g", "0", "-c", "-j"], left(timeout), seams)
    if tools.watches_missing(check):
        return check, _tool(["dcgmi", "health", "-g", "0", "-s", "a"], left(timeout), seams)
    return check, None


def _run(config: Config, seams: Seams, sel: Selection, names: list[str], report: Report,
         deadline: float, gpu_indices: list[int] | None,
         since_position: dict[str, Any] | None, advance: bool = True) -> None:
    uses_log = any(CHECKS[n][0] == "kernlog" for n in names)
    store = PositionStore(seams.state_dir) if uses_log and since_position is None else None
    after, history = since_position, AppXidHistory(seams.state_dir if store else None)
    distrust = ""
    if store is not None and store.path:
        try:  # written atomically: read without the lock (held only to save, below)
            after, distrust = store.load(seams.klog.boot_id())
        except (OSError, ValueError) as exc:
            after, distrust = None, f"saved kernel-log position unreadable: {exc}"
    gathered = _gather(_gatherers(config, seams, sel, names, gpu_indices, after, deadline),
                       deadline, report)
    read = gathered.values.get("kernlog")
    if isinstance(read, LogRead) and distrust and not read.error:
        read.untrusted = read.untrusted or distrust  # the window was read again: say so
    report.results += _evaluate(config, seams, sel, names, gathered, gpu_indices, history)
    if not isinstance(read, LogRead) or read.error:
        return
    report.kernel_position = read.position  # where the log stood after this run (boot id too)
    if store is None or not store.path or not advance:
        return
    wait = max(0.1, min(5.0, 0.25 * (deadline - time.monotonic())))
    try:
        with contextlib.ExitStack() as stack:
            fsutil.private_dir(os.path.dirname(store.path))  # never through a planted symlink
            stack.enter_context(fsutil.locked(store.path + ".lock", timeout=wait))
            store.save(read.position)
            history.save()
    except (OSError, TimeoutError) as exc:
        # Not advanced: a line may be reported twice, never skipped.
        report.results.append(Result("xid", WARN, "STATE_UNAVAILABLE", "could not save the "
                                     f"kernel-log position: {exc}", str(store.path)))


def _gather(table: dict[str, Callable[[], Any]], deadline: float, report: Report) -> _Gathered:
    out = _Gathered()
    threads: dict[str, threading.Thread] = {}

    def runner(name: str, fn: Callable[[], Any]) -> None:
        t0 = time.monotonic()
        try:
            out.values[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a broken gatherer fails its checks closed
            out.values[name] = exc
        out.durations[name] = time.monotonic() - t0

    for name, fn in table.items():
        t = threading.Thread(target=runner, args=(name, fn), name=f"rhc-{name}", daemon=True)
        threads[name] = t
        t.start()
    for t in threads.values():
        t.join(max(0.0, deadline - time.monotonic()))
    done = _Gathered()
    for name, t in threads.items():
        if t.is_alive():
            report.abandoned.append(name)  # its checks become WATCHDOG, even if it ends now
        else:
            done.values[name] = out.values[name]
            done.durations[name] = out.durations[name]
    return done


def _pci_map(snap: Any, sel: Selection,
             sysfs_root: str) -> tuple[dict[str, tuple[int, str]], str]:
    """PCI address -> (NVML index, generation), from NVML, else from sysfs bus order.

    The generation NVML reports (architecture, name) picks a GPU's Xid column; the profile's
    ``gpu_generation`` is used only where NVML cannot say (unusable, or an unknown part). A
    profile that disagrees with NVML is reported by ``gpu_count`` (``GPU_GENERATION``)."""
    default = sel.spec.gpu_generation
    mapping: dict[str, tuple[int, str]] = {}
    if not (isinstance(snap, GpuSnapshot) and snap.usable):
        for i, pci in enumerate(nvidia_pci_devices(sysfs_root)):
            mapping[norm_pci(pci)] = (i, default)
    if isinstance(snap, GpuSnapshot) and snap.usable:
        gens = set()
        for g in snap.gpus:
            gen = generation_of(g.name, g.architecture) or sel.spec.gpu_generation
            gens.add(gen)
            if g.pci:
                mapping[norm_pci(g.pci)] = (g.index, gen)
        if len(gens) == 1:
            default = gens.pop() or default
    return mapping, default


def _evaluate(config: Config, seams: Seams, sel: Selection, names: list[str],
              gathered: _Gathered, gpu_indices: list[int] | None,
              history: AppXidHistory | None = None) -> list[Result]:
    cfg, prof = config.health, sel.spec
    gctx = cg.GpuContext(cfg, prof, cr.RateHistory(seams.state_dir)
                         if "error_rates" in names else None)
    policies: dict[str, Any] = {}

    def policy_for(gen: str) -> Any:
        if gen not in policies:
            policies[gen] = load_policy(gen, cfg)
        return policies[gen]

    pci, default_gen = _pci_map(gathered.values.get("nvml"), sel, seams.sysfs_root)
    lctx = cl.LogContext(cfg, policy_for, pci, default_gen)
    if history is not None:
        lctx.app_history = history.recent(cfg.xid_repeat_window_s)
    contexts = {"gpu": gctx, "log": lctx, "profile": prof, "run": RunContext(cfg, prof)}
    results: list[Result] = []
    for name in names:
        source = CHECKS[name][0]
        t0 = time.monotonic()
        if source not in gathered.values:
            found = [Result(name, UNKNOWN, "WATCHDOG", f"{source} did not finish within the "
                            f"watchdog ({cfg.watchdog_s:g}s)", source)]
        else:
            value = gathered.values[source]
            try:
                if isinstance(value, Exception):
                    raise value
                decl = REGISTRY[name]
                found = decl.evaluate(value, contexts[decl.context])
            except Exception as exc:  # noqa: BLE001 - a check that crashes fails closed
                found = [Result(name, UNKNOWN, "CHECK_ERROR", f"{name} could not evaluate: "
                                f"{type(exc).__name__}: {exc}"[:300], source)]
        spent = gathered.durations.get(source, 0.0) + (time.monotonic() - t0)
        for r in found:
            r.duration_s = spent
        results.extend(found)
    if history is not None:
        history.add(lctx.app_seen)
    if gctx.rates is not None:
        try:
            gctx.rates.save()
        except OSError as exc:  # the next run judges from older samples: said, not fatal
            results.append(Result("error_rates", WARN, "STATE_UNAVAILABLE", "could not save "
                                  f"the error-counter samples: {exc}", str(gctx.rates.path)))
    return results


__all__ = ["CHECKS", "CHECK_SETS", "FAIL", "Report", "Result", "run_checks", "select_checks"]

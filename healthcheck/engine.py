"""The engine: gather once (each source in its own daemon thread), evaluate many, report.

``run_checks`` returns within ``health.watchdog_s`` whatever the hardware or tools do: every
gatherer runs in a daemon thread with its own timeout bounded by the watchdog; a gatherer
that has not finished by the deadline turns its checks ``unknown`` (``WATCHDOG``), and its
thread is abandoned (``Report.abandoned``), which does not keep the process alive.

Check sets: ``prolog`` (fast, scoped to ``gpu_indices``), ``periodic`` (HealthCheckProgram),
``epilog`` (Xids since ``since_position`` plus what a job leaves behind).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from resilient_slurm import fsutil, proc
from resilient_slurm.config import Config, ConfigError

from . import checks_gpu as cg
from . import checks_log as cl
from . import checks_net as cn
from . import tools
from .gpu import GpuBackend, GpuSnapshot, gather_gpus
from .kernlog import KernelLogSource, LogRead, PositionStore, norm_pci, real_source, safe_read
from .model import FAIL, OK, UNKNOWN, WARN, Report, Result
from .policy import generation_of, load_policy
from .profiles import Selection, select_profile
from .simulate import Scenario, default_node, resolve_scenario
from .sysfs import nvidia_pci_devices, read_rdma

# check -> (gatherer, NVML fields it needs)
CHECKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gpu_count": ("nvml", ()), "ecc": ("nvml", ("ecc",)),
    "row_remap": ("nvml", ("remapped_rows",)), "retired_pages": ("nvml", ("retired_pages",)),
    "clocks": ("nvml", ("clock_reasons",)), "temperature": ("nvml", ("temperature",)),
    "nvlink": ("nvml", ("nvlink",)), "pcie": ("nvml", ("pcie", "clock_reasons")),
    "fabric": ("nvml", ("fabric",)), "recovery_action": ("nvml", ("recovery_action",)),
    "gpu_procs": ("nvml", ("processes",)), "gpu_memory": ("nvml", ("memory",)),
    "xid": ("kernlog", ()), "sxid": ("kernlog", ()), "efa_driver": ("kernlog", ()),
    "efa": ("rdma", ()), "infiniband": ("rdma", ()), "fi_info": ("fi_info", ()),
    "dcgm_diag": ("dcgm_diag", ()), "dcgm_health": ("dcgm_health", ()),
    "storage": ("storage", ()),
}
_CORE = ["gpu_count", "ecc", "row_remap", "recovery_action", "xid", "sxid", "efa_driver"]
CHECK_SETS: dict[str, list[str]] = {
    "prolog": _CORE + ["fabric", "nvlink", "efa", "infiniband", "storage", "dcgm_diag"],
    "periodic": _CORE + ["retired_pages", "clocks", "temperature", "nvlink", "pcie", "fabric",
                         "efa", "infiniband", "fi_info", "dcgm_health", "storage"],
    "epilog": _CORE + ["gpu_procs", "gpu_memory"],
}
WATCHDOG_MARGIN_S = 0.3  # evaluation and output after the deadline
TOOL_MARGIN_S = 0.25  # a tool's kill lands this long before the gather deadline


@dataclass
class Seams:
    """Where this run meets the hardware (real or simulated)."""

    gpu: GpuBackend
    klog: KernelLogSource
    sysfs_root: str
    tool_path: str
    state_dir: str | None
    scenario: Scenario | None = None


@dataclass
class _Gathered:
    values: dict[str, Any] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)


def _seams(config: Config, scenario: Scenario | None) -> Seams:
    cfg = config.health
    if scenario is None:
        from .nvml import NvmlBackend

        return Seams(NvmlBackend(), real_source(config), cfg.sysfs_root, cfg.tool_path,
                     cfg.state_dir)
    sysfs_root, bindir = scenario.materialize()
    return Seams(scenario.gpu_backend(), scenario.kernel_log_source(), sysfs_root,
                 f"{bindir}:/usr/bin:/bin", scenario.state_dir, scenario)


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


def run_checks(config: Config, *, check_set: str = "periodic", only: list[str] | None = None,
               profile: str | None = None, simulate: str | None = None, node: str | None = None,
               gpu_indices: list[int] | None = None,
               since_position: dict[str, Any] | None = None,
               started: float | None = None,
               gpu_wrapper: Callable[[GpuBackend], GpuBackend] | None = None) -> Report:
    """Run a check set on this node and return the :class:`Report` (never raises for hardware;
    raises :class:`ConfigError` for bad configuration or arguments).

    Returns within ``health.watchdog_s`` of ``started`` (a ``time.monotonic()`` value; default
    now): a CLI passes its process start so the whole command keeps the budget.
    ``gpu_wrapper`` wraps the GPU backend (real or simulated): the CLI's NVML fault injection.
    """
    start = time.monotonic()
    cfg = config.health
    t0 = min(start, started) if started is not None else start
    deadline = max(start + 0.5, t0 + cfg.watchdog_s - WATCHDOG_MARGIN_S)
    node = node or default_node()
    names = select_checks(config, check_set, only)
    scenario = resolve_scenario(config, simulate, node)
    if scenario is not None:
        config = scenario.site_config(config)
        cfg = config.health
    sel = select_profile(cfg, node, profile, scenario.profile if scenario else "")
    report = Report(node=node, simulated=scenario is not None, profile=sel.name,
                    check_set=check_set)
    enabled = [n for n in names if cfg.checks.get(n) is None or cfg.checks[n].enabled]
    for n in names:
        if n not in enabled:
            report.results.append(Result(n, OK, "DISABLED", f"disabled by config "
                                         f"health.checks.{n}.enabled"))
    try:
        seams = _seams(config, scenario)
        if gpu_wrapper is not None:
            seams.gpu = gpu_wrapper(seams.gpu)
    except OSError as exc:  # e.g. no space for the simulated tree: nothing vouches
        report.results += [Result(n, UNKNOWN, "SETUP_ERROR", f"could not prepare the run: {exc}")
                           for n in enabled]
    else:
        _run(config, seams, sel, enabled, report, deadline, gpu_indices, since_position)
    report.results.insert(0, sel.result(node))
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
    table: dict[str, Callable[[], Any]] = {
        "nvml": lambda: gather_gpus(seams.gpu, left(cfg.nvml_timeout_s), indices=gpu_indices,
                                    fields=fields),
        "kernlog": lambda: safe_read(seams.klog, after, left(cfg.kernel_log_timeout_s)),
        "rdma": lambda: read_rdma(seams.sysfs_root),
        "fi_info": lambda: _tool(["fi_info", "-p", "efa"], left(cfg.tool_timeout_s), seams),
        "dcgm_diag": lambda: _tool(["dcgmi", "diag", "-r", str(level), "-j"],
                                   left(cfg.dcgm_diag_timeout_s), seams),
        "dcgm_health": lambda: _dcgm_health(seams, left, cfg.tool_timeout_s),
        "storage": storage,
    }
    return {k: v for k, v in table.items() if k in wanted}


def _dcgm_health(seams: Seams, left: Callable[[float], float],
                 timeout: float = 15.0) -> tuple[proc.Outcome, proc.Outcome | None]:
    """``dcgmi health -c``; if the host engine has no watches yet, set them (``-s a``)."""
    check = _tool(["dcgmi", "health", "-g", "0", "-c", "-j"], left(timeout), seams)
    if tools.watches_missing(check):
        return check, _tool(["dcgmi", "health", "-g", "0", "-s", "a"], left(timeout), seams)
    return check, None


def _run(config: Config, seams: Seams, sel: Selection, names: list[str], report: Report,
         deadline: float, gpu_indices: list[int] | None,
         since_position: dict[str, Any] | None) -> None:
    uses_log = any(CHECKS[n][0] == "kernlog" for n in names)
    store: PositionStore | None = None
    lock_cm: Any = None
    may_save = True
    after = since_position
    if uses_log and since_position is None:
        store = PositionStore(seams.state_dir)
        if store.path:
            try:
                wait = max(0.1, min(5.0, 0.25 * (deadline - time.monotonic())))
                lock_cm = fsutil.locked(store.path + ".lock", timeout=wait)
                lock_cm.__enter__()
            except (OSError, TimeoutError) as exc:
                # Read from the saved position (written atomically) but do not move it: a
                # line may be reported twice, never skipped.
                lock_cm, may_save = None, False
                report.results.append(Result("xid", WARN, "STATE_UNAVAILABLE", "kernel-log "
                                             f"position read but not advanced ({exc})",
                                             str(store.path)))
            try:
                after = store.load(seams.klog.boot_id())
            except (OSError, ValueError):
                after = None
    try:
        gathered = _gather(_gatherers(config, seams, sel, names, gpu_indices, after, deadline),
                           deadline, report)
        report.results += _evaluate(config, seams, sel, names, gathered, gpu_indices)
        read = gathered.values.get("kernlog")
        if isinstance(read, LogRead) and not read.error:
            # Where the log stood after this run (its boot id too), whether or not it is saved.
            report.kernel_position = read.position
        if store is not None and may_save and isinstance(read, LogRead) and not read.error:
            try:
                store.save(read.position)
            except OSError as exc:
                report.results.append(Result("xid", WARN, "STATE_UNAVAILABLE", "could not "
                                             f"save the kernel-log position: {exc}", ""))
    finally:
        if lock_cm is not None:
            lock_cm.__exit__(None, None, None)


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
    """PCI address -> (NVML index, generation), from NVML, else from sysfs bus order."""
    default = sel.spec.gpu_generation
    mapping: dict[str, tuple[int, str]] = {}
    if not (isinstance(snap, GpuSnapshot) and snap.usable):
        for i, pci in enumerate(nvidia_pci_devices(sysfs_root)):
            mapping[norm_pci(pci)] = (i, default)
    if isinstance(snap, GpuSnapshot) and snap.usable:
        gens = set()
        for g in snap.gpus:
            gen = sel.spec.gpu_generation or generation_of(g.name, g.architecture)
            gens.add(gen)
            if g.pci:
                mapping[norm_pci(g.pci)] = (g.index, gen)
        if not default and len(gens) == 1:
            default = gens.pop()
    return mapping, default


def _evaluate(config: Config, seams: Seams, sel: Selection, names: list[str],
              gathered: _Gathered, gpu_indices: list[int] | None) -> list[Result]:
    cfg, prof = config.health, sel.spec
    gctx = cg.GpuContext(cfg, prof)
    policies: dict[str, Any] = {}

    def policy_for(gen: str) -> Any:
        if gen not in policies:
            policies[gen] = load_policy(gen, cfg)
        return policies[gen]

    pci, default_gen = _pci_map(gathered.values.get("nvml"), sel, seams.sysfs_root)
    lctx = cl.LogContext(cfg, policy_for, pci, default_gen)
    evaluators: dict[str, Callable[[Any], list[Result]]] = {
        "gpu_count": lambda s: cg.evaluate_gpu_count(s, gctx),
        "ecc": lambda s: cg.evaluate_ecc(s, gctx),
        "row_remap": lambda s: cg.evaluate_row_remap(s, gctx),
        "retired_pages": lambda s: cg.evaluate_retired_pages(s, gctx),
        "clocks": lambda s: cg.evaluate_clocks(s, gctx),
        "temperature": lambda s: cg.evaluate_temperature(s, gctx),
        "nvlink": lambda s: cg.evaluate_nvlink(s, gctx),
        "pcie": lambda s: cg.evaluate_pcie(s, gctx),
        "fabric": lambda s: cg.evaluate_fabric(s, gctx),
        "recovery_action": lambda s: cg.evaluate_recovery_action(s, gctx),
        "gpu_procs": lambda s: cg.evaluate_gpu_procs(s, gctx),
        "gpu_memory": lambda s: cg.evaluate_gpu_memory(s, gctx),
        "xid": lambda r: cl.evaluate_xid(r, lctx),
        "sxid": lambda r: cl.evaluate_sxid(r, lctx),
        "efa_driver": lambda r: cl.evaluate_efa_driver(r, lctx),
        "efa": lambda inv: cn.evaluate_efa(inv, prof),
        "infiniband": lambda inv: cn.evaluate_infiniband(inv, prof),
        "fi_info": lambda o: tools.evaluate_fi_info(o, prof.require_fi_info or prof.efa > 0),
        "dcgm_diag": lambda o: tools.evaluate_dcgm_diag(o, cfg.dcgm_diag_level,
                                                        prof.require_dcgm),
        "dcgm_health": lambda o: tools.evaluate_dcgm_health(o[0], prof.require_dcgm, o[1]),
        "storage": lambda outs: [r for p, o in outs for r in tools.evaluate_storage(p, o)]
        or [Result("storage", OK, "SKIPPED", "no storage paths configured")],
    }
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
                found = evaluators[name](value)
            except Exception as exc:  # noqa: BLE001 - a check that crashes fails closed
                found = [Result(name, UNKNOWN, "CHECK_ERROR", f"{name} could not evaluate: "
                                f"{type(exc).__name__}: {exc}"[:300], source)]
        spent = gathered.durations.get(source, 0.0) + (time.monotonic() - t0)
        for r in found:
            r.duration_s = spent
        results.extend(found)
    return results


__all__ = ["CHECKS", "CHECK_SETS", "FAIL", "Report", "Result", "run_checks", "select_checks"]

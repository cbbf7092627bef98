"""``resilient-slurm install-hooks``: shims, a config skeleton, and the slurm.conf lines.

The shims (``hooks/shim.py``) are a few lines of ``/bin/sh`` that check the interpreter and
then run the hook with ``<python> -I`` (isolated: no PYTHONPATH, no user site, no current
directory on sys.path), so nothing in a job's or user's environment can change what root
executes; when the interpreter or the package is gone they drain their own node
(``rhc:HOOK_BROKEN``) and exit non-zero. ``--check`` validates an existing installation and
names what is wrong.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from resilient_slurm import fsutil, proc
from resilient_slurm.config import Config, ConfigError, load_config
from resilient_slurm.hooks import shim
from resilient_slurm.hooks.config import HooksConfig

SHIMS = {
    "prolog": ("resilient_slurm.prolog.hook", "prolog_main"),
    "epilog": ("resilient_slurm.epilog.hook", "epilog_main"),
    "healthcheck": ("resilient_slurm.hooks.health", "health_main"),
    # The node watcher: a service (docs/hooks.md), not a slurm.conf hook.
    "watch": ("resilient_slurm.hooks.watch", "watch_main"),
}

SKELETON = """\
# resilient-slurm configuration (read by the prolog, epilog and HealthCheckProgram as root).
# The root hooks read this file only (no environment); it must stay root-owned, mode 0644.

[hooks]
owner_prefix = "rhc:"          # every drain reason we write starts with it; we resume only those
resume_after = 3               # consecutive healthy health runs before we resume our own drain
reboot_enabled = false         # Xid policy "reboot" -> scontrol reboot ASAP nextstate=RESUME
slurm_conf = "{slurm_conf}"    # the HealthCheckProgram gets no SLURM_CONF: say where it is
slurm_bin_dir = "/usr/bin:/usr/local/bin:/opt/slurm/bin"
events_file = "/var/log/resilient-slurm/events.jsonl"
metrics_file = ""              # e.g. /var/lib/node_exporter/textfile/resilient.prom
verdict_file = "/var/lib/resilient-slurm/verdicts/{{node}}.json"  # read by jobs (world-readable)
prolog_epilog_timeout_s = 120  # = slurm.conf PrologEpilogTimeout: budgets must fit it
prolog_budget_s = 20
epilog_budget_s = 45
health_budget_s = 30
epilog_diag_on_failure = false # dcgmi diag -r 2 after a failed job (needs PrologEpilogTimeout)

[health]
state_dir = "/var/lib/resilient-slurm"
watchdog_s = 45
# profile = "p5.48xlarge"      # expected hardware; or match node names per profile
# allow_unmatched_profile = false  # true: a node no profile matches passes with a warning
# storage_paths = ["/fsx/checkpoints"]
"""


@dataclass
class Installation:
    """Where things go. ``shims`` and ``config_path`` are the final paths (what slurm.conf and
    the shims name); with a staging ``destdir`` the files are written under it
    (:meth:`staged`), as ``make install DESTDIR=...`` does for a package build."""

    prefix: str
    python: str
    shims: dict[str, str] = field(default_factory=dict)
    config_path: str = ""
    config_written: bool = False
    destdir: str = ""
    written: list[str] = field(default_factory=list)  # files written (staged paths)

    def staged(self, path: str) -> str:
        return os.path.join(self.destdir, path.lstrip("/")) if self.destdir else path

    def slurm_conf_lines(self, interval: int = 30) -> list[str]:
        return [
            f"Prolog={self.shims['prolog']}",
            f"Epilog={self.shims['epilog']}",
            "PrologFlags=Alloc",
            "PrologEpilogTimeout=120",
            f"HealthCheckProgram={self.shims['healthcheck']}",
            f"HealthCheckInterval={interval}",
            "HealthCheckNodeState=ANY",
        ]


def layout(prefix: str, python: str | None = None, destdir: str = "") -> Installation:
    prefix = os.path.abspath(prefix)
    inst = Installation(prefix=prefix, python=python or sys.executable,
                        destdir=os.path.abspath(destdir) if destdir else "")
    libexec = os.path.join(prefix, "usr/libexec/resilient-slurm" if prefix == "/" else
                           "libexec/resilient-slurm")
    inst.shims = {name: os.path.join(libexec, name) for name in SHIMS}
    inst.config_path = os.path.join(prefix, "etc/resilient-slurm/config.toml")
    return inst


def shim_text(name: str, python: str, config_path: str,
              settings: shim.ShimSettings | None = None,
              entry: tuple[str, str] | None = None) -> str:
    """The shim of hook ``name`` (``hooks/shim.py``), running ``entry`` (module, function:
    default ``SHIMS[name]``, the product's)."""
    module, func = entry or SHIMS[name]
    return shim.text(name, python, module, func, config_path, settings or shim.ShimSettings())


@dataclass(frozen=True)
class PlannedFile:
    path: str  # where it is written (under the staging root, if any)
    final: str  # where it will live (what slurm.conf and the shims name)
    mode: int
    text: str


def plan(prefix: str = "/", python: str | None = None, config_text: str | None = None,
         slurm_conf: str = "/etc/slurm/slurm.conf", force: bool = False,
         destdir: str = "", entries: Mapping[str, tuple[str, str]] | None = None,
         ) -> tuple[Installation, list[PlannedFile]]:
    """The files an install writes: the shims (0755) and, unless one exists (or ``force``),
    the config (0644). Nothing is written. ``entries``: what each shim runs in place of
    ``SHIMS`` (module, function; a test bench's wrappers: the lab's sandbox). The shims carry
    the ``[hooks]`` values they need without Python (``hooks/shim.py``) from the config
    written, else the one kept; a value they cannot carry raises ``shim.ShimError``."""
    inst = layout(prefix, python, destdir)
    config_file: PlannedFile | None = None
    if force or not os.path.exists(inst.staged(inst.config_path)):
        text = config_text if config_text is not None else SKELETON.format(slurm_conf=slurm_conf)
        config_file = PlannedFile(inst.staged(inst.config_path), inst.config_path, 0o644, text)
        inst.config_written = True
    else:
        with open(inst.staged(inst.config_path), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    settings = shim.ShimSettings.from_toml(text)
    files = [PlannedFile(inst.staged(inst.shims[name]), inst.shims[name], 0o755,
                         shim_text(name, inst.python, inst.config_path, settings,
                                   (entries or SHIMS)[name]))
             for name in SHIMS]
    return inst, files + ([config_file] if config_file else [])


def install(prefix: str = "/", python: str | None = None, config_text: str | None = None,
            slurm_conf: str = "/etc/slurm/slurm.conf", force: bool = False,
            destdir: str = "", entries: Mapping[str, tuple[str, str]] | None = None,
            ) -> Installation:
    """Write :func:`plan`'s files atomically."""
    inst, files = plan(prefix, python, config_text, slurm_conf, force, destdir, entries)
    for f in files:
        fsutil.atomic_write(f.path, f.text, mode=f.mode)
        inst.written.append(f.path)
    return inst


def _owner_problems(path: str) -> list[str]:
    try:
        st = os.stat(path)
    except OSError as exc:
        return [f"{path}: {exc.strerror}"]
    problems = []
    if st.st_uid != 0:
        problems.append(f"{path}: owned by uid {st.st_uid}, must be root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problems.append(f"{path}: writable by group or others")
    return problems


@dataclass(frozen=True)
class Finding:
    """One line of ``install-hooks --check``: ``status`` PASS, FAIL or WARN (a suggestion)."""

    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<5} {self.name}: {self.detail}"


class _Findings(list[Finding]):
    def add(self, name: str, problems: list[str], ok: str) -> None:
        if problems:
            self.extend(Finding("FAIL", name, p) for p in problems)
        else:
            self.append(Finding("PASS", name, ok))


def checks(prefix: str = "/", slurm_conf: str | None = None) -> list[Finding]:
    """Every check of an installation under ``prefix``, passed or not, in order."""
    inst = layout(prefix)
    found = _Findings()
    for name, path in inst.shims.items():
        found.add(f"{name} shim", _shim_problems(name, path), f"{path} runs {SHIMS[name][0]}")
    config = None
    try:
        config = load_config(inst.config_path)
    except ConfigError as exc:
        found.add("config", [str(exc) if exc.source else f"{inst.config_path}: {exc}"], "")
    if config is not None:
        found.add("config", _owner_problems(inst.config_path),
                  f"{inst.config_path} valid, root-owned, not writable by others")
        hook_settings = config.section("hooks")
        missing = [f"{prog} not found in hooks.slurm_bin_dir ({hook_settings.slurm_bin_dir})"
                   for prog in ("scontrol", "sinfo")
                   if proc.resolve(prog, hook_settings.slurm_bin_dir) is None]
        found.add("slurm programs", missing, f"scontrol, sinfo in {hook_settings.slurm_bin_dir}")
        slurm_conf = slurm_conf or hook_settings.slurm_conf or os.environ.get("SLURM_CONF")
    slurm_conf = slurm_conf or "/etc/slurm/slurm.conf"
    settings, error = read_slurm_conf(slurm_conf)
    if error:
        found.add("slurm.conf", [error], "")
    else:
        found += _conf_findings(inst, settings, slurm_conf)
        if config is not None:
            found += budget_findings(config.section("hooks"), settings)
    if config is not None:
        found.add("profiles", profile_problems(config, slurm_conf),
                  "every node of slurm.conf has a profile (or unmatched nodes are allowed)")
    return list(found)


def check(prefix: str = "/", slurm_conf: str | None = None) -> list[str]:
    """Problems with an installation under ``prefix`` (empty list: all good); suggestions
    start with ``suggestion:``."""
    return [("suggestion: " if f.status == "WARN" else "") + f.detail
            for f in checks(prefix, slurm_conf) if f.status != "PASS"]


def _shim_problems(name: str, path: str) -> list[str]:
    if not os.path.isfile(path):
        return [f"missing: {path} (run install-hooks)"]
    problems = _owner_problems(path)
    if not os.access(path, os.X_OK):
        problems.append(f"{path}: not executable")
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read(65536)
    module, func = SHIMS[name]
    if f"from {module} import {func}\n" not in text:
        problems.append(f"{path}: does not run {module}:{func} (an older layout? run "
                        "install-hooks)")
    if not shim.fails_closed(text):
        problems.append(f"{path}: does not fail closed (a shim of an older release: when its "
                        "interpreter goes, the node stays in service unchecked; run "
                        "install-hooks)")
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    interp = shim.interpreter(text).replace("{node}", node)  # a per-node venv: this node's
    if not interp or not os.access(interp, os.X_OK):
        problems.append(f"{path}: interpreter {interp or '?'} missing (the shim drains the node "
                        f"with {shim.BROKEN_CODE})")
    else:
        out = proc.run([interp, "-I", "-c", "import " + SHIMS[name][0]], timeout=30)
        if not out.ok:
            problems.append(f"{path}: cannot import {SHIMS[name][0]}: {out.describe()} (the "
                            f"shim drains the node with {shim.BROKEN_CODE})")
    return problems


def profile_problems(config: Config, slurm_conf: str) -> list[str]:
    """Nodes of slurm.conf that no profile matches (their runs would be ``unknown``)."""
    from resilient_slurm.healthcheck.profiles import select_profile
    from resilient_slurm.slurm.hostlist import HostlistError, expand

    if config.health.allow_unmatched_profile:
        return []
    try:
        with open(slurm_conf, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return []
    names: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^\s*NodeName\s*=\s*(\S+)", line.split("#", 1)[0], re.IGNORECASE)
        if m and m.group(1).upper() != "DEFAULT":
            try:
                names += expand(m.group(1))
            except HostlistError:
                continue
    try:
        unmatched = [n for n in names
                     if select_profile(config.health, n).how == "auto"]
    except ConfigError as exc:
        return [f"profiles: {exc}"]
    if not unmatched:
        return []
    from resilient_slurm.slurm.hostlist import compress

    return [f"no profile matches node(s) {compress(unmatched)}: their health runs "
            "are unknown and drain them (add a profile, or set "
            "health.allow_unmatched_profile = true)"]


def read_slurm_conf(path: str) -> tuple[dict[str, str], str]:
    """slurm.conf's top-level ``Key=Value`` settings, keys lower-cased; or the read error."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        return {}, f"{path}: {exc.strerror}"
    settings: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z]+)\s*=\s*(.*)$", line)
        if m and not line.lower().startswith(("nodename", "partitionname")):
            settings[m.group(1).lower()] = m.group(2).strip()
    return settings, ""


def _conf_findings(inst: Installation, settings: dict[str, str], path: str) -> list[Finding]:
    found = _Findings()
    for key, hook in (("Prolog", "prolog"), ("Epilog", "epilog"),
                      ("HealthCheckProgram", "healthcheck")):
        value = settings.get(key.lower())
        found.add(f"slurm.conf {key}", [] if value == inst.shims[hook] else [
            f"{key}={value or '(unset)'}, expected {inst.shims[hook]}"], inst.shims[hook])
    found.add("slurm.conf PrologFlags", [] if "alloc" in settings.get("prologflags", "").lower()
              else ["PrologFlags lacks Alloc (prolog must run on every node at allocation)"],
              "Alloc")
    interval = settings.get("healthcheckinterval", "0")
    found.add("slurm.conf HealthCheckInterval",
              [] if interval.isdigit() and int(interval) > 0
              else ["HealthCheckInterval unset or 0"], f"{interval} s")
    if "nohold_on_prolog_fail" in settings.get("schedulerparameters", ""):
        found.add("slurm.conf SchedulerParameters", [], "nohold_on_prolog_fail")
    else:
        found.append(Finding("WARN", "slurm.conf SchedulerParameters",
                             "slurm.conf SchedulerParameters=nohold_on_prolog_fail "
                             "(else a batch job whose prolog failed is requeued held)"))
    return list(found)


def budget_findings(hooks: HooksConfig, settings: dict[str, str]) -> list[Finding]:
    """The hooks' budgets against slurm.conf's ``PrologEpilogTimeout`` and
    ``HealthCheckInterval``: a hook Slurm kills mid-run drains the node with Slurm's reason,
    not ours; a health run longer than the interval overlaps the next."""
    found = _Findings()
    overhead = 2 * hooks.slurm_timeout_s + hooks.lock_timeout_s
    raw = settings.get("prologepilogtimeout", "")
    if raw.isdigit():
        limit = float(raw)
        worst = max(hooks.prolog_budget_s, hooks.epilog_budget_s + (
            hooks.diag_budget_s() + 1.0 if hooks.epilog_diag_on_failure else 0.0)) + overhead
        problems = []
        if hooks.prolog_epilog_timeout_s > limit:
            problems.append(f"hooks.prolog_epilog_timeout_s = {hooks.prolog_epilog_timeout_s:g}"
                            f" but slurm.conf PrologEpilogTimeout={raw}: set it to {raw}")
        if worst >= limit:
            problems.append(f"the longest hook run ({worst:g} s: budget + 2 x slurm_timeout_s +"
                            f" lock_timeout_s) does not fit PrologEpilogTimeout={raw}")
        found.add("budgets vs PrologEpilogTimeout", problems,
                  f"longest hook run {worst:g} s < {raw} s")
    else:
        found.add("budgets vs PrologEpilogTimeout", [
            "slurm.conf sets no PrologEpilogTimeout: set it (the hooks' budgets assume "
            f"{hooks.prolog_epilog_timeout_s:g} s, hooks.prolog_epilog_timeout_s)"], "")
    interval = settings.get("healthcheckinterval", "")
    if interval.isdigit() and int(interval) > 0:
        run = hooks.health_budget_s + overhead
        name = "budgets vs HealthCheckInterval"
        if hooks.health_budget_s > int(interval):
            found.add(name, [f"hooks.health_budget_s = {hooks.health_budget_s:g} is longer than "
                             f"HealthCheckInterval={interval}: every run would overlap the next"],
                      "")
        elif run >= int(interval):
            found.append(Finding("WARN", name, f"a health run may take {run:g} s (budget + 2 x "
                                 f"slurm_timeout_s + lock_timeout_s) >= HealthCheckInterval="
                                 f"{interval}: a slow run makes the next one skip (health lock)"))
        else:
            found.add(name, [], f"health run at most {run:g} s < {interval} s")
    return list(found)

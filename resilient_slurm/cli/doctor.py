"""``resilient-slurm doctor``: what this site runs (Slurm, backend, NVRx, ft_launcher flags,
the installed hooks) and whether the controller answers, one line per finding with its cause.
It never imports torch (``ft_launcher --help`` runs in its own process)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass

import click

from resilient_slurm.slurm import SlurmError, backend_choice, connect

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's output: ``status`` ok/warn/fail/info, what was looked at,
    what was found (and for warn/fail, the likely cause and what to do)."""

    status: str
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.status.upper():<5} {self.what}: {self.detail}"


def nvrx_version() -> str | None:
    """The installed nvidia-resiliency-ext release, from its metadata (nothing is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-resiliency-ext")
    except PackageNotFoundError:
        return None


def find_ft_launcher(name: str) -> str | None:
    """``name`` beside this interpreter first (the venv resilient-launch runs from, whose
    NVRx it uses, on PATH or not), then on PATH; a path is taken as it is."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name, path=os.path.dirname(os.path.abspath(sys.executable))) \
        or shutil.which(name)


def slurm_cause(exc: SlurmError) -> str:
    """Slurm's error as one line with a likely cause, not scontrol's banner."""
    text = " ".join(re.sub(r"\*+", " ", exc.message or str(exc)).split())
    if re.search(r"\bDOWN\b", text):
        return ("slurmctld does not answer (scontrol ping: DOWN): is it running, and is "
                "SlurmctldHost/SlurmctldPort of slurm.conf right?")
    if "no answer within" in text:
        return f"{text.split(': ', 1)[-1]}: slurmctld or munge may be down or unreachable"
    if re.search(r"munge", text, re.I):
        return f"munge authentication failed ({text[:100]}): is munged running, same key?"
    return text[:160]


def ft_findings(ft_launcher: str) -> list[Finding]:
    """The ft_launcher resilient-launch would use, and per option the spelling this release
    offers (or that it offers none, so resilient-launch leaves it out)."""
    from resilient_slurm.launcher.cycle.plan import FT_FLAGS, PlanError, detect_features

    exe = find_ft_launcher(ft_launcher)
    if exe is None:
        return [Finding(WARN, "ft_launcher", f"{ft_launcher} not found beside "
                        f"{sys.executable} or on PATH (resilient-launch needs it; the hooks "
                        "do not)")]
    try:
        features = detect_features(exe)
    except PlanError as exc:
        return [Finding(FAIL, "ft_launcher", f"{exe}: {exc}")]
    out = [Finding(OK, "ft_launcher", exe)]
    for name in FT_FLAGS:
        flag = features.flag(name)
        out.append(Finding(INFO, f"ft_launcher {name}", flag or "not offered: left out"))
    return out


def hook_findings(conf: str | None) -> list[Finding]:
    """The hooks installed on this machine (``install-hooks --check`` in brief)."""
    from resilient_slurm.hooks import install

    inst = install.layout("/")
    if not any(os.path.exists(p) for p in inst.shims.values()):
        where = os.path.dirname(inst.shims["prolog"])
        return [Finding(INFO, "hooks", f"not installed here ({where}): fine on a login node; "
                        "on a compute node run resilient-slurm install-hooks")]
    failed = [f for f in install.checks("/", conf) if f.status == "FAIL"]
    if not failed:
        return [Finding(OK, "hooks", "installed and consistent with config and slurm.conf")]
    return [Finding(FAIL, f"hooks {f.name}", f.detail) for f in failed]


def findings(conf: str | None, ft_launcher: str, hooks: bool = True) -> list[Finding]:
    """Every finding, in order; on a terminal each slow step says what it waits for."""
    from resilient_slurm.healthcheck.progress import TtyStatus

    out: list[Finding] = []
    if conf and not os.path.isfile(conf):
        return [Finding(FAIL, "slurm.conf", f"{conf} does not exist (--conf or $SLURM_CONF)")]
    cli = connect(conf=conf, backend="cli")
    try:
        major, minor = cli.version()
        out.append(Finding(OK, "slurm version", f"{major}.{minor:02d}"))
    except SlurmError as exc:
        out.append(Finding(WARN, "slurm version", f"unknown: {slurm_cause(exc)}"))
    try:
        backend, why = backend_choice(conf=conf)
        out.append(Finding(FAIL if backend == "unusable" else INFO, "slurm backend",
                           f"{backend} ({why})"))
    except SlurmError as exc:
        out.append(Finding(FAIL, "slurm backend", str(exc)))
    nvrx = nvrx_version()
    if nvrx:
        out.append(Finding(OK, "nvidia-resiliency-ext", nvrx))
        with TtyStatus(sys.stderr, "reading ft_launcher's flags (ft_launcher --help)", 60):
            out += ft_findings(ft_launcher)
    else:
        out.append(Finding(WARN, "nvidia-resiliency-ext", "not installed (resilient-launch "
                           "needs >= 0.4.1; the hooks do not)"))
    if hooks:
        with TtyStatus(sys.stderr, "checking the hooks installed here (install-hooks --check)"):
            out += hook_findings(conf)
    try:
        with TtyStatus(sys.stderr, "asking the controller (scontrol ping)", 30):
            cli.ping()
            nodes = cli.nodes()
        out.append(Finding(OK, "controller", f"up, {len(nodes)} node(s)"))
    except SlurmError as exc:
        out.append(Finding(FAIL, "controller", f"not reachable: {slurm_cause(exc)}"))
    return out


@click.command()
@click.option("--conf", envvar="SLURM_CONF", help="slurm.conf to use (default: $SLURM_CONF).")
@click.option("--ft-launcher", default="ft_launcher", show_default=True,
              help="The ft_launcher program whose flags to detect (looked for beside this "
                   "Python first, then on PATH).")
@click.option("--json", "as_json", is_flag=True, help="The findings as a JSON list.")
@click.option("--no-hooks", is_flag=True, help="Do not check the hooks installed here.")
def doctor(conf: str | None, ft_launcher: str, as_json: bool, no_hooks: bool) -> None:
    """Say which Slurm, backend and NVRx this machine has, which ft_launcher flags
    resilient-launch will use, whether the hooks installed here are consistent, and check
    the controller answers: one line per finding (OK, WARN, FAIL, INFO) with its cause.

    Exit status: 0 when nothing FAILs, 1 otherwise.
    """
    found = findings(conf, ft_launcher, hooks=not no_hooks)
    if as_json:
        click.echo(json.dumps([asdict(f) for f in found], indent=1))
    else:
        for f in found:
            click.echo(f.line(), err=f.status == FAIL)
    if any(f.status == FAIL for f in found):
        raise SystemExit(1)

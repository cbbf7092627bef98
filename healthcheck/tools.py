"""Checks built on external tools: ``dcgmi diag``, ``dcgmi health``, ``fi_info``, storage probes.

Gathering runs the tool through :func:`resilient_slurm.proc.run` (argv list, timeout,
process-group kill); evaluating is pure: ``evaluate_*(outcome, ...) -> list[Result]``. Missing,
timed out and unparseable are ``unknown``; a test that fails is ``fail``; a skipped DCGM test
is not a pass.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from resilient_slurm.proc import MISSING, TIMEOUT, Outcome

from .model import FAIL, OK, UNKNOWN, WARN, Result
from .registry import PERIODIC, PROLOG, RunContext, declare

# dcgmi diag exit codes (DCGM docs); anything else non-zero is a failure of the tool.
DCGM_EXIT = {
    226: (FAIL, "DCGM_DIAG_FAIL", "a diagnostic test reported an error"),
    205: (FAIL, "DCGM_ISOLATE", "DCGM says isolate the device"),
    204: (UNKNOWN, "DCGM_NO_BINARY", "diagnostic binary not found"),
    203: (UNKNOWN, "DCGM_KILLED", "diagnostic was killed"),
    215: (UNKNOWN, "DCGM_BAD_LAUNCH", "diagnostic failed to launch"),
    217: (UNKNOWN, "DCGM_BUSY", "a diagnostic is already running"),
    198: (UNKNOWN, "DCGM_NO_TEST", "no test available for this GPU"),
}


def tool_failure(check: str, prefix: str, out: Outcome, required: bool = True) -> Result | None:
    """The Result for a tool that did not run cleanly (None when it exited 0)."""
    if out.kind == MISSING:
        if not required:
            return Result(check, OK, "SKIPPED", f"{prefix.lower()} not installed and not required "
                          "by the profile", out.describe())
        return Result(check, UNKNOWN, f"{prefix}_MISSING", f"{out.describe()} (required)",
                      out.describe())
    if out.kind == TIMEOUT:
        return Result(check, UNKNOWN, f"{prefix}_TIMEOUT", out.describe(), out.describe())
    return None


def _walk_tests(node: Any, name: str = "") -> Iterator[tuple[str, str]]:
    """(test name, status) pairs anywhere in dcgmi's JSON, whatever its version's layout."""
    if isinstance(node, dict):
        here = str(node.get("name") or node.get("test_name") or name)
        status = node.get("status")
        if isinstance(status, str) and status.lower() in ("pass", "fail", "skip", "warn",
                                                          "passed", "failed", "skipped"):
            yield here, status.lower()
        for value in node.values():
            yield from _walk_tests(value, here)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_tests(item, name)


def evaluate_dcgm_diag(out: Outcome, level: int, required: bool = True) -> list[Result]:
    check = "dcgm_diag"
    early = tool_failure(check, "DCGMI", out, required)
    if early:
        return [early]
    if out.kind != "ok" and out.returncode is not None and out.returncode in DCGM_EXIT:
        status, code, why = DCGM_EXIT[out.returncode]
        return [Result(check, status, code, f"dcgmi diag -r {level}: {why} (exit {out.returncode})",
                       _failed_tests(out.stdout) or out.describe())]
    if out.kind != "ok":
        return [Result(check, UNKNOWN, "DCGMI_ERROR", out.describe(), out.describe())]
    try:
        tests = list(_walk_tests(json.loads(out.stdout)))
    except ValueError:
        return [Result(check, UNKNOWN, "DCGMI_UNPARSEABLE", "dcgmi diag printed no JSON",
                       out.stdout[:200])]
    if not tests:
        return [Result(check, UNKNOWN, "DCGMI_UNPARSEABLE", "dcgmi diag reported no tests",
                       out.stdout[:200])]
    failed = [n for n, s in tests if s.startswith("fail")]
    skipped = [n for n, s in tests if s.startswith("skip")]
    warned = [n for n, s in tests if s == "warn"]
    if failed:
        return [Result(check, FAIL, "DCGM_DIAG_FAIL", f"dcgmi diag -r {level}: failed "
                       + ", ".join(sorted(set(failed))), ", ".join(failed))]
    if len(skipped) == len(tests):
        return [Result(check, UNKNOWN, "DCGM_DIAG_SKIPPED",
                       f"dcgmi diag -r {level}: every test was skipped", ", ".join(skipped))]
    if skipped or warned:
        return [Result(check, WARN, "DCGM_DIAG_PARTIAL", f"dcgmi diag -r {level}: "
                       f"{len(skipped)} skipped, {len(warned)} warned (not a pass)",
                       ", ".join(skipped + warned))]
    return [Result(check, OK, "OK", f"dcgmi diag -r {level}: {len(tests)} tests passed")]


@declare("dcgm_diag", "dcgm_diag", ("validate",))  # on demand, and the validation set
def check_dcgm_diag(out: Outcome, run: RunContext) -> list[Result]:
    return evaluate_dcgm_diag(out, run.cfg.dcgm_diag_level, run.profile.require_dcgm)


def _failed_tests(stdout: str) -> str:
    try:
        return ", ".join(n for n, s in _walk_tests(json.loads(stdout)) if s.startswith("fail"))
    except ValueError:
        return ""


def _find_key(node: Any, key: str) -> Any:
    if isinstance(node, dict):
        for k, v in node.items():
            if k.lower() == key.lower():
                return v
            found = _find_key(v, key)
            if found is not None:
                return found
    elif isinstance(node, list):
        for item in node:
            found = _find_key(item, key)
            if found is not None:
                return found
    return None


def watches_missing(out: Outcome) -> bool:
    """dcgmi says no health watches are set (its wording varies by version)."""
    text = (out.stdout + " " + out.stderr).lower()
    return out.kind in ("ok", "nonzero") and "watch" in text and (
        "not set" in text or "no health" in text or "not enabled" in text)


def evaluate_dcgm_health(out: Outcome, required: bool = True,
                         set_watches: Outcome | None = None) -> list[Result]:
    """``dcgmi health -c -j``; ``set_watches`` is the ``-s a`` run made when none were set."""
    check = "dcgm_health"
    early = tool_failure(check, "DCGMI", out, required)
    if early:
        return [early]
    if set_watches is not None:
        if set_watches.ok:
            return [Result(check, WARN, "DCGM_WATCHES_NEW", "dcgmi health watches were not set; "
                           "set now, verdicts need ~60 s of samples", out.describe())]
        return [Result(check, UNKNOWN, "DCGM_WATCHES_UNSET", "dcgmi health watches are not set "
                       "and could not be set", set_watches.describe())]
    if out.kind != "ok":
        return [Result(check, UNKNOWN, "DCGMI_ERROR", out.describe(), out.describe())]
    try:
        overall = _find_key(json.loads(out.stdout), "Overall Health")
    except ValueError:
        overall = None
    if isinstance(overall, dict):
        overall = overall.get("value")
    if not isinstance(overall, str):
        return [Result(check, UNKNOWN, "DCGMI_UNPARSEABLE", "dcgmi health: no 'Overall Health'",
                       out.stdout[:200])]
    value = overall.strip().lower()
    if value == "healthy":
        return [Result(check, OK, "OK", "dcgmi health: Healthy")]
    if value.startswith("warn"):
        return [Result(check, WARN, "DCGM_HEALTH_WARN", f"dcgmi health: {overall}",
                       out.stdout[:300])]
    return [Result(check, FAIL, "DCGM_HEALTH_FAIL", f"dcgmi health: {overall}", out.stdout[:300])]


@declare("dcgm_health", "dcgm_health", (PERIODIC,))
def check_dcgm_health(outs: tuple[Outcome, Outcome | None], run: RunContext) -> list[Result]:
    return evaluate_dcgm_health(outs[0], run.profile.require_dcgm, outs[1])


def evaluate_fi_info(out: Outcome, required: bool) -> list[Result]:
    check = "fi_info"
    early = tool_failure(check, "FI_INFO", out, required)
    if early:
        return [early]
    text = out.stdout + "\n" + out.stderr
    has = any(line.strip().replace(" ", "") == "provider:efa" for line in text.splitlines())
    if out.kind == "ok" and has:
        return [Result(check, OK, "OK", "fi_info lists provider efa")]
    if not required:
        return [Result(check, OK, "SKIPPED", "no EFA expected by the profile")]
    if out.kind != "ok" and "fi_getinfo" not in text and out.stdout.strip():
        return [Result(check, UNKNOWN, "FI_INFO_ERROR", out.describe(), out.describe())]
    return [Result(check, FAIL, "EFA_PROVIDER_MISSING", "libfabric has no efa provider "
                   "(fi_info -p efa)", out.describe() if out.kind != "ok" else text[:200])]


# A storage probe runs in its own process: a hung file system leaves a stuck child, not us.
PROBE_CODE = (
    "import os,sys,tempfile\n"
    "p=sys.argv[1]; m=os.path.realpath(p)\n"
    "if not os.path.isdir(p): print('missing'); sys.exit(3)\n"
    "while not os.path.ismount(m): m=os.path.dirname(m)\n"
    "if sys.argv[2]=='1' and m=='/' and os.path.realpath(p)!='/':\n"
    "    print('not-mounted'); sys.exit(4)\n"
    "fd,t=tempfile.mkstemp(prefix='.rhc-probe-',dir=p)\n"
    "os.write(fd,b'ok'); os.fsync(fd); os.close(fd); os.unlink(t); print('ok')\n"
)


@declare("fi_info", "fi_info", (PERIODIC,))
def check_fi_info(out: Outcome, run: RunContext) -> list[Result]:
    return evaluate_fi_info(out, run.profile.require_fi_info or run.profile.efa > 0)


def storage_argv(path: str, require_mount: bool) -> list[str]:
    """The probe: exists, (own mount unless the path is on ``/``), create+fsync+delete a file."""
    return [sys.executable, "-I", "-S", "-c", PROBE_CODE, path, "1" if require_mount else "0"]


def evaluate_storage(path: str, out: Outcome) -> list[Result]:
    check = "storage"
    dev = os.path.basename(path.rstrip("/")) or path
    if out.kind == TIMEOUT:
        return [Result(check, FAIL, "STORAGE_HANG", f"{path}: no answer within "
                       f"{out.duration_s:.1f}s", f"{path} {out.describe()}", device=dev)]
    if out.kind == MISSING:
        return [Result(check, UNKNOWN, "STORAGE_PROBE", "could not start the storage probe",
                       out.describe(), device=dev)]
    word = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.kind == "ok" and word == "ok":
        return [Result(check, OK, "OK", f"{path} writable in {out.duration_s:.2f}s", path)]
    if word == "missing":
        return [Result(check, FAIL, "STORAGE_MISSING", f"{path} does not exist", path, device=dev)]
    if word == "not-mounted":
        return [Result(check, FAIL, "STORAGE_NOT_MOUNTED", f"{path} is not mounted", path,
                       device=dev)]
    last = (out.stderr.strip().splitlines() or [""])[-1][:200]
    return [Result(check, FAIL, "STORAGE_NOT_WRITABLE", f"{path} is not writable: {last}",
                   f"{path} {last}", device=dev)]


@declare("storage", "storage", (PROLOG, PERIODIC))
def check_storage(outs: list[tuple[str, Outcome]], run: RunContext) -> list[Result]:
    return [r for p, o in outs for r in evaluate_storage(p, o)] or [
        Result("storage", OK, "SKIPPED", "no storage paths configured")]

"""The one way this project runs an external program.

Contract: argv is a list (never a shell string); every call has a timeout; on timeout the
whole process group is killed (the tool and anything it spawned). The outcome says which of
the distinct failure modes happened, so callers can map each to ``fail``/``unknown`` and never
to ``ok``: ``missing`` (not found / not executable), ``timeout``, ``nonzero`` or ``ok``.
Parsing is the caller's job; a caller that cannot parse ``stdout`` reports *unparseable*.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

MISSING = "missing"
TIMEOUT = "timeout"
NONZERO = "nonzero"
OK = "ok"


@dataclass(frozen=True)
class Outcome:
    """What happened when a program ran."""

    argv: tuple[str, ...]
    kind: str  # ok | missing | timeout | nonzero
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.kind == OK

    def describe(self) -> str:
        """One short line for reasons and error messages."""
        name = os.path.basename(self.argv[0]) if self.argv else "?"
        if self.kind == MISSING:
            return f"{name}: not found or not executable"
        if self.kind == TIMEOUT:
            return f"{name}: timed out after {self.duration_s:.1f}s"
        if self.kind == NONZERO:
            msg = (self.stderr.strip() or self.stdout.strip()).splitlines()
            tail = msg[-1][:200] if msg else ""
            return f"{name}: exit {self.returncode}" + (f": {tail}" if tail else "")
        return f"{name}: ok"


def resolve(program: str, search_path: str | None = None) -> str | None:
    """Absolute path of ``program`` (absolute paths are checked, bare names searched)."""
    if os.path.isabs(program):
        return program if os.access(program, os.X_OK) and os.path.isfile(program) else None
    return shutil.which(program, path=search_path)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run(
    argv: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    search_path: str | None = None,
    input_text: str | None = None,
    cwd: str | None = None,
) -> Outcome:
    """Run ``argv`` with a hard ``timeout`` (seconds); never raises for tool failures."""
    if isinstance(argv, str):  # defensive: a shell string is a programming error
        raise TypeError("argv must be a sequence of arguments, not a string")
    argv = tuple(str(a) for a in argv)
    start = time.monotonic()
    exe = resolve(argv[0], search_path or (env or os.environ).get("PATH", os.defpath))
    if exe is None:
        return Outcome(argv, MISSING, None, "", "", 0.0)
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list, no shell
            [exe, *argv[1:]],
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
            start_new_session=True,
            cwd=cwd,
        )
    except (FileNotFoundError, PermissionError, OSError) as exc:
        return Outcome(argv, MISSING, None, "", str(exc), time.monotonic() - start)
    try:
        out, err = proc.communicate(input=input_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        return Outcome(argv, TIMEOUT, None, out or "", err or "", time.monotonic() - start)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    # Anything the tool left behind in its group goes too.
    _kill_group(proc)
    kind = OK if proc.returncode == 0 else NONZERO
    return Outcome(argv, kind, proc.returncode, out, err, time.monotonic() - start)


@contextlib.contextmanager
def background(argv: Sequence[str], env: Mapping[str, str] | None = None,
               search_path: str | None = None) -> Iterator[Outcome | None]:
    """Run ``argv`` (a test's server side) for the duration of the block, then kill its whole
    process group. Yields None once it started, else the :class:`Outcome` saying why not
    (``missing``; ``nonzero`` when it exited at once)."""
    argv = tuple(str(a) for a in argv)
    exe = resolve(argv[0], search_path or (env or os.environ).get("PATH", os.defpath))
    if exe is None:
        yield Outcome(argv, MISSING, None, "", "", 0.0)
        return
    try:
        server = subprocess.Popen(  # noqa: S603 - argv list, no shell
            [exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=dict(env) if env is not None else None,
            start_new_session=True, text=True)
    except OSError as exc:
        yield Outcome(argv, MISSING, None, "", str(exc), 0.0)
        return
    try:
        time.sleep(0.05)
        code = server.poll()
        yield None if code is None else Outcome(argv, NONZERO, code, "", "exited at once", 0.0)
    finally:
        _kill_group(server)
        try:
            server.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass

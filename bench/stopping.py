"""A benchmark or the demo stopped by a signal unwinds: its sandboxes come down.

:func:`exit_on_signals` turns SIGTERM, SIGINT and SIGHUP (``kill``, Ctrl-C, a closed terminal;
GNU make passes its own SIGTERM on to the recipe) into :class:`Stopped`, a ``SystemExit`` with
the shell's code for that signal (128 + its number), so every ``with harness.sandbox(...)`` and
``finally`` on the way out runs. Once the first one arrives, the others are ignored: a second
Ctrl-C does not cut the sandbox's ``down`` short (SIGKILL still ends the process).
"""

from __future__ import annotations

import signal
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(SystemExit):
    """Raised by the handler :func:`exit_on_signals` installs; ``code`` is 128 + the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signame = signal.Signals(signum).name


def _stop(signum: int, _frame: FrameType | None) -> None:
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # the unwinding (a sandbox's down) runs to its end
    raise Stopped(signum)


def exit_on_signals() -> None:
    """Install the handler (main thread only, as ``signal.signal`` requires)."""
    for sig in SIGNALS:
        signal.signal(sig, _stop)

"""Progress of a manual ``resilient-health check`` on a terminal: which checks are still
running and how long the run may take, redrawn in place on stderr. Quiet when stderr is not a
terminal (hooks, pipes, logs), so nothing but the report reaches a log.

It watches the engine's gatherer threads (named ``rhc-<gatherer>``, ``engine._run``) rather
than reaching into the engine: a check's progress is exactly its thread being alive.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TextIO

PREFIX = "rhc-"


def running_gatherers() -> list[str]:
    """The engine's gatherers still running, by name (``nvml``, ``dcgm_diag``...)."""
    return sorted(t.name[len(PREFIX):] for t in threading.enumerate()
                  if t.name.startswith(PREFIX) and t.is_alive())


class TtyProgress:
    """``with TtyProgress(sys.stderr, limit_s):`` around a run; a no-op unless ``stream`` is a
    terminal. Redraws every ``every`` seconds: ``checking: dcgm_diag, nvml (3 s, at most
    45 s)``; clears its line at the end."""

    def __init__(self, stream: TextIO, limit_s: float, every: float = 0.5) -> None:
        self.stream, self.limit_s, self.every = stream, limit_s, every
        self.on = bool(getattr(stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = 0

    def _draw(self, text: str) -> None:
        pad = max(self._width - len(text), 0)
        self.stream.write("\r" + text + " " * pad + ("\r" if not text else ""))
        self.stream.flush()
        self._width = len(text)

    def _loop(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(self.every):
            names = running_gatherers()
            if names:
                self._draw(f"checking: {', '.join(names)} ({time.monotonic() - start:.0f} s, "
                           f"at most {self.limit_s:.0f} s)")

    def __enter__(self) -> TtyProgress:
        if self.on:
            self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=2)
            if self._width:
                self._draw("")


class TtyStatus:
    """One step of a long command on a terminal: ``with TtyStatus(sys.stderr, "reading
    ft_launcher's flags (ft_launcher --help)", 60):`` shows ``... (up to 60 s)`` while the
    block runs, then clears the line. A no-op unless ``stream`` is a terminal."""

    def __init__(self, stream: TextIO, what: str, limit_s: float | None = None) -> None:
        self.stream, self.what, self.limit_s = stream, what, limit_s
        self.on = bool(getattr(stream, "isatty", lambda: False)())
        self._width = 0

    def __enter__(self) -> TtyStatus:
        if self.on:
            text = self.what + (f" (up to {self.limit_s:.0f} s)" if self.limit_s else "") + "..."
            self.stream.write("\r" + text)
            self.stream.flush()
            self._width = len(text)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.on:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()

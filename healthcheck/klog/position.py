"""The saved kernel-log position, and when to trust one.

``<state_dir>/health/kernlog-position.json`` says how far the hooks have read. It decides
which Xids a run sees, so a position is used only when

* its directory and the state dir are real directories (not symlinks) owned by root or the
  running user and not writable by group or others, under parents only root or this user
  can change (a world-writable parent must be sticky, like /tmp); the file itself is a
  regular file (never followed through a symlink) with the same owner and mode rules;
* its content is plausible (:func:`plausible`): this source, this boot, well-formed numbers
  and cursors. The sources check the range (a sequence past the end of this boot's log).

Otherwise the run reads this boot's whole window and says why (``LogRead.untrusted``, a
``KLOG_POSITION_UNTRUSTED`` warning): re-reading may repeat an Xid, it never hides one.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from resilient_slurm import fsutil

MAX_POSITION_BYTES = 64 * 1024
_CURSOR = re.compile(r"[a-z]=[0-9a-f]{1,64}(?:;[a-z]=[0-9a-f]{1,64}){0,15}")


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def untrusted_dir(path: str, levels: int = 2) -> str:
    """Why the directory ``path`` (and the ``levels - 1`` above it) may not hold state we
    trust, or "" when it may (or does not exist: then there is nothing to trust)."""
    path = os.path.abspath(path)
    probe = path
    for _ in range(levels):  # the state directories themselves: strict
        try:
            st = os.lstat(probe)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            return f"{probe}: {exc.strerror or exc}"
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            return f"{probe} is not a directory (a symlink or file is refused)"
        if not _owner_ok(st) or st.st_mode & 0o022:
            return (f"{probe} is owned by uid {st.st_uid} with mode "
                    f"{stat.S_IMODE(st.st_mode):o} (must be root's or ours, not group/other-"
                    "writable)")
        up = os.path.dirname(probe)
        if up == probe:
            return ""
        probe = up
    while True:  # their parents: no one else may replace what is below them
        try:
            st = os.stat(probe)
        except OSError as exc:
            return f"{probe}: {exc.strerror or exc}"
        if not _owner_ok(st) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            return (f"parent {probe} can be changed by others (owner {st.st_uid}, mode "
                    f"{stat.S_IMODE(st.st_mode):o})")
        up = os.path.dirname(probe)
        if up == probe:
            return ""
        probe = up


def read_trusted_json(path: str) -> tuple[Any, str]:
    """(parsed JSON or None, why it was not trusted or ""), for state under ``path``'s
    directory and its parent (see the module docstring). Absent: (None, "")."""
    why = untrusted_dir(os.path.dirname(path))
    if why:
        return None, why
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or not _owner_ok(st) or st.st_mode & 0o022:
            return None, (f"{path}: not a regular file owned by root or us with mode go-w "
                          f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        data = fh.read(MAX_POSITION_BYTES + 1)
    if len(data) > MAX_POSITION_BYTES:
        return None, f"{path}: larger than {MAX_POSITION_BYTES} bytes"
    try:
        return json.loads(data.decode("utf-8")), ""
    except ValueError:
        return None, f"{path}: not valid JSON"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def valid_cursor(cursor: Any, boot_id: str) -> bool:
    """A journal cursor (``s=..;i=..;b=<boot>;m=..;t=..;x=..``) of this boot."""
    if not isinstance(cursor, str) or len(cursor) > 1024 or not _CURSOR.fullmatch(cursor):
        return False
    fields = dict(part.split("=", 1) for part in cursor.split(";"))
    boot = boot_id.replace("-", "").lower()
    return "b" not in fields or not boot or fields["b"] == boot


def plausible(after: Any, source: str, boot_id: str) -> tuple[dict[str, Any] | None, str]:
    """(the position to read after, or None; why it was refused, or ""). Another boot or
    another source is no position, silently (a reboot or a config change); a malformed one
    is no position *and* a reason."""
    if after is None:
        return None, ""
    if not isinstance(after, dict):
        return None, "saved position is not an object"
    if "window" in after:
        return after, ""  # a time window (gap fill), built by this code, not loaded
    if after.get("source") != source or after.get("boot_id") != boot_id:
        return None, ""
    bad = ""
    if source == "journal":
        cursor = after.get("cursor")
        if cursor is not None and not valid_cursor(cursor, boot_id):
            bad = "cursor is malformed or of another boot"
    else:
        for key in ("seq", "offset"):
            if key in after and not (after[key] is None and key == "offset") \
                    and not _count(after[key]):
                bad = f"{key} {str(after[key])[:40]!r} is not a count"
        usec = after.get("usec")
        if usec is not None and not _count(usec):
            bad = f"usec {str(usec)[:40]!r} is not a count"
    if bad:
        return None, f"saved {source} position not plausible: {bad}; read this boot's log"
    return after, ""


class PositionStore:
    """The saved position (per boot id) under ``<state_dir>/health/``; ``None`` = no memory."""

    def __init__(self, state_dir: str | None) -> None:
        self.path = (os.path.join(state_dir, "health", "kernlog-position.json")
                     if state_dir else None)

    def load(self, boot_id: str) -> tuple[dict[str, Any] | None, str]:
        """(position of this boot or None, why a saved one was not trusted or "")."""
        if self.path is None:
            return None, ""
        saved, why = read_trusted_json(self.path)
        if why:
            return None, f"saved kernel-log position not trusted: {why}; read this boot's log"
        if saved is not None and not isinstance(saved, dict):
            return None, "saved kernel-log position is not an object; read this boot's log"
        if isinstance(saved, dict) and saved.get("boot_id") == boot_id:
            return saved, ""
        return None, ""  # another boot (or none): start from the beginning of this boot

    def save(self, position: dict[str, Any] | None) -> None:
        if self.path is not None and position:
            fsutil.atomic_write_json(self.path, position, mode=0o600)

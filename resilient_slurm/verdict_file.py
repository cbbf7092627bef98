"""The published-verdict file: the one contract between the root hooks (who write it) and the
job side (who read it as the job's user), defined here only.

The HealthCheckProgram, the prolog and the epilog each overwrite one small JSON file per node
after every run (``[hooks] verdict_file``; the launcher's ``--verdict-path``; both default to
:data:`DEFAULT_PATH`, ``{node}`` standing for the node's name): written atomically (temporary
file in the same directory, then rename), mode 0644 in a 0755 directory, so a job running as
its user reads the old or the new verdict, never half of one. Format :data:`FORMAT`
(``docs/hooks.md``):

``{"format": 1, "node": str, "status": "ok|warn|fail|unknown", "healthy": bool,
"codes": [str], "reason": str, "source": "health|prolog|epilog", "job": int|null,
"check_set": str, "simulated": bool, "time": float (unix s), "time_iso": str,
"precursors": [str]}``

``precursors`` (absent in older writers: none) lists the precursor codes the hooks found
(``hooks/precursor.py``): the node still works (status ``warn`` unless something else fails);
a launcher moves its job off it when a spare waits.

Writing: :func:`publish` (the record itself is built by ``hooks/verdict.py`` from a health
report). Reading: :func:`read` / :func:`parse` give the :class:`Verdict` the launcher judges by
(status, time, codes; at most :data:`MAX_BYTES` read, never raising; a record without
``format`` is taken as format 1), :func:`load` the whole record (``format`` required).
Where: :func:`site_location` reads the site's ``[hooks] verdict_file`` as the job's user, so
both sides agree on the location without the user naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resilient_slurm import fsutil
from resilient_slurm.config import DEFAULT_PATH as CONFIG_PATH
from resilient_slurm.config import ENV_PATH as CONFIG_ENV
from resilient_slurm.config import ENV_PREFIX
from resilient_slurm.config_schema import ConfigError, tomllib
from resilient_slurm.config_source import file_text, key_line
from resilient_slurm.status import STATUSES

FORMAT = 1
DEFAULT_PATH = "/var/lib/resilient-slurm/verdicts/{node}.json"
MAX_BYTES = 256 * 1024
MAX_CODES = 20  # codes a reader keeps


@dataclass(frozen=True)
class Verdict:
    status: str
    ts: float
    codes: tuple[str, ...] = ()
    precursors: tuple[str, ...] = ()


def path_for(pattern: str, node: str) -> str:
    """``pattern`` with ``{node}`` replaced ("" for no pattern: nothing published)."""
    return pattern.replace("{node}", node) if pattern else ""


def publish(path: str, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` atomically, world-readable (raises OSError)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o755, exist_ok=True)
    fsutil.atomic_write(path, json.dumps(record, sort_keys=True) + "\n", mode=0o644)


def parse(text: str) -> Verdict | None:
    """A verdict from the published JSON; None when absent or not a verdict (never raises)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("format", FORMAT) != FORMAT:
        return None
    status = str(data.get("status", "")).lower()
    try:
        ts = float(data.get("time", 0))
    except (TypeError, ValueError):
        return None
    if status not in STATUSES or not ts > 0:
        return None
    raw = data.get("codes") or []
    codes = tuple(str(c) for c in raw)[:MAX_CODES] if isinstance(raw, list) else ()
    pre = data.get("precursors") or []
    precursors = tuple(str(c) for c in pre)[:MAX_CODES] if isinstance(pre, list) else ()
    return Verdict(status, ts, codes, precursors)


def read(path: str) -> Verdict | None:
    """:func:`parse` of the file at ``path`` (None: no path, absent, unreadable, no verdict)."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return parse(fh.read(MAX_BYTES).decode("utf-8", "replace"))
    except OSError:
        return None


def load(path: str) -> dict[str, Any] | None:
    """The whole published record, or None when absent, unreadable or not in :data:`FORMAT`."""
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_BYTES).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data


# The variable that overrides the key, as the config loader names it (its precedence).
KEY_ENV = f"{ENV_PREFIX}HOOKS_VERDICT_FILE"


@dataclass(frozen=True)
class Location:
    """Where the hooks publish verdicts, as the job side learnt it."""

    pattern: str  # {node} per node; "" when the site publishes none
    source: str  # where ``pattern`` came from, for the job's log
    warning: str = ""  # why the site's config could not be read ("" when it could)


def site_location(env: Mapping[str, str]) -> Location:
    """The site's ``[hooks] verdict_file``, read as the job's user (the file is 0644).

    Precedence (the config loader's): :data:`DEFAULT_PATH` < the file (``$RESILIENT_SLURM_CONFIG``,
    else :data:`CONFIG_PATH`) < ``$RESILIENT_SLURM_HOOKS_VERDICT_FILE``; a caller's flag or
    variable of its own goes above. Only this key is read: the job's resilient-slurm may be
    another version than the hooks', and their other keys are theirs to judge. An absent
    default file is the default; an unreadable one is the default with a ``warning``. Raises
    :class:`ConfigError` for a named file that cannot be read, a file that is not TOML, or a
    ``verdict_file`` that is not an absolute path (or empty)."""
    if KEY_ENV in env:
        pattern = env[KEY_ENV]
        _check_pattern(pattern, f"hooks.verdict_file (from ${KEY_ENV})", None, None)
        return Location(pattern, f"${KEY_ENV}")
    named = env.get(CONFIG_ENV) or ""
    path = named or CONFIG_PATH
    default = Location(DEFAULT_PATH, f"the default ({path} names none)")
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        if not named:
            return Location(DEFAULT_PATH, f"the default (no {path})")
        raise ConfigError("", f"no such file (${CONFIG_ENV})", path) from None
    except OSError as exc:
        if named:
            raise ConfigError("", f"cannot read the config file: {exc.strerror or exc}",
                              path) from None
        return Location(DEFAULT_PATH, "the default", f"cannot read {path} "
                        f"({exc.strerror or exc}): the hooks may publish elsewhere; make it "
                        "world-readable (install-hooks writes it 0644) or name the location "
                        "(--verdict-path)")
    except (ValueError, RecursionError) as exc:  # not TOML, or not UTF-8
        raise ConfigError("", f"invalid TOML: {exc}", path) from None
    hooks = data.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise ConfigError("hooks", "must be a table", path, key_line(file_text(path), "hooks"))
    if not hooks or "verdict_file" not in hooks:
        return default
    pattern = hooks["verdict_file"]
    _check_pattern(pattern, "hooks.verdict_file", path,
                   key_line(file_text(path), "hooks.verdict_file"))
    return Location(pattern, f"{path} [hooks] verdict_file")


def _check_pattern(pattern: object, key: str, path: str | None, line: int | None) -> None:
    if not isinstance(pattern, str):
        raise ConfigError(key, f"expected a string, got {type(pattern).__name__}", path, line)
    if pattern and not pattern.startswith("/"):
        raise ConfigError(key, "must be an absolute path (or empty: not published)", path, line)

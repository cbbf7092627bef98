"""Where a key sits in a TOML file: the line a config error points at (``tomllib`` gives
values, not positions)."""

from __future__ import annotations

import re


def file_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_KEY = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_HEADER = re.compile(rf"^\s*\[\[?\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]")


def _dotted(raw: str) -> str:
    parts = re.findall(_KEY_PART, raw)
    return ".".join(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def key_line(text: str, key: str) -> int | None:
    """The 1-based line of ``text`` (TOML) that sets ``key`` (``health.profiles.x.gpus``,
    ``health.storage_paths[0]``), else of the closest enclosing key or table with at least a
    section and a key (an inline table's entry: the line of its table); None when the file
    does not name it (a default, or a value that spans lines: best effort, never a guess)."""
    key = re.sub(r"\[\d+\]$", "", key)
    found: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), 1):
        head = _HEADER.match(line)
        if head:
            table = _dotted(head.group(1))
            found.setdefault(table, number)
            continue
        m = _KEY.match(line)
        if m:
            name = _dotted(m.group(1))
            found.setdefault(f"{table}.{name}" if table else name, number)
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        if n < min(2, len(parts)):
            break
        hit = found.get(".".join(parts[:n]))
        if hit is not None:
            return hit
    return None

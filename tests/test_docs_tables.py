"""Reference tables in the docs are the tables in the code: docs/events.md lists exactly the
members of ``EventKind``. No Slurm needed."""

from __future__ import annotations

import re
from pathlib import Path

from resilient_slurm.events import EventKind

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
SPAN = re.compile(r"`([^`]+)`")


def table_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of every table row (header and separator rows left out) in the sections whose
    ``##`` heading starts with ``heading``."""
    rows: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line[3:].startswith(heading)
            continue
        if not inside or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(set(c) <= set("-: ") for c in cells):
            continue  # the separator row
        rows.append(cells)
    return [r for r in rows if r[0] not in ("kind", "code", "exit")]


def documented_kinds(text: str) -> set[str]:
    """Every kind named (in backticks) in the first column of a "Kinds ..." table."""
    return {name for row in table_rows(text, "Kinds") for name in SPAN.findall(row[0])}


def test_events_doc_lists_every_event_kind() -> None:
    documented = documented_kinds((ROOT / "docs" / "events.md").read_text())
    kinds = {k.value for k in EventKind}
    assert kinds - documented == set(), "EventKind members missing from docs/events.md"
    assert documented - kinds == set(), "docs/events.md lists kinds that are no EventKind"


def test_kind_check_sees_a_missing_and_an_extra_kind() -> None:
    text = (ROOT / "docs" / "events.md").read_text()
    assert "| `recovered` |" in text
    dropped = text.replace("| `recovered` |", "| recovered |")
    assert "recovered" not in documented_kinds(dropped)
    planted = text + "\n## Kinds from nowhere\n\n| kind | when |\n|---|---|\n| `bogus` | x |\n"
    assert "bogus" in documented_kinds(planted)
    outside = text + "\n## Other\n\n| kind | when |\n|---|---|\n| `elsewhere` | x |\n"
    assert "elsewhere" not in documented_kinds(outside)

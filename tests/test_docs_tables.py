"""Reference tables in the docs are the tables in the code: docs/events.md lists exactly the
members of ``EventKind``; every exit-code table in the docs is the table of its command (the
launcher's ``EXIT_MEANINGS``, the hooks' ``HOOK_EXITS``, ``resilient-health check``'s
``CHECK_EXITS``), and each command's --help shows its table. No Slurm needed."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from resilient_slurm.events import PAYLOADS, EventKind
from resilient_slurm.healthcheck.exits import CHECK_EXITS, ExitTable, render
from resilient_slurm.hooks.exits import HOOK_EXITS
from resilient_slurm.launcher.recovery.exits import EXIT_MEANINGS

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


def documented_fields(text: str, kind: str) -> set[str]:
    """The names in backticks in the fields column of every row of ``kind`` (a row that says
    "as `other`" adds the other kind's)."""
    rows = [r for r in table_rows(text, "Kinds") if kind in SPAN.findall(r[0])]
    out: set[str] = set()
    for row in rows:
        out |= set(SPAN.findall(row[-1]))
        for other in re.findall(r"as `([^`]+)`", row[-1]):
            out |= documented_fields(text, other) if other != kind else set()
    return out


def test_events_doc_names_every_typed_payload_field() -> None:
    text = (ROOT / "docs" / "events.md").read_text()
    for kind, types in PAYLOADS.items():
        typed = set().union(*(t.__required_keys__ | t.__optional_keys__  # type: ignore[attr-defined]
                              for t in types))
        assert typed - documented_fields(text, kind) == set(), kind


def test_field_check_sees_a_missing_field() -> None:
    text = (ROOT / "docs" / "events.md").read_text()
    assert "previous_state" in documented_fields(text, "reboot")  # "as `drain`"
    assert "previous_state" not in documented_fields(
        text.replace("`previous_state`", "previous state"), "reboot")


def test_kind_check_sees_a_missing_and_an_extra_kind() -> None:
    text = (ROOT / "docs" / "events.md").read_text()
    assert "| `recovered` |" in text
    dropped = text.replace("| `recovered` |", "| recovered |")
    assert "recovered" not in documented_kinds(dropped)
    planted = text + "\n## Kinds from nowhere\n\n| kind | when |\n|---|---|\n| `bogus` | x |\n"
    assert "bogus" in documented_kinds(planted)
    outside = text + "\n## Other\n\n| kind | when |\n|---|---|\n| `elsewhere` | x |\n"
    assert "elsewhere" not in documented_kinds(outside)


# --- exit codes -----------------------------------------------------------------------------

def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def exit_tables(text: str) -> list[dict[int, str]]:
    """Every table whose header starts with ``exit``, in order: code -> meaning (plain)."""
    tables: list[dict[int, str]] = []
    current: dict[int, str] | None = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            current = None
        elif cells[0] == "exit":
            current = {}
            tables.append(current)
        elif current is not None and cells[0].isdigit():
            current[int(cells[0])] = _plain(cells[1])
    return tables


def _as_dict(table: ExitTable) -> dict[int, str]:
    return {code: _plain(meaning) for code, meaning in table}


def _doc(path: str) -> str:
    return (ROOT / path).read_text()


def test_reference_exit_tables_are_the_code_tables() -> None:
    assert exit_tables(_doc("docs/launcher.md")) == [_as_dict(EXIT_MEANINGS)]
    assert exit_tables(_doc("docs/hooks.md")) == [_as_dict(HOOK_EXITS)]
    assert exit_tables(_doc("healthcheck/README.md")) == [_as_dict(CHECK_EXITS)]


def test_readme_lists_the_same_exit_codes() -> None:
    launcher, hooks = exit_tables(_doc("README.md"))
    assert sorted(launcher) == sorted(code for code, _ in EXIT_MEANINGS)
    assert sorted(hooks) == sorted(code for code, _ in HOOK_EXITS)


def test_exit_table_check_sees_a_changed_meaning() -> None:
    text = _doc("docs/hooks.md")
    changed = text.replace("| 4 | the hook could not run", "| 4 | the hook did not run")
    assert exit_tables(changed) != [_as_dict(HOOK_EXITS)]
    assert exit_tables(text.replace("| 4 |", "| 5 |")) != [_as_dict(HOOK_EXITS)]


def test_help_shows_the_exit_tables() -> None:
    from click.testing import CliRunner

    from resilient_slurm.hooks.health_cli import main as health
    from resilient_slurm.prolog.hook import prolog_main

    def shown(out: str, table: ExitTable) -> bool:
        return _plain(render(table)) in _plain(out)

    runner = CliRunner()
    assert shown(runner.invoke(health, ["check", "--help"]).output, CHECK_EXITS)
    hook_help = _plain(runner.invoke(health, ["--help"]).output)
    assert _plain(render(HOOK_EXITS, "Exit codes with no command (the HealthCheckProgram)")) \
        in hook_help
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        prolog_main(["--help"])
    assert shown(out.getvalue(), HOOK_EXITS)

"""Every number in the docs' benchmark tables comes from a committed result that a command
wrote: it appears in a file under bench/results (a section's JSON, results.md, projection.txt).

A benchmark table is a markdown table in docs/benchmarks.md's "## Results" part, or in any
section of README.md or docs/*.md whose heading says "Measured" or "Figures" (any heading
level: the section runs to the next heading of the same or a higher level). Adding one: write
its figures to bench/results/<name>.json from the command that measures them (a ``--json``
option, or ``bench/run_all.py --only <section>``), and quote them as written there.

A number in a cell matches a results file (any file under bench/results, subfolders too) when
the same text appears there as a number, or when a more precise number there rounds to it (at
the cell's decimals; a percentage also from a fraction: 76.5% from 0.765). A loose check (a
small integer is found almost anywhere): it catches figures that no command wrote, not a
figure copied from the wrong file. Not checked: text in backticks (commands, flags), numbers
inside names (``node3``, ``p5``), and numbers in timelines (``timeline`` in a section's JSON:
every step's time would match almost any figure). No Slurm needed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
RESULTS = ROOT / "bench" / "results"
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
BENCH_HEADING = re.compile(r"measured|figures", re.IGNORECASE)
# a number not glued to a name (node3, p5, xid79) and not a version (22.05.8); a unit may follow
NUMBER = re.compile(r"(?<![\w.:/])(\d+(?:\.\d+)?)(?:\s?(?:%|s|ms|us|x|h|m|MiB|GiB|MB|KB))?"
                    r"(?![\w.]*\d)(?![A-Za-z_])")
SKIP_KEYS = frozenset({"timeline"})


@dataclass(frozen=True)
class Figure:
    doc: str
    line: int
    text: str
    row: str


def benchmark_tables(doc: str, text: str) -> Iterator[tuple[int, str]]:
    """(line number, table row) of every benchmark table row of one document."""
    stack: list[tuple[int, str]] = []  # the headings above this line: (level, text)
    for n, line in enumerate(text.splitlines(), 1):
        m = HEADING.match(line)
        if m:
            level = len(m.group(1))
            stack = [h for h in stack if h[0] < level] + [(level, m.group(2))]
            continue
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(set(c) <= set("-: ") for c in cells):
            continue
        results = doc == "docs/benchmarks.md" and any(
            lvl == 2 and h.startswith("Results") for lvl, h in stack)
        if results or any(BENCH_HEADING.search(h) for _, h in stack):
            yield n, line


def _is_header(doc_lines: list[str], n: int) -> bool:
    """Whether line ``n`` (1-based) is a table's header row (the separator follows it)."""
    nxt = doc_lines[n] if n < len(doc_lines) else ""
    return bool(nxt.startswith("|")) and set(nxt.replace("|", "").strip()) <= set("-: ")


def figures(doc: str, text: str) -> list[Figure]:
    lines = text.splitlines()
    out = []
    for n, row in benchmark_tables(doc, text):
        if _is_header(lines, n):
            continue
        plain = re.sub(r"`[^`]*`", " ", row)
        out += [Figure(doc, n, m.group(1), row) for m in NUMBER.finditer(plain)]
    return out


def _numbers(value: Any, key: str = "") -> Iterator[str]:
    if key in SKIP_KEYS:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v, key)
    elif isinstance(value, bool):
        return
    elif isinstance(value, int | float):
        yield repr(abs(value))
    elif isinstance(value, str):
        yield from NUMBER_IN_TEXT.findall(value)


NUMBER_IN_TEXT = re.compile(r"\d+(?:\.\d+)?")


def _decimals(text: str) -> int:
    return len(text.split(".")[1]) if "." in text else 0


def result_numbers(folder: Path = RESULTS) -> tuple[set[str], list[tuple[float, int]]]:
    """Every number in the results files (recursively): as text, and as (value, decimals)."""
    texts: set[str] = set()
    for p in sorted(folder.rglob("*")):
        if p.suffix == ".json":
            try:
                texts.update(_numbers(json.loads(p.read_text())))
            except ValueError:
                continue
        elif p.suffix in (".md", ".txt"):
            texts.update(NUMBER_IN_TEXT.findall(p.read_text()))
    return texts, sorted({(float(t), _decimals(t)) for t in texts})


def sourced(fig: str, texts: set[str], values: list[tuple[float, int]]) -> bool:
    """The figure is there as written, or is a rounding of a more precise number there (or of
    a fraction there, as a percentage)."""
    if fig in texts:
        return True
    decimals, want = _decimals(fig), float(fig)
    return any(round(v * scale, decimals) == want
               for v, d in values for scale, extra in ((1, 0), (100, 2)) if d > decimals - extra)


def unsourced(docs: dict[str, str], folder: Path = RESULTS) -> list[Figure]:
    texts, values = result_numbers(folder)
    return [f for doc, text in docs.items() for f in figures(doc, text)
            if not sourced(f.text, texts, values)]


def _docs() -> dict[str, str]:
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths}


def test_every_figure_in_the_docs_benchmark_tables_has_a_result_file() -> None:
    missing = unsourced(_docs())
    assert not missing, (
        f"{len(missing)} figure(s) in the docs' benchmark tables appear in no file under "
        "bench/results (write them there from the command that measures them, or remove "
        "them; tests/test_docs_figures.py says what counts):\n" + "\n".join(
            f"  {f.doc}:{f.line}: {f.text!r} in {f.row.strip()[:110]}" for f in missing))


def test_checker_finds_a_planted_figure(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps(
        {"wall_s": 237.9, "goodput": 0.765, "timeline": {"steps": [[37.0, 1]]}}))
    doc = ("# Benchmarks\n\n## Sections\n\n| a | b |\n|---|---|\n| 99.9 | 1 |\n\n"
           "## Results\n\n### One\n\n| mechanism | wall s | goodput | other |\n|---|---|---|---|\n"
           "| `cmd --rounds 7` node3 | 238 | 76.5% | 37.0 s |\n\n## After\n\n| x |\n|---|\n"
           "| 12345 |\n")
    got = unsourced({"docs/benchmarks.md": doc}, tmp_path)
    assert [(f.line, f.text) for f in got] == [(15, "37.0")]
    other = ("# Page\n\n## Measured\n\n| fault | s |\n|---|---|\n| hang | 21.4 s |\n"
             "| sigkill | 238-240 s, -1.02 s |\n\n## Use\n\n| a |\n|---|\n| 55.5 |\n")
    got = unsourced({"docs/x.md": other}, tmp_path)
    assert [(f.doc, f.line, f.text) for f in got] == [
        ("docs/x.md", 7, "21.4"), ("docs/x.md", 8, "240"), ("docs/x.md", 8, "1.02")]


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _keys(v)


def test_no_hand_written_note_in_a_results_file() -> None:
    """A results file holds what its command wrote: no ``note`` added by hand (a remark goes
    in the docs, beside the figure, or into the command's output)."""
    noted = [str(p.relative_to(ROOT)) for p in sorted(RESULTS.rglob("*.json"))
             if "note" in set(_keys(json.loads(p.read_text())))]
    assert not noted, f"results files with a hand-written 'note': {noted}"

"""Claims in README.md and the docs that have a source: what NVRx's own release notes say
(recorded verbatim from the tagged release), and the measured restart times (from the
committed benchmark results). No Slurm needed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
NOTES = ROOT / "tests" / "launcher" / "nvrx_output" / "0.6.0" / "release-notes-deprecations.md"
HEADLINE = ROOT / "bench" / "results" / "compare-production-sparse.json"


def _flat(text: str) -> str:
    return " ".join(text.split())


def deprecation_paragraph(doc: str) -> str:
    """The paragraph of docs/inprocess.md that starts "**Built on a deprecated API.**"."""
    start = doc.index("**Built on a deprecated API.**")
    return doc[start:doc.index("\n\n", start)]


def test_inprocess_doc_quotes_nvrx_verbatim() -> None:
    doc = (ROOT / "docs" / "inprocess.md").read_text()
    notes = _flat(NOTES.read_text())
    para = deprecation_paragraph(doc)
    quotes = re.findall(r'"([^"]+)"', para)
    assert any("In-process restart is deprecated in v0.6" in q for q in quotes), para
    for quote in quotes:
        assert _flat(quote) in notes, f"not in NVRx v0.6.0's release notes: {quote!r}"
    assert "ptl_resiliency" in para and "ft_launcher" in para
    assert "neither release" not in _flat(doc), "docs/inprocess.md denies the deprecation"


def test_recorded_notes_are_the_tagged_release() -> None:
    first = NOTES.read_text().splitlines()[0]
    assert "tag v0.6.0" in first and "docs/source/release-notes.md" in first
    assert "In-process restart is deprecated in v0.6" in NOTES.read_text()


def test_inprocess_help_says_it_is_built_on_a_deprecated_api() -> None:
    from resilient_slurm.launcher.cli import main

    out = _flat(CliRunner().invoke(main, ["--help"], terminal_width=200).output)
    part = out[out.index("--inprocess"):]
    part = part[:part.index("--dry-run")]
    assert "deprecated" in part and "in-job restart" in part and "--spares" in part, part


def _range(mech: str, handled_by: str) -> str:
    runs = {r["mechanism"]: r for r in json.loads(HEADLINE.read_text())["runs"]}
    got = [f["recovery_s"] for f in runs[mech]["faults"] if f["handled_by"] == handled_by]
    assert got, (mech, handled_by)
    return f"{min(got):.0f}-{max(got):.0f} s"


def test_readme_quotes_the_measured_restart_ranges() -> None:
    """"in seconds" was a claim; the measured ranges from the headline comparison replace it,
    each scoped to its mechanism."""
    readme = _flat((ROOT / "README.md").read_text())
    injob = _range("resilient-launch", "in-job restart")
    assert f"in-job restarts ({injob} from a fault to the next step" in readme, injob
    assert f"(in-job restart: {injob} from the fault to the next step" in readme
    level0 = _range("resilient-launch --inprocess", "in-process restart")
    assert f"recovers in the live processes ({level0} in the same benchmark)" in readme, level0
    for doc in ("README.md", "docs/launcher.md"):
        text = _flat((ROOT / doc).read_text())
        assert not re.search(r"restart(s|ed)? (inside the job )?in seconds", text), doc

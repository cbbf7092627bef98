"""The published-verdict file is one contract (``resilient_slurm.verdict_file``): what the hooks
write is what the launcher reads, under one default path, and its parser never raises."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm import verdict_file
from resilient_slurm.healthcheck.model import Report, Result
from resilient_slurm.hooks import verdict
from resilient_slurm.hooks.config import HooksConfig


def test_what_the_hooks_publish_the_launcher_reads(tmp_path: Path) -> None:
    rep = Report("n9", [Result("xid", "fail", "XID79", "lost", device="gpu3"),
                        Result("ecc", "fail", "ECC_DBE", "dbe")])
    now = time.time()
    path = verdict_file.path_for(str(tmp_path / "v" / "{node}.json"), "n9")
    verdict_file.publish(path, verdict.verdict_record(rep, "health", None, now=now))
    assert verdict_file.read(path) == verdict_file.Verdict("fail", round(now, 3),
                                                           ("XID79", "ECC_DBE"))
    rec = verdict_file.load(path)
    assert rec is not None and rec["format"] == verdict_file.FORMAT and rec["node"] == "n9"
    assert (Path(path).stat().st_mode & 0o777) == 0o644


def test_one_default_path_for_both_sides() -> None:
    from click.testing import CliRunner

    from resilient_slurm.launcher.cli import main

    assert HooksConfig().verdict_file == verdict_file.DEFAULT_PATH
    out = CliRunner().invoke(main, ["--help"], terminal_width=200).output
    assert verdict_file.DEFAULT_PATH in out  # --verdict-path's default


def test_load_wants_the_format_read_takes_it_as_1(tmp_path: Path) -> None:
    p = tmp_path / "v.json"
    p.write_text(json.dumps({"status": "ok", "time": 5.0}))
    assert verdict_file.load(str(p)) is None
    assert verdict_file.read(str(p)) == verdict_file.Verdict("ok", 5.0)
    assert verdict_file.read("") is None and verdict_file.load(str(tmp_path / "none")) is None


JSON = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                    lambda kids: st.lists(kids) | st.dictionaries(st.text(), kids), max_leaves=20)
FIELDS = st.fixed_dictionaries({}, optional={
    "format": JSON, "status": st.sampled_from(["ok", "FAIL", "warn", "x"]) | JSON,
    "time": st.floats() | st.integers() | JSON, "codes": st.lists(st.text()) | JSON})


@given(st.text() | JSON.map(json.dumps) | FIELDS.map(json.dumps))
def test_parse_never_raises_and_keeps_only_verdicts(text: str) -> None:
    v = verdict_file.parse(text)
    if v is not None:
        assert v.status in ("ok", "warn", "fail", "unknown") and v.ts > 0
        assert len(v.codes) <= verdict_file.MAX_CODES

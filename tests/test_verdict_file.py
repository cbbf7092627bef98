"""The published-verdict file is one contract (``resilient_slurm.verdict_file``): what the hooks
write is what the launcher reads, under one default path, and its parser never raises."""

from __future__ import annotations

import json
import re
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
    unwrapped = re.sub(r"\s*\n\s*", "", out)
    # --verdict-path's default: the site's [hooks] verdict_file, else the hooks' own default
    assert "the site config's [hooks] verdict_file" in " ".join(out.split())
    assert verdict_file.DEFAULT_PATH in unwrapped


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


# --------------------------------------------------------------------------- where they live


def _site(tmp_path: Path, text: str) -> dict[str, str]:
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    return {"RESILIENT_SLURM_CONFIG": str(cfg)}


def test_the_job_side_reads_the_location_from_the_sites_config(tmp_path: Path) -> None:
    env = _site(tmp_path, '[hooks]\nverdict_file = "/shared/verdicts/{node}.json"\n'
                          "[health]\nnot_a_key_this_version_knows = 1\n")
    got = verdict_file.site_location(env)
    assert got.pattern == "/shared/verdicts/{node}.json" and not got.warning
    assert got.source == f"{env['RESILIENT_SLURM_CONFIG']} [hooks] verdict_file"
    # precedence: defaults < file < env (the config loader's variable for the key)
    env["RESILIENT_SLURM_HOOKS_VERDICT_FILE"] = "/elsewhere/{node}.json"
    assert verdict_file.site_location(env).pattern == "/elsewhere/{node}.json"
    env["RESILIENT_SLURM_HOOKS_VERDICT_FILE"] = ""
    assert verdict_file.site_location(env).pattern == ""  # the site publishes none
    # a file without the key: the hooks' own default, which is the launcher's
    got = verdict_file.site_location(_site(tmp_path, "[hooks]\nresume_after = 2\n"))
    assert got.pattern == verdict_file.DEFAULT_PATH == HooksConfig().verdict_file


def test_a_broken_or_missing_named_config_is_an_error_naming_it(tmp_path: Path) -> None:
    import pytest

    from resilient_slurm.config_schema import ConfigError

    with pytest.raises(ConfigError, match=r"config\.toml:3: config key 'hooks\.verdict_file'"
                                          r": must be an absolute path"):
        verdict_file.site_location(_site(tmp_path, '# site\n[hooks]\nverdict_file = "v.json"\n'))
    with pytest.raises(ConfigError, match="expected a string, got int"):
        verdict_file.site_location(_site(tmp_path, "[hooks]\nverdict_file = 3\n"))
    with pytest.raises(ConfigError, match="invalid TOML"):
        verdict_file.site_location(_site(tmp_path, "[hooks\n"))
    with pytest.raises(ConfigError, match="no such file"):
        verdict_file.site_location({"RESILIENT_SLURM_CONFIG": str(tmp_path / "none.toml")})


def test_an_unreadable_default_config_is_a_warning_not_silence(tmp_path: Path,
                                                               monkeypatch) -> None:
    monkeypatch.setattr(verdict_file, "CONFIG_PATH", str(tmp_path))  # a directory: unreadable
    got = verdict_file.site_location({})
    assert got.pattern == verdict_file.DEFAULT_PATH
    assert got.warning.startswith(f"cannot read {tmp_path} (")
    monkeypatch.setattr(verdict_file, "CONFIG_PATH", str(tmp_path / "absent.toml"))
    got = verdict_file.site_location({})
    assert (got.pattern, got.warning) == (verdict_file.DEFAULT_PATH, "")
    assert "no " + str(tmp_path / "absent.toml") in got.source


def test_the_on_node_reader_says_why_it_read_nothing(tmp_path: Path, capsys,
                                                     monkeypatch) -> None:
    """``launcher/recovery/published.py`` (run on a node by ``srun --overlap``): a verdict file it
    cannot read is exit 1 and one JSON line on stdout saying why, which the launcher records
    (its node shim keeps stdout) and names in the job's log."""
    from resilient_slurm.launcher.recovery import evidence, published

    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    pattern = str(tmp_path / "none" / "{node}.json")
    assert published.main([pattern]) == 1
    said = json.loads(capsys.readouterr().out)
    assert said == {"unreadable": f"{tmp_path}/none/n1.json: No such file or directory"}
    rec = {"rc": 1, "stdout": json.dumps(said) + "\n"}
    assert evidence._why_unread(rec, pattern, "n1") == said["unreadable"]
    assert "did not report" in evidence._why_unread(None, pattern, "n1")


def test_precursors_are_published_and_read_and_older_records_have_none(tmp_path: Path) -> None:
    rep = Report("n9", [Result("row_remap", "warn", "ROW_REMAP_PENDING", "gpu2: remap pending",
                               device="gpu2")])
    path = verdict_file.path_for(str(tmp_path / "v" / "{node}.json"), "n9")
    verdict_file.publish(path, verdict.verdict_record(rep, "watch", None,
                                                      precursors=["ROW_REMAP_PENDING"]))
    v = verdict_file.read(path)
    assert v is not None and (v.status, v.codes, v.precursors) == (
        "warn", (), ("ROW_REMAP_PENDING",))
    rec = verdict_file.load(path)
    assert rec is not None and rec["healthy"] is True
    assert rec["reason"] == "precursor: gpu2: remap pending"
    old = verdict_file.parse(json.dumps({"format": 1, "status": "ok", "time": 5.0}))
    assert old is not None and old.precursors == ()
    odd = verdict_file.parse(json.dumps({"status": "warn", "time": 5.0, "precursors": "X"}))
    assert odd is not None and odd.precursors == ()  # not a list: none

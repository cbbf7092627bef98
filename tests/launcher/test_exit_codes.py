"""resilient-launch's exit codes are defined once (``launcher/recovery/exits.py``) and --help is
rendered from that table: every ``EXIT_*`` status has a meaning and --help lists each."""

from __future__ import annotations

from click.testing import CliRunner

from resilient_slurm.launcher.cli import main
from resilient_slurm.launcher.recovery import exits


def test_every_exit_status_has_one_meaning() -> None:
    statuses = {v for k, v in vars(exits).items() if k.startswith("EXIT_")
                and isinstance(v, int)}
    codes = [code for code, _ in exits.EXIT_MEANINGS]
    assert len(codes) == len(set(codes))
    assert set(codes) == statuses


def test_help_lists_each_exit_code_with_its_meaning() -> None:
    out = CliRunner().invoke(main, ["--help"], terminal_width=200).output
    section = out[out.index("Exit codes:"):]
    for code, meaning in exits.EXIT_MEANINGS:
        first = meaning.split("\n")[0]
        assert f"{code}  {first}" in section, (code, first)

"""Slurm is never faked in the tests: no stand-in backend object (a class with the seam's
methods) and no fake Slurm command written for PATH. What calls Slurm calls the sandbox
(tests/conftest.py); pure functions are tested pure. Hardware fakes are fine (the seams in
healthcheck/)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TOOLS = "srun|scontrol|sinfo|squeue|sbatch|scancel|salloc|sacct"
PATTERNS = {
    # an object standing in for the Slurm seam (launcher, hooks and sandbox call these)
    "stand-in backend": re.compile(
        r"def (requeue|drain|resume|set_excluded|set_request|signal_step|kill_wait|submit|"
        r"release|shrink|reboot_asap|nodes|node|jobs|job)\(self\b"),
    # a fake command: a table of scripts by tool name, or a file named after a tool
    "fake Slurm command": re.compile(
        rf"[\"']({TOOLS})[\"']\s*:|/\s*[\"']({TOOLS})[\"']\s*\)?\s*\.(write_text|open)\b|"
        rf"join\([^)]*[\"']({TOOLS})[\"']\s*\)"),
}


def offences(text: str) -> list[str]:
    """What in ``text`` fakes Slurm: a fake command, or two or more of the seam's methods
    defined (one alone, a lock's ``release``, is not a backend)."""
    found = {what: [m.group(0) for m in rx.finditer(text)] for what, rx in PATTERNS.items()}
    if len(set(found["stand-in backend"])) < 2:
        found["stand-in backend"] = []
    return [f"{what}: {hit}" for what, hits in found.items() for hit in hits]


def test_the_patterns_catch_what_they_are_for() -> None:
    assert offences("class FakeSlurm:\n    def requeue(self, job_id): ...\n"
                    "    def job(self, job_id): ...\n")
    assert offences('FAKES = {"srun": "exec \\"$@\\"\\n"}')
    assert offences('(bindir / "scontrol").write_text("#!/bin/sh")')
    assert offences('open(os.path.join(bindir, "sinfo"), "w")')
    assert not offences('slurm.requeue(jid)\nsubprocess.run(["scontrol", "show", "job"])')
    assert not offences("class CountingLock:\n    def release(self) -> None: ...\n")


def test_no_test_fakes_slurm() -> None:
    found = {str(p.relative_to(TESTS)): hits for p in sorted(TESTS.rglob("*.py"))
             if p != Path(__file__).resolve() and (hits := offences(p.read_text()))}
    assert found == {}, found

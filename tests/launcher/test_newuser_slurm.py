"""Issue 36 item 9, as a new user meets the sandbox: ``eval "$(resilient-slurm sandbox env)"``,
then the shipped template (``sbatch/fsdp.sbatch``) on 4 nodes with ``--spares 1``, submitted
as the job user, and no location of anything named by hand. A training node's GPU falls off
the bus (``sandbox fault NODE xid79``) while the job trains.

The launcher learns where the hooks publish verdicts from the site's config (the sandbox's,
through ``$RESILIENT_SLURM_CONFIG``) and says so in the job's log; the standby's fresh ``ok``
verdict qualifies it, and it takes the bad node's place: no requeue. Before, the launcher read
its own default location, every read failed, the healthy spare was skipped and the job was
requeued."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import (  # type: ignore[import-not-found]
    kinds,
    log_of,
    submit,
    wait_job,
    wait_step,
)

pytestmark = pytest.mark.slurm

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "sbatch" / "fsdp.sbatch"
BIN = os.path.dirname(sys.executable)


def sandbox_env(root: str) -> dict[str, str]:
    """What ``eval "$(resilient-slurm sandbox env)"`` sets."""
    out = subprocess.run([os.path.join(BIN, "resilient-slurm"), "sandbox", "env", "--dir", root],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    found = {}
    for line in out.splitlines():
        word, assignment = shlex.split(line)
        assert word == "export", line
        name, value = assignment.split("=", 1)
        found[name] = value
    return found


def test_a_new_users_job_gets_its_spare_from_the_sites_verdicts(clean, slurm, job_user):
    exported = sandbox_env(clean.root)
    # node memory of each node's own: the sandbox's TaskProlog fills in {node} per task
    assert "{node}" in exported["RESILIENT_SANDBOX_TIER1_DIR"]
    assert "RESILIENT_TIER1_DIR" not in exported
    work = job_user.make_dir(mode=0o755)
    ckpt = os.path.join(work, "ck")
    env = {**exported, "RESILIENT_LAUNCH_ARGS": "--spares 1", "FT_TERM_TIMEOUT": "3"}
    res = job_user.run(clean, ["sbatch", "--parsable", "--nodes=4", f"--chdir={work}",
                               f"--output={work}/slurm-%j.out", str(TEMPLATE), "--steps=120",
                               f"--checkpoint-dir={ckpt}", "--checkpoint-every=2",
                               "--step-sleep=0.3", "--threads=1", "--log-every=1"],
                       env=env, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    state = os.path.join(ckpt, ".resilient")
    log = Path(work) / f"slurm-{jid}.out"
    victim = ""
    try:
        wait_step(state, 5, timeout=240)
        job = slurm.job(jid)
        training = kinds(state, "cycle_start")[0]["nodes"]
        victim = next(n for n in training if n != job.extra.get("batch_host"))
        subprocess.run([os.path.join(BIN, "resilient-slurm"), "sandbox", "fault", victim,
                        "xid79", "--dir", clean.root], check=True, timeout=60,
                       capture_output=True)
        job = wait_job(slurm, jid, timeout=420)
        text = log.read_text(errors="replace")
        config = exported["RESILIENT_SLURM_CONFIG"]
        assert (f"health verdicts: {clean.p('verdicts', '{node}.json')} ({config} [hooks] "
                "verdict_file)") in text, text[-4000:]
        assert job.state == "COMPLETED", text[-4000:]
        why = f"spare events {kinds(state, 'spare')}; {text[-3000:]}"
        assert not kinds(state, "requeue") and job.restart_count == 0, why
        swaps = [e for e in kinds(state, "spare") if e.get("node")]
        assert [e["out"] for e in swaps] == [victim], why
        assert swaps[0]["node"] not in training
        assert f"spare {swaps[0]['node']} in for {victim}" in text
    finally:
        if victim:
            subprocess.run([os.path.join(BIN, "resilient-slurm"), "sandbox", "fault", victim,
                            "clear", "--dir", clean.root], check=False, timeout=60,
                           capture_output=True)
        if slurm.job(jid).state not in ("COMPLETED", "FAILED", "CANCELLED"):
            slurm.cancel(jid)


def test_a_standby_skipped_for_an_unreadable_verdict_is_said_and_recorded(clean, slurm,
                                                                           tmp_path):
    """The verdicts where the launcher looks do not exist (a site whose hooks publish
    elsewhere): every read fails, on the node too. Each failed read is a ``verdict_unread``
    event and a line in the job's log naming the node and why; the standby that cannot
    qualify without its verdict is named with that reason, although the job then requeues
    (here: no requeue left, exit 4). Before, the reads failed silently and the skipped spare
    was recorded nowhere."""
    missing = "/nonexistent/verdicts/{node}.json"
    jid, _, state = submit(slurm, clean, tmp_path, 3,
                           ["--spares=1", "--max-restarts=0", "--max-requeues=0",
                            "--verdict-wait=30", f"--verdict-path={missing}"],
                           ["--fault=node@5@node2"], ("--nodelist=node[1-3]",), steps=40)
    job = wait_job(slurm, jid, timeout=300)
    log = log_of(tmp_path, jid)
    assert job.state == "FAILED" and "budget-exhausted" in log, log[-4000:]
    why = "/nonexistent/verdicts/node3.json: No such file or directory"
    unread = {e["purpose"]: e["nodes"] for e in kinds(state, "verdict_unread")}
    assert unread.get("spares") == {"node3": why}, (unread, log[-4000:])
    assert "node2" in unread.get("blame", {}), unread
    skipped = [e for e in kinds(state, "spare") if not e.get("node")]
    assert skipped and skipped[0]["unswapped"] == ["node2"], skipped
    assert skipped[0]["skipped"] == {"node3": f"its health verdict could not be read ({why})"}
    assert f"cannot read the hooks' verdict of node3 (for spares): {why}" in log
    assert (f"no healthy spare for node2: shrink (--min-nodes) or requeue; skipped node3: its "
            f"health verdict could not be read ({why})") in log


def test_a_configuration_error_fails_the_job_at_once_with_its_message(clean, slurm, tmp_path):
    """The memory tiers of 3 nodes given one folder (the sandbox's template without ``{node}``:
    every node's ``RESILIENT_TIER1_DIR`` the same, where the sandbox's nodes share one host):
    every rank meets the same error at its first snapshot, and no restart can fix it. The
    launcher stops the step on the first report and ends the job with the message: verdict
    ``config-error``, exit 2, in its first cycle, no in-job restart (each rank reported once),
    no requeue. Before, ft_launcher
    restarted the ranks into the same error, then the job was requeued."""
    shared = tmp_path / "one-folder"
    jid, _, state = submit(slurm, clean, tmp_path, 3, ["--max-restarts=3", "--max-requeues=2"],
                           ["--memory-tiers"], steps=20, tier1_dir=str(shared))
    job = wait_job(slurm, jid, timeout=300)
    log = log_of(tmp_path, jid)
    assert (job.state, job.exit_code, job.restart_count) == ("FAILED", 2, 0), log[-4000:]
    (verdict,) = kinds(state, "verdict")
    assert (verdict["verdict"], verdict["exit_code"]) == ("config-error", 2), verdict
    # the first report wins: the rank that found another node's stamp ("... is also node X's
    # ...") or one that saw that a peer reported it ("another rank's node memory folder ...")
    assert "each node needs a folder of its own (RESILIENT_TIER1_DIR)" in verdict["message"], \
        verdict
    assert ("is also node" in verdict["message"]
            or "another rank's node memory folder is shared" in verdict["message"]), verdict
    assert "resilient-launch: config-error: " in log and "(exit 2)" in log, log[-3000:]
    assert len(kinds(state, "cycle_start")) == 1 and not kinds(state, "requeue")
    assert not kinds(state, "blame"), "nothing to blame: the job ends on the error"
    reported = kinds(state, "config_error")
    assert sorted(e["rank"] for e in reported) == [0, 1, 2], reported  # once each: no restart

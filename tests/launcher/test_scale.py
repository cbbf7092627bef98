"""Scale limits: no argv string carries the whole node list; events never become invalid JSON;
the one-line job record of Slurm 22.05 parses; started records and one-time signal relay."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from resilient_slurm.events import MAX_EVENT_BYTES, EventKind, EventLog, read_events
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.recovery import evidence
from resilient_slurm.slurm.parse import _job_from_oneliner, parse_oneliner

MAX_ARG_STRLEN = 128 * 1024  # Linux: one argv string may not exceed this


def test_no_argv_string_carries_3000_nodes(tmp_path) -> None:
    # Names that do not compress (every other number, mixed prefixes), as on a big cluster.
    nodes = [f"gpu-{r}-{i:05d}" for r in ("a", "b", "c") for i in range(0, 2 * 1500, 2)]
    a = plan.Allocation(job_id=9, nodes=tuple(nodes))
    addrs = {n: f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i, n in enumerate(nodes)}
    cycle = plan.plan_cycle(a, plan.LaunchOptions(script="t.py"), plan.Features(frozenset()),
                          nodes, addrs, 1, str(tmp_path))
    longest = max(len(x.encode()) for x in cycle.argv)
    assert longest <= plan.NODELIST_ARG_MAX + 100, longest
    assert sum(len(x) for x in cycle.argv) < MAX_ARG_STRLEN
    files = dict(cycle.files)
    nodefile = next(p for p in files if p.endswith("nodelist"))
    assert f"--nodefile={nodefile}" in cycle.argv
    assert files[nodefile].split() == nodes


def test_oversized_event_stays_valid_json(tmp_path) -> None:
    p = str(tmp_path / "e.jsonl")
    log = EventLog(p, "launcher", job=7)
    nodes = [f"gpu-a-{i:05d}" for i in range(0, 12000, 2)]  # a cycle on 6,000 nodes
    log.emit(EventKind.CYCLE_START, cycle=1, nodes=nodes, argv=["srun", ",".join(nodes)],
             blamed={"n1": ["z"]})
    log.emit(EventKind.CYCLE_END, ok=True)
    raw = open(p, encoding="utf-8").read().splitlines()
    assert all(len(line.encode()) <= MAX_EVENT_BYTES for line in raw)
    got = list(read_events(p))
    assert [e["kind"] for e in got] == ["cycle_start", "cycle_end"]  # nothing skipped as torn
    assert got[0]["job"] == 7 and got[0]["blamed"] == {"n1": ["z"]} and got[0]["cycle"] == 1
    assert set(got[0]["truncated"]) >= {"argv", "nodes"}


LINE_2205 = ("JobId=42 JobName=train run UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A "
             "Priority=0 Nice=0 Account=(null) QOS=(null) JobState=PENDING "
             "Reason=JobHeldUser Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 "
             "Reboot=0 ExitCode=0:15 NodeList=(null) BatchHost=node1 NumNodes=3-3 "
             "ReqNodeList=node[1-3] ExcNodeList=node[7,9] Comment=my comment here "
             "Partition=debug")


def test_one_line_job_record_of_2205() -> None:
    f = parse_oneliner(LINE_2205)
    assert f["JobName"] == "train run" and f["Comment"] == "my comment here"
    job = _job_from_oneliner(f)
    assert (job.job_id, job.state, job.held, job.restart_count) == (42, "PENDING", True, 2)
    assert job.required == ("node1", "node2", "node3") and job.excluded == ("node7", "node9")
    assert job.nodes == () and job.requeue and job.extra["user_name"] == "alice"


CHILD = """
import signal, sys, time
n = 0
def h(s, f):
    global n
    n += 1
    print("TERM", n, flush=True)
signal.signal(signal.SIGTERM, h)
print("ready", flush=True)
deadline = time.time() + 20
while time.time() < deadline and n == 0:
    time.sleep(0.05)
time.sleep(1)
sys.exit(7 if n == 1 else 9)
"""


def test_shim_started_record_and_signal_relayed_once(tmp_path) -> None:
    rec = tmp_path / "rec"
    env = {**os.environ, "SLURMD_NODENAME": "node5", "SLURM_STEP_ID": "3"}
    argv = [sys.executable, "-m", "resilient_slurm.launcher.shim.node", f"--record-dir={rec}",
            "--", sys.executable, "-c", CHILD]
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    started = json.loads((rec / "node5.started.json").read_text())
    assert started["step"] == "3" and "signalled" not in started
    assert evidence.step_id(str(rec)) == "3"
    p.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    p.send_signal(signal.SIGTERM)  # Slurm signals the whole step too: relay only once
    assert p.wait(timeout=30) == 7
    started = json.loads((rec / "node5.started.json").read_text())
    assert started["signal"] == "SIGTERM" and started["signalled"] > 0
    assert evidence.exit_records(str(rec))["node5"]["rc"] == 7  # not the started record


def test_published_verdict_format_1() -> None:
    from resilient_slurm import verdict_file as published

    # docs/hooks.md's example, verbatim fields
    text = json.dumps({"format": 1, "node": "node3", "status": "fail", "healthy": False,
                       "codes": ["XID79", "GPU_LOST"], "reason": "Xid 79 on gpu3",
                       "source": "health", "job": None, "check_set": "periodic",
                       "simulated": True, "time": 1795961620.491,
                       "time_iso": "2026-11-29T14:13:40+00:00"})
    assert published.parse(text) == published.Verdict("fail", 1795961620.491,
                                                      ("XID79", "GPU_LOST"))
    assert published.parse(text.replace('"format": 1', '"format": 2')) is None
    assert published.parse("{torn") is None and published.parse("[]") is None
    assert published.parse(json.dumps({"status": "great", "time": 5})) is None
    assert published.path_for(published.DEFAULT_PATH, "n1").endswith("/verdicts/n1.json")

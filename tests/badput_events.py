"""A job's events with known badput (tests of launcher/report/badput.py and the fleet command)."""

from __future__ import annotations

from typing import Any


def job_events(hang: bool = False) -> list[dict[str, Any]]:
    """Submitted at 1000; an exception on n2 (in-job restart, rolled back 5 steps), then a node
    fault on n1 (requeue, 20 s wait); 20 steps in all; 4 ranks."""
    out: list[dict[str, Any]] = []

    def ev(ts: float, kind: str, source: str = "launcher", **kw: Any) -> None:
        out.append({"ts": 1000 + ts, "kind": kind, "source": source, **kw})

    ev(10, "launch_start", nodes=["n1", "n2"])
    ev(11, "cycle_start", cycle=1, nodes=["n1", "n2"], nproc_per_node="2")
    ev(15, "resume", "training", step=0)
    for i in range(1, 11):
        ev(15 + i, "progress", "training", step=i)
    ev(25.5, "fault", "training", type="hang" if hang else "exception", node="n2", step=10)
    if hang:
        ev(27.5, "hang_detected", rank=3, node="n2", waited_s=2)
    ev(28, "rendezvous", node="n1")
    ev(30, "resume", "training", step=5)
    for i in range(6, 13):
        ev(30 + i - 5, "progress", "training", step=i)
    ev(37.5, "fault", "training", type="node", node="n1", step=12)
    ev(38, "cycle_end", cycle=1, rc=1)
    ev(40, "requeue", reason="node fault")
    ev(60, "launch_start", nodes=["n2", "n3"])
    ev(61, "cycle_start", cycle=1, nodes=["n2", "n3"], nproc_per_node="2")
    ev(65, "resume", "training", step=10)
    for i in range(11, 21):
        ev(65 + i - 10, "progress", "training", step=i)
    ev(75, "checkpoint", "training", step=20, save_s=1.5)
    ev(76, "cycle_end", cycle=1, rc=0)
    ev(77, "verdict", verdict="completed")
    return out

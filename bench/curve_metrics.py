"""The cost curve's metrics (what ``render`` tabulates, ``charts`` plots, ``run_all`` fits):
(mode, dotted key in a point, label), and how one is read from a measured point."""

from __future__ import annotations

from typing import Any

CURVE_METRICS = (("in-allocation", "submit_to_first_step_s", "submission -> first step"),
                 ("in-allocation", "fault_to_blame_s", "node fault -> blame (evidence gathered)"),
                 ("in-allocation", "fault_to_resumed_s", "node fault -> resumed, in-allocation"),
                 ("by requeue", "fault_to_resumed_s", "node fault -> resumed, by requeue"),
                 ("in-allocation", "rpc.hooks_per_node_per_interval",
                  "hooks' node RPCs per healthy node per health interval"),
                 ("in-allocation", "rpc.job_user_per_interval",
                  "launcher's (job user's) RPCs per health interval"))


def metric(point: dict[str, Any], mode: str, key: str) -> float | None:
    cur: Any = point.get(mode, {})
    for k in key.split("."):
        cur = cur.get(k) if isinstance(cur, dict) else None
    return float(cur) if isinstance(cur, (int, float)) else None

"""The CLI backend's JSON parsing on the shapes real Slurm prints (no cluster needed).

The samples are trimmed copies of what the sandbox's controllers printed: Slurm 22.05
(``squeue --json``, ``sinfo --json``: states as strings plus ``state_flags``) and Slurm 24.11
(``scontrol --json show jobs|nodes``: states as lists, numbers wrapped in
``{"set", "infinite", "number"}``). Both stages of CI run the same behaviour on a real cluster.
"""

from __future__ import annotations

import pytest

from resilient_slurm.slurm.parse import _job_from_json, _node_from_json


def _n(number: int, set_: bool = True) -> dict[str, object]:
    return {"set": set_, "infinite": False, "number": number}


def _exit_24(code: int) -> dict[str, object]:
    return {"status": ["SUCCESS" if code == 0 else "ERROR"], "return_code": _n(code),
            "signal": {"id": _n(0, False), "name": ""}}


JOB_24 = {"job_id": 1, "name": "wrap", "nodes": "node2", "restart_cnt": 0, "requeue": True,
          "excluded_nodes": "", "required_nodes": "node2", "batch_host": "node2",
          "partition": "debug", "user_name": "root", "comment": ""}
JOB_22 = {"job_id": 1, "name": "wrap", "nodes": "node2", "restart_cnt": 0, "requeue": True,
          "excluded_nodes": "", "required_nodes": "node2"}


@pytest.mark.parametrize(("job_state_24", "expected"), [
    (["PENDING"], "PENDING"),
    (["RUNNING"], "RUNNING"),
    # Finished, epilog still running: Slurm itself (squeue, 22.05's JSON) says COMPLETING.
    (["COMPLETED", "COMPLETING"], "COMPLETING"),
    (["FAILED", "COMPLETING"], "COMPLETING"),
    (["COMPLETED"], "COMPLETED"),
    (["PENDING", "REQUEUED"], "REQUEUED"),
    (["PENDING", "REQUEUE_HOLD"], "REQUEUE_HOLD"),
    (["RUNNING", "CONFIGURING"], "CONFIGURING"),
    (["PENDING", "LAUNCH_FAILED"], "PENDING"),  # a flag job_state_string() does not report
])
def test_job_state_list_24_11(job_state_24: list[str], expected: str) -> None:
    job = _job_from_json({**JOB_24, "job_state": job_state_24, "priority": _n(1),
                          "state_reason": "None", "exit_code": _exit_24(0)})
    assert job.state == expected
    assert job.active == (expected not in ("COMPLETED", "FAILED"))


def test_job_state_string_22_05() -> None:
    for word in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED"):
        job = _job_from_json({**JOB_22, "job_state": word, "priority": 4294901759,
                              "state_reason": "None", "exit_code": 0})
        assert job.state == word and not job.held


def test_job_fields_24_11() -> None:
    job = _job_from_json({**JOB_24, "job_state": ["PENDING"], "priority": _n(0),
                          "state_reason": "JobHeldUser", "exit_code": _exit_24(3),
                          "restart_cnt": 2, "excluded_nodes": "node[1,3]"})
    assert job.held and job.reason == "JobHeldUser" and job.exit_code == 3
    assert job.restart_count == 2 and job.excluded == ("node1", "node3")
    assert job.required == ("node2",) and job.extra["batch_host"] == "node2"


def test_job_without_state_is_unknown() -> None:
    assert _job_from_json({**JOB_24, "job_state": []}).state == "UNKNOWN"


def test_node_shapes_both_versions() -> None:
    n24 = _node_from_json({"name": "node1", "state": ["IDLE", "DRAIN"], "reason": "x",
                           "reason_set_by_user": "root", "address": "127.0.0.1"})
    n22 = _node_from_json({"name": "node1", "state": "idle", "state_flags": ["DRAIN"],
                           "reason": "x", "reason_set_by_user": "root", "address": "127.0.0.1"})
    assert n24 == n22
    assert n24.state == "IDLE" and n24.drain and not n24.available
    busy = _node_from_json({"name": "node2", "state": ["MIXED", "DRAIN", "COMPLETING"]})
    assert busy.state == "MIXED" and busy.flags == {"DRAIN", "COMPLETING"}

"""``scontrol -o show job`` (Slurm 22.05's one-job read): a job's name may hold a newline."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resilient_slurm.slurm.parse import _job_from_oneliner, job_records, parse_oneliner

# What 22.05 printed for the hooks' hostile-name test job (name "x\nline2AAA"), cut short.
BROKEN = ("JobId=5 JobName=$(touch /tmp/p) `touch /tmp/p`; touch /tmp/p && echo x\n"
          "line2AAAA UserId=root(0) GroupId=root(0) Priority=4294901755 JobState=COMPLETED "
          "Reason=None Requeue=1 Restarts=0 ExitCode=0:0 NodeList=node3 ExcNodeList=(null) "
          "ReqNodeList=(null) BatchHost=node3\n")


def test_a_newline_in_the_name_continues_the_record() -> None:
    (record,) = job_records(BROKEN)
    job = _job_from_oneliner(parse_oneliner(record))
    assert (job.job_id, job.state, job.nodes) == (5, "COMPLETED", ("node3",))
    assert job.name.startswith("$(touch /tmp/p)") and "line2AAAA" in job.name


def test_one_record_per_job() -> None:
    two = "JobId=1 JobName=a JobState=RUNNING\nJobId=2 JobName=b JobState=PENDING\n"
    assert [parse_oneliner(r)["JobState"] for r in job_records(two)] == ["RUNNING", "PENDING"]
    assert job_records("") == []


NAMES = st.from_regex(r"[A-Za-z0-9_.-]{1,20}", fullmatch=True)


@given(NAMES, NAMES)
def test_partition_and_reservation_are_read(partition: str, reservation: str) -> None:
    line = (f"JobId=7 JobName=j JobState=RUNNING Partition={partition} "
            f"Reservation={reservation} NodeList=node1 BatchHost=node1")
    job = _job_from_oneliner(parse_oneliner(line))
    assert job.extra["partition"] == partition and job.extra["reservation"] == reservation
    none = _job_from_oneliner(parse_oneliner(line.replace(f"Reservation={reservation}",
                                                          "Reservation=(null)")))
    assert "reservation" not in none.extra  # no reservation: the fit check asks for none

"""The repair loop on a real sandbox (``sandbox up --repair``): Slurm's own reboot and power
programs (a reboot gives the node a new boot id in a fresh time namespace; a power down and up
gives it fresh hardware and an empty disk), the controller's pass through the real CLI, the
node's health program resetting, rebooting and validating. Only the hardware and the tools'
output (nvidia-smi, dcgmi, all_reduce_perf, fi_pingpong) are simulated."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from resilient_slurm.events import read_events
from resilient_slurm.slurm import connect
from resilient_slurm_lab.sandbox import lifecycle
from resilient_slurm_lab.sandbox.cluster import Paths

from ..conftest import TEST_PREFIX, _start_sandbox, wait_until
from .conftest import CLI, events, fault

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("repair")]


@pytest.fixture(scope="module")
def repair_sandbox() -> Iterator[Paths]:
    yield from _start_sandbox(TEST_PREFIX + "repair-", nodes=4, repair=True, health_interval=5)


def repair_pass(sandbox: Paths) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "repair", "--config", lifecycle.config_path(sandbox)],
                          capture_output=True, text=True, timeout=60, check=True)


def node_state(sandbox: Paths, node: str) -> tuple[str, str]:
    n = connect(conf=sandbox.conf, backend="cli").node(node)
    return ("drained" if n.drain else n.state.lower()), n.reason


def in_service(sandbox: Paths, node: str) -> bool:
    n = connect(conf=sandbox.conf, backend="cli").node(node)
    return n.available and not n.reason


def repair_events(sandbox: Paths, node: str) -> list[dict]:
    path = sandbox.p("log", "repair-events.jsonl")
    found = read_events(path) if os.path.exists(path) else []
    return [e for e in found if e.get("node") == node]


def drive(sandbox: Paths, done, timeout: float, node: str = "") -> None:
    """Run the controller's pass every few seconds (its timer) until ``done()``; on a timeout
    the assertion says where the node stands."""
    def step() -> bool:
        repair_pass(sandbox)
        return bool(done())

    try:
        wait_until(step, timeout=timeout, every=3.0)
    except AssertionError as exc:
        power = sandbox.p("log", "power.log")
        seen = [(e["kind"], e.get("step") or e.get("outcome") or e.get("reason"))
                for e in events(sandbox, node=node) if e["kind"] != "verdict"][-12:]
        raise AssertionError(f"{exc}: {node} is {node_state(sandbox, node)}; events {seen}; "
                             f"power.log {open(power).read() if os.path.exists(power) else ''}"
                             ) from None


def scenario(sandbox: Paths, name: str, text: str) -> str:
    path = sandbox.p("nodes", f"{name}.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def test_a_reset_class_xid_on_an_idle_node_is_reset_validated_and_resumed(repair_sandbox):
    node = "node1"
    fault(repair_sandbox, node, "xid95")
    wait_until(lambda: node_state(repair_sandbox, node)[0] == "drained", timeout=60)
    drive(repair_sandbox, lambda: in_service(repair_sandbox, node), timeout=180, node=node)
    kinds = [(e["kind"], e.get("step") or e.get("outcome")) for e in events(
        repair_sandbox, node=node) if e["kind"] in ("drain", "repair", "validation", "resume")]
    assert kinds[0] == ("drain", None)
    assert ("repair", "reset_gpu") in kinds, kinds
    order = [k for k in kinds if k in (("repair", "reset_gpu"), ("validation", "started"),
                                       ("validation", "passed"), ("resume", None))]
    assert order[-4:] == [("repair", "reset_gpu"), ("validation", "started"),
                          ("validation", "passed"), ("resume", None)], kinds
    [asked] = [e for e in repair_events(repair_sandbox, node) if e["kind"] == "repair"]
    assert (asked["step"], asked["repair_class"], asked["cause"]) == ("reset_gpu", "gpu_reset",
                                                                      "XID95")
    assert "reset_gpu (1 of 4)" in asked["why"]


def test_three_reboots_then_a_new_machine_that_validates_and_resumes(repair_sandbox):
    node = "node2"
    fault(repair_sandbox, node, "xid79")  # a GPU lost for good: every reboot brings it back
    boots = {_boot(repair_sandbox, node)}
    wait_until(lambda: node_state(repair_sandbox, node)[0] == "drained", timeout=60)

    def replaced() -> bool:
        boots.add(_boot(repair_sandbox, node))
        return any(e["step"] == "power_up" for e in repair_events(repair_sandbox, node))

    drive(repair_sandbox, replaced, timeout=420, node=node)
    steps = [e["step"] for e in repair_events(repair_sandbox, node) if e["kind"] == "repair"]
    assert steps[:5] == ["reboot", "reboot", "reboot", "replace", "power_up"], steps
    assert len(boots) >= 4, boots  # three reboots, each a new boot id (then the new machine's)
    drive(repair_sandbox, lambda: in_service(repair_sandbox, node), timeout=180, node=node)
    with open(repair_sandbox.p("log", "power.log"), encoding="utf-8") as f:
        power = f.read()  # Slurm ran the site's programs: SuspendProgram, then ResumeProgram
    assert power.index(f"suspend {node}") < power.index(f"resume {node}")
    kinds = [(e["kind"], e.get("outcome")) for e in events(repair_sandbox, node=node)]
    assert ("validation", "passed") in kinds
    with open(repair_sandbox.p("repair", "ledger.json"), encoding="utf-8") as f:
        ledger = json.load(f)
    assert [a["step"] for a in ledger["attempts"] if a["node"] == node][:4] == [
        "reboot", "reboot", "reboot", "replace"]
    fleet = subprocess.run([*CLI, "fleet", "--json", "--config",
                            lifecycle.config_path(repair_sandbox)],
                           capture_output=True, text=True, timeout=60, check=True)
    shown = json.loads(fleet.stdout)["repair_ladders"][node]  # the fleet view shows the ladder
    assert [s["step"] for s in shown][:4] == ["reboot", "reboot", "reboot", "replace"]


def test_a_node_that_fails_validation_stays_out_and_moves_up_its_ladder(repair_sandbox):
    node = "node3"
    slow = scenario(repair_sandbox, "xid95-slow-nvlink", 'base = "xid95"\n'
                    "[tools.all_reduce_perf]\nbusbw_gbps = 120.0\n")
    fault(repair_sandbox, node, slow)
    wait_until(lambda: node_state(repair_sandbox, node)[0] == "drained", timeout=60)
    seen_in_service = []

    def moved_up() -> bool:
        seen_in_service.append(in_service(repair_sandbox, node))
        return [e["step"] for e in repair_events(repair_sandbox, node)][:2] == [
            "reset_gpu", "reboot"]

    drive(repair_sandbox, moved_up, timeout=240, node=node)
    failed = [e for e in events(repair_sandbox, node=node)
              if e["kind"] == "validation" and e.get("outcome") == "failed"]
    assert failed and "ALLREDUCE_LOW" in failed[0]["codes"]
    assert not any(seen_in_service)
    assert not in_service(repair_sandbox, node)


def _boot(sandbox: Paths, node: str) -> str:
    from resilient_slurm_lab.hardware.simulate import load_scenario_data

    data = load_scenario_data(sandbox.p("nodes", node, "scenario.toml"))
    return str(data.get("kernel_log", {}).get("boot_id"))


@pytest.fixture(scope="module")
def ten_failing() -> Iterator[Paths]:
    extra = "max_drain_fraction = 1.0\n"  # the fleet guard off: every failing node drains
    yield from _start_sandbox(TEST_PREFIX + "budget-", nodes=10, repair=True,
                              hooks_extra=extra, health_interval=5)


def test_ten_nodes_failing_alike_are_remediated_within_the_budget(ten_failing):
    nodes = [f"node{i}" for i in range(1, 11)]
    for node in nodes:
        fault(ten_failing, node, "xid79")
    wait_until(lambda: all(node_state(ten_failing, n)[0] == "drained" for n in nodes),
               timeout=90)
    done = repair_pass(ten_failing)
    tagged = [n for n in nodes if node_state(ten_failing, n)[1].endswith("[reboot]")
              or "[reboot] :" in node_state(ten_failing, n)[1]]
    assert len(tagged) == 3, [node_state(ten_failing, n) for n in nodes]  # max_at_once = 3
    assert "REPAIR BUDGET: 7 node(s) held back" in done.stderr
    [budget] = [e for e in read_events(ten_failing.p("log", "repair-events.jsonl"))
                if e["kind"] == "repair_budget"]
    assert len(budget["held"]) == 7 and budget["in_progress"] == 3
    again = repair_pass(ten_failing)  # the next pass holds them back too (3 still in repair)
    assert "held" in again.stdout

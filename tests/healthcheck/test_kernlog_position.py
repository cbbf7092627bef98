"""Kernel-log positions: reported once, new ones reported, a new boot id resets; the
sandbox's install/clear cycle; the epilog's since-position API; the journal source."""

from __future__ import annotations

import json
import os

import pytest

from resilient_slurm.healthcheck import seams
from resilient_slurm.healthcheck.klog import sources
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.hardware.simulate import install_scenario

from .helpers import by_check, make_config, on_nodes, write_scenario


@pytest.fixture()
def node(tmp_path, request):
    nodes = tmp_path / "nodes"
    on_nodes(request, str(nodes))
    cfg = make_config(str(tmp_path), nvml_timeout_s=1.0, tool_timeout_s=2.0)
    node_dir = str(nodes / "n1")
    install_scenario(node_dir, "healthy-p5")
    return cfg, node_dir


def xids(report):
    return [(r.code, r.device) for r in by_check(report, "xid") if r.code.startswith("XID")]


def test_install_writes_scenario_atomically(node):
    cfg, node_dir = node
    path = install_scenario(node_dir, "xid79")
    assert path == os.path.join(node_dir, "scenario.toml")
    assert "xid79" in open(path).read() or "79" in open(path).read()
    assert not [f for f in os.listdir(node_dir) if f.startswith(".tmp-")]


def test_reported_once_then_new_one_then_clear(node):
    cfg, node_dir = node
    assert check_node(cfg, node="n1").exit_code == 0
    install_scenario(node_dir, "xid79")
    first = check_node(cfg, node="n1")
    assert xids(first) == [("XID79", "gpu3")]
    assert first.simulated and first.exit_code == 1
    second = check_node(cfg, node="n1")
    assert xids(second) == []  # the same Xid is not reported again ...
    assert second.exit_code == 1  # ... but the GPU is still lost
    install_scenario(node_dir, "xid79")  # the injector breaks it again: a new Xid
    assert xids(check_node(cfg, node="n1")) == [("XID79", "gpu3")]
    install_scenario(node_dir, "clear")
    healthy = check_node(cfg, node="n1")
    assert healthy.exit_code == 0, [r.to_json() for r in healthy.results if r.status != "ok"]
    assert check_node(cfg, node="n1").exit_code == 0


def test_state_lives_in_the_node_dir(node):
    cfg, node_dir = node
    check_node(cfg, node="n1")
    saved = json.load(open(os.path.join(node_dir, "state", "health", "kernlog-position.json")))
    assert saved["source"] == "file" and saved["boot_id"]


def test_new_boot_id_resets_the_position(node, tmp_path):
    cfg, node_dir = node
    line = ('"[  300.0] NVRM: Xid (PCI:0000:53:00): 95, pid=1, name=x, Uncontained: '
            'FBHUB. RST: No, D-RST: No"')
    body = f'[kernel_log]\nboot_id = "BOOT-A"\nappend = [{line}]\n'
    a = write_scenario(str(tmp_path / "s"), "boot-a", body)
    install_scenario(node_dir, a)
    assert xids(check_node(cfg, node="n1")) == [("XID95", "gpu0")]
    assert xids(check_node(cfg, node="n1")) == []
    # the node reboots and logs the same line at the same place in its new log
    b = write_scenario(str(tmp_path / "s"), "boot-b", body.replace("BOOT-A", "BOOT-B"))
    install_scenario(node_dir, b)
    with open(os.path.join(node_dir, "kernel.log")) as fh:
        assert "Xid" in fh.read()
    assert xids(check_node(cfg, node="n1")) == [("XID95", "gpu0")]
    assert xids(check_node(cfg, node="n1")) == []


def test_since_position_for_the_epilog(node):
    cfg, node_dir = node
    start = seams.current_position(cfg, node="n1")
    assert json.loads(json.dumps(start)) == start  # JSON-serialisable
    assert check_node(cfg, node="n1").exit_code == 0  # the periodic run consumes nothing new
    install_scenario(node_dir, "xid79")
    for _ in range(2):  # an explicit position neither uses nor moves the saved one
        epi = check_node(cfg, check_set="epilog", node="n1", since_position=start)
        assert xids(epi) == [("XID79", "gpu3")]
    assert xids(check_node(cfg, node="n1")) == [("XID79", "gpu3")]
    read = seams.read_since(cfg, start, node="n1")
    assert [e.code for e in read.events] == [79]


def test_shipped_scenario_without_node_dir_has_no_memory(tmp_path):
    cfg = make_config(str(tmp_path), nvml_timeout_s=1.0)
    for _ in range(2):
        assert xids(check_node(cfg, hardware=ScenarioHardware("xid79"), node="x",
                               only=["xid"])) == [
            ("XID79", "gpu3")]
    assert not os.path.exists(tmp_path / "state" / "health" / "kernlog-position.json")


def fake_journalctl(bindir, lines: list[dict], mode: str = "ok") -> None:
    os.makedirs(bindir, exist_ok=True)
    data = os.path.join(bindir, "journal.jsonl")
    with open(data, "w") as fh:
        for rec in lines:
            fh.write(json.dumps(rec) + "\n")
    script = os.path.join(bindir, "journalctl")
    body = {
        "ok": f'''#!/bin/sh
for a in "$@"; do case "$a" in --after-cursor=*) c="${{a#--after-cursor=}}";; esac; done
if [ -n "$c" ]; then sed -n "/\\"__CURSOR\\": \\"$c\\"/,\\$p" {data} | tail -n +2
else cat {data}; fi
''',
        "garbage": "#!/bin/sh\necho 'not json at all'\n",
        "hang": "#!/bin/sh\nsleep 30\n",
    }[mode]
    with open(script, "w") as fh:
        fh.write(body)
    os.chmod(script, 0o755)


def rec(i: int, msg: str, transport: str = "kernel") -> dict:
    return {"__CURSOR": f"s=abc;i={i}", "MESSAGE": msg, "_TRANSPORT": transport,
            "_SOURCE_MONOTONIC_TIMESTAMP": str(i * 10**6)}


def test_journal_source_cursors(tmp_path):
    bindir = str(tmp_path / "bin")
    fake_journalctl(bindir, [rec(1, "hello"),
                             rec(2, "NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=x, off bus")])
    src = sources.JournalSource(bindir)
    first = src.read(None, 5)
    assert not first.error and [e.code for e in first.events] == [79]
    assert first.position and first.position["cursor"] == "s=abc;i=2"
    again = src.read(first.position, 5)
    assert again.error == "" and again.records == []
    other_boot = dict(first.position, boot_id="another")
    assert len(src.read(other_boot, 5).records) == 2


@pytest.mark.parametrize("mode", ["garbage", "hang"])
def test_journal_source_failures_are_errors(tmp_path, mode):
    bindir = str(tmp_path / "bin")
    fake_journalctl(bindir, [], mode)
    read = sources.safe_read(sources.JournalSource(bindir), None, 0.5)
    assert read.error


def test_journal_missing_is_an_error(tmp_path):
    read = sources.safe_read(sources.JournalSource(str(tmp_path)), None, 1)
    assert "not found" in read.error


def test_kmsg_unreadable_is_an_error(tmp_path):
    read = sources.safe_read(sources.KmsgSource(str(tmp_path / "no-kmsg")), None, 1)
    assert read.error and read.position is None


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg not readable here")
def test_real_kmsg_position_advances():
    src = sources.KmsgSource()
    first = sources.safe_read(src, None, 2)
    if first.error:
        pytest.skip(first.error)
    assert first.position and first.position["source"] == "kmsg"
    again = src.read(first.position, 2)
    assert all(r.seq >= first.position["seq"] for r in again.records)


def test_busy_lock_reads_but_does_not_advance(node):
    from resilient_slurm import fsutil

    cfg, node_dir = node
    check_node(cfg, node="n1")
    install_scenario(node_dir, "xid79")
    lock = os.path.join(node_dir, "state", "health", "kernlog-position.json.lock")
    with fsutil.locked(lock):
        busy = check_node(cfg, node="n1", only=["xid"])
    assert xids(busy) == [("XID79", "gpu3")]
    assert [r.code for r in by_check(busy, "xid") if r.status == "warn"] == ["STATE_UNAVAILABLE"]
    # not advanced: the next run (lock free) still reports it, then never again
    assert xids(check_node(cfg, node="n1", only=["xid"])) == [("XID79", "gpu3")]
    assert xids(check_node(cfg, node="n1", only=["xid"])) == []

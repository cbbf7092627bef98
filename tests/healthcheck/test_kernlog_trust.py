"""Issue 23 items 3, 4 and 12: the saved read position.

3. trusted only from a real, private directory owned by root (or the running user) and only
   when plausible; otherwise the window is read again and the run says so. Property: no
   corrupted or implausible position content hides an Xid, and the next run saves a good one.
4. a manual ``resilient-health check`` is read-only unless ``--advance``.
12. a read error never sticks (the next good read saves the position); the journal is read
   only in its window (after the cursor, or the gap's time window), within its timeout.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resilient_slurm.healthcheck.klog import sources
from resilient_slurm.healthcheck.klog.position import plausible
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm.hooks.health_cli import main as health_cli
from resilient_slurm_lab.hardware.simulate import install_scenario

from .helpers import by_check, make_config, on_nodes

XID79 = ("[86390.1] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.")


def make_node(tmp_path, request, name: str = "n1"):
    nodes = tmp_path / "nodes"
    on_nodes(request, str(nodes))
    cfg = make_config(str(tmp_path), "nvml_timeout_s = 1.0\n")
    node = str(nodes / name)
    install_scenario(node, "clear")
    return cfg, node, str(tmp_path / "config.toml")


def log_xid(node: str) -> None:
    with open(os.path.join(node, "kernel.log"), "a") as fh:
        fh.write(XID79 + "\n")


def xid_codes(report) -> list[str]:
    return [r.code for r in by_check(report, "xid")]


def position_file(node: str) -> str:
    return os.path.join(node, "state", "health", "kernlog-position.json")


def plant_position_at_end(health_dir: str, node: str) -> None:
    """A position that says 'everything read', as a hook would save after the Xid."""
    boot = "6f1c2a9e-0d4b-4f3e-9a57-healthy00001"
    size = os.path.getsize(os.path.join(node, "kernel.log"))
    os.makedirs(health_dir, exist_ok=True)
    with open(os.path.join(health_dir, "kernlog-position.json"), "w") as fh:
        json.dump({"source": "file", "boot_id": boot, "offset": size, "seq": 10**6}, fh)


# -- item 3: the directory ----------------------------------------------------------------

@pytest.mark.parametrize("attack", ["other_owner", "symlink", "group_writable"])
def test_a_planted_position_never_hides_a_fatal_xid(tmp_path, attack, request):
    cfg, node, _ = make_node(tmp_path, request)
    assert xid_codes(check_node(cfg, node="n1", only=["xid"])) == ["OK"]
    log_xid(node)
    health = os.path.join(node, "state", "health")
    shutil.rmtree(health)
    if attack == "symlink":
        elsewhere = str(tmp_path / "attacker")
        plant_position_at_end(elsewhere, node)
        os.symlink(elsewhere, health)
    else:
        plant_position_at_end(health, node)
        if attack == "other_owner":
            for path in (health, position_file(node)):
                os.chown(path, 4242, 4242)  # the tests run as root: a real other owner
        else:
            os.chmod(health, 0o775)
    if attack == "other_owner" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    report = check_node(cfg, node="n1", only=["xid"])
    codes = {r.code: r for r in by_check(report, "xid")}
    assert codes["XID79"].status == "fail" and codes["XID79"].hold
    assert codes["KLOG_POSITION_UNTRUSTED"].status == "warn"
    assert report.exit_code == 1


def test_an_untrusted_file_in_a_trusted_dir_is_not_read(tmp_path, request):
    cfg, node, _ = make_node(tmp_path, request)
    check_node(cfg, node="n1", only=["xid"])
    log_xid(node)
    real = str(tmp_path / "elsewhere.json")
    plant_position_at_end(str(tmp_path / "p"), node)
    shutil.move(str(tmp_path / "p" / "kernlog-position.json"), real)
    os.unlink(position_file(node))
    os.symlink(real, position_file(node))
    assert "XID79" in xid_codes(check_node(cfg, node="n1", only=["xid"]))


# -- item 3: the content (property) ---------------------------------------------------------

junk = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=20),
                 st.integers(min_value=-2**70, max_value=-1), st.integers(2**40, 2**70),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                       st.integers(), max_size=2))
content = st.one_of(
    st.binary(max_size=200),
    st.fixed_dictionaries({"source": st.just("file"),
                           "boot_id": st.just("6f1c2a9e-0d4b-4f3e-9a57-healthy00001")},
                          optional={"offset": junk, "seq": junk, "usec": junk}).map(
        lambda d: json.dumps(d).encode()),
    st.just(b"[]"), st.just(b"\xff\xfe"), st.just(b"{" * 5000))


@given(content)
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_no_corrupt_position_hides_an_xid_and_the_next_run_heals(tmp_path, request, data):
    base = tmp_path / os.urandom(4).hex()
    base.mkdir()
    cfg, node, _ = make_node(base, request)
    check_node(cfg, node="n1", only=["xid"])
    log_xid(node)
    with open(position_file(node), "wb") as fh:
        fh.write(data)
    first = check_node(cfg, node="n1", only=["xid"])
    assert "XID79" in xid_codes(first), data
    second = check_node(cfg, node="n1", only=["xid"])
    assert xid_codes(second) == ["OK"], [r.to_json() for r in second.results]


def test_kmsg_position_past_the_end_of_the_boot_is_not_trusted():
    recs = [f"3,{i},{i * 1000},-;x{i}".encode() for i in range(5)]
    recs.append(b"3,5,5000,-;NVRM: Xid (PCI:0000:86:00): 79, pid=1, name=x, off bus")
    out = sources.from_kmsg_records(sources.LogRead("kmsg", "B"), recs,
                                    {"source": "kmsg", "boot_id": "B", "seq": 10**9})
    assert out.untrusted and [e.code for e in out.events] == [79]
    assert out.position and out.position["seq"] == 6
    ok = sources.from_kmsg_records(sources.LogRead("kmsg", "B"), recs,
                                   {"source": "kmsg", "boot_id": "B", "seq": 6})
    assert not ok.untrusted and ok.events == []


# -- item 4: a manual check is read-only ----------------------------------------------------

def test_manual_check_does_not_move_the_hooks_position(tmp_path, request):
    cfg, node, config_path = make_node(tmp_path, request)
    check_node(cfg, node="n1", only=["xid"])  # a hook's run: position at the end
    log_xid(node)
    argv = ["check", "--config", config_path, "--node", "n1", "--only", "xid", "--json"]
    for _ in range(2):  # an admin looks, twice
        done = CliRunner().invoke(health_cli, argv)
        assert done.exit_code == 1, done.output
        assert "XID79" in done.output
    # the hook's next run still sees the Xid (and then moves on)
    assert "XID79" in xid_codes(check_node(cfg, node="n1", only=["xid"]))
    assert xid_codes(check_node(cfg, node="n1", only=["xid"])) == ["OK"]
    log_xid(node)
    done = CliRunner().invoke(health_cli, [*argv, "--advance"])
    assert done.exit_code == 1 and "XID79" in done.output
    assert xid_codes(check_node(cfg, node="n1", only=["xid"])) == ["OK"]  # --advance moved it


# -- item 12: unknowns clear; the journal window -------------------------------------------

def fake_journalctl(bindir: str, records: list[dict], mode: str = "ok") -> str:
    """A journalctl that logs its argv, knows its cursors (an unknown one: exit 1, as the real
    one does), and prints records (``hang``: then blocks)."""
    os.makedirs(bindir, exist_ok=True)
    data, argv_log = os.path.join(bindir, "journal.jsonl"), os.path.join(bindir, "argv.log")
    with open(data, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    tail = "sleep 30\n" if mode == "hang" else ""
    script = f'''#!/bin/sh
echo "$*" >> {argv_log}
c=""
for a in "$@"; do case "$a" in --after-cursor=*) c="${{a#--after-cursor=}}";; esac; done
if [ -n "$c" ]; then
  grep -q "\\"__CURSOR\\": \\"$c\\"" {data} || {{
    echo "Failed to seek to cursor: Invalid argument" >&2; exit 1; }}
  sed -n "/\\"__CURSOR\\": \\"$c\\"/,\\$p" {data} | tail -n +2
else cat {data}; fi
{tail}'''
    path = os.path.join(bindir, "journalctl")
    with open(path, "w") as fh:
        fh.write(script)
    os.chmod(path, 0o755)
    return argv_log


def rec(i: int, msg: str) -> dict:
    return {"__CURSOR": f"s=abc;i={i:x}", "MESSAGE": msg, "_TRANSPORT": "kernel",
            "SYSLOG_FACILITY": "0", "_SOURCE_MONOTONIC_TIMESTAMP": str(i * 10**6)}


def test_a_refused_cursor_does_not_make_every_run_unknown(tmp_path):
    bindir = str(tmp_path / "bin")
    fake_journalctl(bindir, [rec(1, "hello"), rec(2, XID79.split("] ", 1)[1])])
    src = sources.JournalSource(bindir)
    stale = {"source": "journal", "boot_id": src.boot_id(), "cursor": "s=dead;i=99"}
    read = sources.safe_read(src, stale, 5.0)
    assert not read.error, read.error
    assert read.untrusted and [e.code for e in read.events] == [79]
    assert read.position and read.position["cursor"] == "s=abc;i=2"
    again = sources.safe_read(src, read.position, 5.0)  # the saved one works next time
    assert not again.error and not again.untrusted and again.records == []


def test_gap_fill_reads_only_the_window_from_the_journal(tmp_path):
    bindir = str(tmp_path / "bin")
    argv_log = fake_journalctl(bindir, [rec(7, XID79.split("] ", 1)[1])])
    read = sources.LogRead("kmsg", "b", 100.0, [sources.LogRecord(50, 9.0, "first kept")],
                           {"seq": 51}, gap=True)
    sources.fill_gap(read, {"usec": 6_000_000}, sources.JournalSource(bindir), 5.0)
    assert read.gap_filled == "journal" and [e.code for e in read.events] == [79]
    (argv,) = open(argv_log).read().splitlines()
    assert "--since=@" in argv and "--until=@" in argv  # never the whole boot


def test_journal_read_cut_by_its_timeout_keeps_what_it_read(tmp_path):
    bindir = str(tmp_path / "bin")
    fake_journalctl(bindir, [rec(1, "a"), rec(2, XID79.split("] ", 1)[1]), rec(3, "b")],
                    mode="hang")
    read = sources.safe_read(sources.JournalSource(bindir), None, 1.0)
    assert not read.error and read.partial
    assert [e.code for e in read.events] == [79]
    assert read.position and read.position["cursor"] == "s=abc;i=3"  # go on from here


def test_a_read_error_then_a_good_read_saves_the_position(tmp_path, request):
    cfg, node, _ = make_node(tmp_path, request)
    check_node(cfg, node="n1", only=["xid"])
    log_xid(node)
    os.chmod(os.path.join(node, "kernel.log"), 0o000)
    if os.access(os.path.join(node, "kernel.log"), os.R_OK):  # root reads it anyway
        scen = os.path.join(node, "scenario.toml")
        text = open(scen).read()
        open(scen, "w").write(text.replace("[kernel_log]", '[kernel_log]\nbehavior = "denied"'))
        bad = check_node(cfg, node="n1", only=["xid"])
        open(scen, "w").write(text)
    else:
        bad = check_node(cfg, node="n1", only=["xid"])
        os.chmod(os.path.join(node, "kernel.log"), 0o600)
    assert xid_codes(bad) == ["KLOG_UNREADABLE"]
    assert "XID79" in xid_codes(check_node(cfg, node="n1", only=["xid"]))
    assert xid_codes(check_node(cfg, node="n1", only=["xid"])) == ["OK"]


@given(st.one_of(junk, st.integers(0, 2**62)), st.one_of(st.none(), junk, st.integers(0, 10**7)))
@settings(max_examples=200, deadline=None)
def test_kmsg_position_property(seq, usec):
    """Whatever a saved kmsg position holds, the ring's Xid (seq 5) is reported unless the
    position is a well-formed sequence number of this boot past it (6 = the end)."""
    recs = [f"3,{i},{i * 1000},-;x{i}".encode() for i in range(5)]
    recs.append(b"3,5,5000,-;NVRM: Xid (PCI:0000:86:00): 79, pid=1, name=x, off bus")
    after, note = plausible({"source": "kmsg", "boot_id": "B", "seq": seq,
                                     "usec": usec}, "kmsg", "B")
    out = sources.from_kmsg_records(sources.LogRead("kmsg", "B"), recs, after)
    well_formed = isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 and (
        usec is None or (isinstance(usec, int) and not isinstance(usec, bool) and usec >= 0))
    if well_formed and seq == 6:
        assert out.events == [] and not out.untrusted and not note
    else:
        assert [e.code for e in out.events] == [79], (seq, usec)
        assert out.untrusted or note or (well_formed and seq <= 5)
    assert out.position and out.position["seq"] == 6

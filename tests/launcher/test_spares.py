"""Hot spares (``launcher/recovery/spares.py``): input checks, which nodes train and which stand by,
which spare may replace a blamed node (only a fresh ``ok`` verdict and an available node), the
events and job-log lines of a swap, and the CLI's usage errors and dry-run plan."""

from __future__ import annotations

import io

import hypothesis.strategies as st
import pytest
from click.testing import CliRunner
from hypothesis import given

from resilient_slurm.events import EventKind, read_events
from resilient_slurm.launcher import cli
from resilient_slurm.launcher.cycle import plan
from resilient_slurm.launcher.recovery import spares
from resilient_slurm.launcher.recovery.spares import Health
from resilient_slurm.launcher.report import joblog, report


def test_check_gives_the_training_size_and_refuses_bad_input() -> None:
    assert spares.check(1, 4, None) == 3
    assert spares.check(0, 2, 2) == 2
    with pytest.raises(spares.SpareError, match="must be >= 0"):
        spares.check(-1, 4, None)
    with pytest.raises(spares.SpareError, match="leaves 0 training node"):
        spares.check(4, 4, None)
    with pytest.raises(spares.SpareError, match="--min-nodes 4 > 3 training node"):
        spares.check(1, 4, 4)


@given(st.lists(st.sampled_from([f"n{i}" for i in range(8)]), unique=True, min_size=1),
       st.integers(0, 9), st.booleans())
def test_split_trains_on_n_and_keeps_the_batch_host(nodes, train, batch_first) -> None:
    batch = nodes[-1] if not batch_first else nodes[0]
    active, standby = spares.split(nodes, train, batch)
    assert len(active) == min(train, len(nodes))
    assert sorted(active + standby) == sorted(nodes) and not set(active) & set(standby)
    assert [n for n in nodes if n in active] == active  # allocation order kept
    if train > 0:
        assert batch in active


def test_only_a_fresh_ok_verdict_on_an_available_node_qualifies() -> None:
    assert spares.judge("ok", "IDLE", True).ok
    assert not spares.judge(None, "IDLE", True).ok  # no verdict: fail closed
    assert spares.judge("warn", "IDLE", True).why == "health verdict warn"
    assert not spares.judge("unknown", "IDLE", True).ok
    assert not spares.judge("fail", "IDLE", True).ok
    assert spares.judge("ok", None, False).why == "Slurm did not answer about the node"
    assert spares.judge("ok", "IDLE+DRAIN", False).why == "Slurm: IDLE+DRAIN"


def test_choose_swaps_in_place_skipping_unhealthy_spares() -> None:
    fit = {"s1": Health(False, "health verdict fail"), "s2": Health(True, "verdict ok")}
    c = spares.choose({"b": ["node down"]}, ["s1", "s2"], fit)
    assert [(s.out, s.spare, s.why) for s in c.swaps] == [("b", "s2", ("node down",))]
    assert c.skipped == {"s1": "health verdict fail"} and c.unswapped == []
    # the spare takes the blamed node's place: same world size, same order
    assert c.nodes(["a", "c"], ["a", "b", "c"]) == ["a", "s2", "c"]


def test_more_blamed_than_healthy_spares_leaves_the_rest_unswapped() -> None:
    c = spares.choose({"b": ["x"], "c": ["y"]}, ["s1"], {"s1": Health(True, "ok")})
    assert [s.out for s in c.swaps] == ["b"] and c.unswapped == ["c"]
    assert c.nodes(["a"], ["a", "b", "c"]) == ["a", "s1"]  # one short: the policy decides


@given(st.sets(st.sampled_from("abcdef"), min_size=1, max_size=6),
       st.lists(st.tuples(st.sampled_from("uvwxyz"), st.booleans()), unique_by=lambda t: t[0]))
def test_choose_never_uses_an_unhealthy_spare(blamed, pool) -> None:
    fit = {n: Health(ok, "ok" if ok else "bad") for n, ok in pool}
    c = spares.choose({b: ["x"] for b in blamed}, [n for n, _ in pool], fit)
    used = [s.spare for s in c.swaps]
    assert all(fit[s].ok for s in used) and len(set(used)) == len(used)
    assert len(c.swaps) == min(len(blamed), sum(ok for _, ok in pool))
    assert sorted([s.out for s in c.swaps] + c.unswapped) == sorted(blamed)


def test_commit_emits_the_swap_and_the_job_log_line(tmp_path) -> None:
    out = io.StringIO()
    log = joblog.JobLog(str(tmp_path / "events.jsonl"), "launcher", out=out)
    standby = ["s1", "s2"]
    c = spares.choose({"b": ["node DOWN"]}, standby, {"s1": Health(True, "verdict ok"),
                                                      "s2": Health(True, "verdict ok")})
    assert spares.commit(log, standby, c, 1) == {"b": "spare"}
    assert standby == ["s2"]
    ev = [e for e in read_events(str(tmp_path / "events.jsonl")) if e["kind"] == "spare"]
    assert [(e["out"], e["node"], e["spares_left"]) for e in ev] == [("b", "s1", ["s2"])]
    assert "spare s1 in for b (node DOWN); 1 spare(s) left" in out.getvalue()
    none = spares.choose({"c": ["x"]}, [], {})
    spares.commit(log, [], none, 2)
    assert "no healthy spare for c: shrink (--min-nodes) or requeue" in out.getvalue()


def test_report_says_the_spare_handled_the_fault() -> None:
    evs = [{"ts": 0, "kind": "launch_start", "source": "launcher"},
           {"ts": 0.1, "kind": "cycle_start", "source": "launcher", "cycle": 1},
           {"ts": 1, "kind": "resume", "source": "training", "step": 0},
           {"ts": 2, "kind": "fault", "source": "launcher", "type": "cycle-failed"},
           {"ts": 3, "kind": EventKind.SPARE.value, "source": "launcher", "out": "b",
            "node": "s1"},
           {"ts": 3, "kind": "exclude", "source": "launcher", "node": "b", "mode": "spare"},
           {"ts": 4, "kind": "cycle_start", "source": "launcher", "cycle": 2},
           {"ts": 5, "kind": "resume", "source": "training", "step": 0}]
    rows = report.build(evs).faults
    assert [f.handled_by for f in rows] == ["spare s1 in for b"], rows


def _alloc(monkeypatch, tmp_path, nodes: str) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", nodes)
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    monkeypatch.setenv("RESILIENT_SANDBOX_DIR", str(tmp_path / "sbx"))


@pytest.mark.parametrize(("argv", "said"), [
    (["--spares=-1"], "-1 is not in the range x>=0"),
    (["--spares=4"], "--spares 4 leaves 0 training node(s) in an allocation of 4"),
    (["--spares=1", "--min-nodes=4"], "--min-nodes 4 > 3 training node(s)"),
    (["--spares=1", "--inprocess", "--nproc-per-node=gpu"],
     "--spares with --inprocess needs a number of ranks per node"),
])
def test_cli_refuses_bad_spares(monkeypatch, tmp_path, argv, said) -> None:
    _alloc(monkeypatch, tmp_path, "node[1-4]")
    res = CliRunner().invoke(cli.main, [*argv, "--checkpoint-dir=/tmp/x", "t.py"])
    assert res.exit_code == 2 and said in res.output, res.output
    assert "Traceback" not in res.output


def test_help_explains_spares() -> None:
    out = CliRunner().invoke(cli.main, ["--help"]).output
    assert "--spares K" in out and "Hot spares" in out


@pytest.mark.parametrize("version", ["0.4.1", "0.6.0"])
def test_dry_run_plans_three_training_nodes_and_one_spare(monkeypatch, tmp_path,
                                                          version) -> None:
    _alloc(monkeypatch, tmp_path, "node[1-4]")
    flags = frozenset({"--nnodes", "--ft-segment"} if version == "0.6.0" else {"--nnodes"})
    monkeypatch.setattr(plan, "detect_features", lambda *_a: plan.Features(flags, version))
    res = CliRunner().invoke(cli.main, ["--dry-run", "--spares=1", "t.py",
                                        "--checkpoint-dir", str(tmp_path / "ck")])
    assert res.exit_code == 0, res.output
    assert "hot spares: node4 (--spares 1)" in res.output
    assert "nodes: node1,node2,node3 (min 3)" in res.output
    srun = next(line for line in res.output.splitlines() if line.startswith("srun "))
    native = "NVRx's own standbys, gated" in res.output
    assert native == (version == "0.6.0")
    if native:  # one step on all four nodes, NVRx's --nnodes=N:N+K, the standby gated
        assert "--nodelist=node1,node2,node3,node4" in srun and "--nnodes=3:4 " in srun
        assert "--standby-from=3" in srun
    else:
        assert "--nodelist=node1,node2,node3" in srun and "--nnodes=3 " in srun

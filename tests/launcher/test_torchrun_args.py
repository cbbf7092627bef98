"""torchrun's command line as resilient-launch reads it (launcher/cycle/torchrun_args.py) and the
plan it leads to: one --nnodes, one --rdzv-endpoint (the launcher's), the user's script."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.launcher import cli
from resilient_slurm.launcher.cycle import plan, torchrun_args

LITERAL = ("--nnodes=4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=head:29500 "
           "--rdzv-id=1234 train.py --lr 3e-4 --nnodes 9")
FLAGS = frozenset({"--ft-rank-heartbeat-timeout", "--ft-initial-rank-heartbeat-timeout",
                   "--local-addr", "--term-timeout", "--log-dir", "--redirects", "--tee",
                   "--no-python", "--local-ranks-filter", "--ft-cfg-path",
                   "--ignore-missing-fault-tol-cfg", "--monitor-interval"})


@pytest.fixture
def alloc(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-4]")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))  # no controller: still plans
    monkeypatch.setenv("RESILIENT_SANDBOX_DIR", str(tmp_path / "sbx"))
    monkeypatch.setenv("RESILIENT_LAUNCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(plan, "detect_features", lambda *_a, **_k: plan.Features(FLAGS, "0.4.1"))
    return tmp_path


def dry_run(argv: list[str]) -> tuple[int, str, list[str]]:
    res = CliRunner().invoke(cli.main, ["--dry-run", *argv])
    srun = [line for line in res.output.splitlines() if line.startswith("srun ")]
    return res.exit_code, res.output, shlex.split(srun[0]) if srun else []


def ft_part(srun: list[str]) -> list[str]:
    return srun[srun.index("ft_launcher"):]


def test_literal_torchrun_line_plans_one_rendezvous(alloc) -> None:
    code, out, srun = dry_run(shlex.split(LITERAL))
    assert code == 0, out
    ft = ft_part(srun)
    script = ft.index("train.py")
    opts = ft[:script]
    assert sum(a.startswith("--nnodes") for a in opts) == 1 and "--nnodes=4" in opts
    endpoints = [a for a in opts if a.startswith("--rdzv-endpoint")]
    assert len(endpoints) == 1 and "head:29500" not in endpoints[0]
    assert not any(a.startswith("--rdzv-id=1234") for a in opts)
    assert ft[script:] == ["train.py", "--lr", "3e-4", "--nnodes", "9"]  # the script's own
    assert opts.count("--nproc-per-node=8") == 1
    assert "note: --rdzv-backend, --rdzv-endpoint, --rdzv-id: the launcher's own" in out


def test_nnodes_range_becomes_min_nodes(alloc) -> None:
    code, out, srun = dry_run(["--nnodes", "2:4", "--nproc_per_node", "2", "--standalone",
                               "train.py"])
    assert code == 0, out
    assert "nodes: node1,node2,node3,node4 (min 2)" in out
    assert "--nnodes 2:4: training on the allocation's nodes, --min-nodes 2 used instead" in out
    assert "--standalone" not in ft_part(srun)


def test_passed_on_once_and_users_log_dir_wins(alloc) -> None:
    code, out, srun = dry_run(["--log-dir", "/logs", "-r", "3", "--tee=1", "--no_python",
                               "--local-ranks-filter=0", "--monitor-interval=0.5",
                               "/bin/echo", "hi"])
    assert code == 0, out
    ft = ft_part(srun)
    opts = ft[:ft.index("/bin/echo")]
    for arg in ("--log-dir=/logs", "--redirects=3", "--tee=1", "--no_python",
                "--local-ranks-filter=0", "--monitor-interval=0.5"):
        assert opts.count(arg) == 1, (arg, opts)
    assert sum(a.startswith("--log-dir") for a in opts) == 1  # not also the launcher's


@pytest.mark.parametrize("argv,named", [
    (["--bogus-flag", "train.py"], "--bogus-flag"),
    (["--nproc-per-node=2", "--bogus=1", "train.py"], "--bogus"),
    (["--nnodes"], "--nnodes"),
    (["--standalone=1", "t.py"], "--standalone"),
])
def test_unknown_flag_is_usage_error_before_allocation(argv, named, monkeypatch) -> None:
    for k in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(k, raising=False)
    res = CliRunner().invoke(cli.main, argv)
    assert res.exit_code == 2 and named in res.output, res.output
    assert "not inside a Slurm allocation" not in res.output and "Traceback" not in res.output


def test_version_outside_allocation(monkeypatch) -> None:
    for k in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(k, raising=False)
    for argv in (["--version"], ["--nnodes=2", "--version", "train.py"]):
        res = CliRunner().invoke(cli.main, argv)
        assert res.exit_code == 0 and res.output.startswith("resilient-launch "), res.output


# -- property: any torchrun command line ---------------------------------------------------
def _spell(canon: str) -> st.SearchStrategy[str]:
    return st.sampled_from([canon, "--" + canon[2:].replace("-", "_")])


VALUE = st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=6)
OWNED_OPT = st.sampled_from(sorted(torchrun_args.OWNED)).flatmap(
    lambda c: st.tuples(_spell(c), st.just(torchrun_args.OWNED[c]), VALUE))
PASSED_OPT = st.sampled_from(["--log-dir", "--redirects", "--tee", "--no-python",
                              "--local-ranks-filter", "--monitor-interval", "--run-path",
                              "--role"]).flatmap(
    lambda c: st.tuples(_spell(c), st.just(torchrun_args.PASSED[c]), VALUE))
OURS_OPT = st.sampled_from([("--nproc-per-node", True), ("--nproc_per_node", True),
                            ("--max-restarts", True), ("--max_restarts", True),
                            ("-m", False)]).flatmap(
    lambda p: st.tuples(st.just(p[0]), st.just(p[1]), st.sampled_from(["1", "2", "3"])))
SCRIPT_ARGS = st.lists(st.sampled_from(["--nnodes", "4", "--rdzv-endpoint=x:1", "--lr",
                                        "-m", "--standalone", "--", "a b", "--bogus"]),
                       max_size=6)


@given(opts=st.lists(st.one_of(OWNED_OPT, PASSED_OPT, OURS_OPT), max_size=8),
       eq=st.lists(st.booleans(), min_size=8, max_size=8), script_args=SCRIPT_ARGS)
@settings(max_examples=300, deadline=None)
def test_any_torchrun_line(opts, eq, script_args) -> None:
    argv: list[str] = []
    for (flag, takes, value), use_eq in zip(opts, eq, strict=False):
        if flag.startswith("--nnodes") or flag.startswith("--max") or flag.startswith("--nproc"):
            value = str(len(value) % 3 + 1)  # valid numbers for these
        if not takes:
            argv.append(flag)
        elif use_eq:
            argv.append(f"{flag}={value}")
        else:
            argv += [flag, value]
    argv += ["train.py", *script_args]
    ctx = cli.main.make_context("resilient-launch", list(argv))
    ft = plan.ft_command(cli.launch_options(ctx), plan.Features(FLAGS, "0.4.1"), 4,
                         "node1:29400", "rs-77-r0-c1", log_dir="/state/torchelastic/{node}")
    # on NVRx 0.4.x behind the rank pin (launcher/cycle/rank_pin.py)
    ft = ft[ft.index("ft_launcher"):]
    if any(f == "-m" for f, _t, _v in opts):
        assert ft[:ft.index("train.py")].count("-m") == 1
    script = ft.index("train.py")
    head = ft[:script]
    assert sum(a.startswith("--nnodes") for a in head) == 1
    assert sum(a.startswith(("--rdzv-endpoint", "--rdzv_endpoint")) for a in head) == 1
    assert sum(a.startswith(("--rdzv-id", "--rdzv_id")) for a in head) == 1
    assert not any(a.startswith(("--standalone", "--master", "--node-rank", "--node_rank"))
                   for a in head)
    assert ft[script:] == ["train.py", *script_args]
    for flag, _takes, _v in opts:  # each passed-on flag as often as the user gave it
        if torchrun_args.canonical(flag) in torchrun_args.PASSED:
            given = sum(f == flag for f, _t, _x in opts)
            assert sum(a.split("=", 1)[0] == flag for a in head) == given, (flag, head)


@pytest.mark.parametrize("argv,floor", [
    (["train.py"], "10"),
    (["--heartbeat-floor=4", "train.py"], "4"),
    (["--heartbeat-timeout=30", "train.py"], None),
    (["--ft-rank-heartbeat-timeout=30", "train.py"], None),
    (["--ft-param-rank_heartbeat_timeout", "30", "train.py"], None),
])
def test_heartbeat_adapts_unless_the_user_chose(argv, floor) -> None:
    ctx = cli.main.make_context("resilient-launch", list(argv))
    assert cli.launch_options(ctx).extra_env.get("RESILIENT_HEARTBEAT_FLOOR") == floor


def test_every_torchrun_option_is_classified() -> None:
    """The table is torchrun's real option set (torch's own parser): each option is the
    launcher's, passed on, or resilient-launch's own; none is left to be an error."""
    run = pytest.importorskip("torch.distributed.run")
    ctx = cli.main.make_context("resilient-launch", ["t.py"])
    ours = {n for p in cli.main.get_params(ctx) for n in (*p.opts, *p.secondary_opts)}
    for action in run.get_args_parser()._actions:
        for flag in action.option_strings:
            if flag in ("-h", "--help"):
                continue
            canon = torchrun_args.canonical(flag)
            assert canon in torchrun_args.OWNED or canon in torchrun_args.PASSED \
                or flag in ours or canon in ours, flag

"""The user's NVRx configuration wins (flags and --ft-cfg-path YAML), --term-timeout is NVRx's
own unless given, and the cycle-info directory each cycle gets (pure, no Slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilient_slurm.launcher.cycle import ft_config, plan

FLAGS = frozenset({"--ft-rank-heartbeat-timeout", "--ft-initial-rank-heartbeat-timeout",
                   "--ft-enable-nic-monitor", "--term-timeout", "--workers-stop-timeout",
                   "--ft-workload-check-interval", "--local-addr", "--ft-cycle-info-dir",
                   "--log-dir"})
FEATS = plan.Features(FLAGS, "0.6.0")


def argv_for(**kw: object) -> list[str]:
    opts = plan.LaunchOptions(script="t.py", **kw)  # type: ignore[arg-type]
    return plan.ft_command(opts, FEATS, 2, "h:1", "rid", log_dir="/l", cycle_info_dir="/c")


def test_term_timeout_defaults_to_nvrx() -> None:
    argv = argv_for()
    assert not any(a.startswith(("--term-timeout", "--workers-stop-timeout")) for a in argv)
    assert plan.LaunchOptions(script="t").stop_grace == plan.NVRX_TERM_TIMEOUT == 1800
    given = argv_for(term_timeout=90.0)
    assert "--term-timeout=90" in given and "--workers-stop-timeout=90" in given


def test_users_yaml_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("model: {}\nfault_tolerance:\n  rank_heartbeat_timeout: 77\n"
                   "  enable_nic_monitor: true\n")
    ft_args = (f"--ft-cfg-path={cfg}",)
    user = ft_config.user_ft_settings(ft_args)
    argv = argv_for(ft_args=ft_args, user_ft=user, initial_heartbeat_timeout=300.0)
    assert not any(a.startswith(("--ft-rank-heartbeat-timeout", "--ft-enable-nic-monitor"))
                   for a in argv), argv
    assert any(a.startswith("--ft-initial-rank-heartbeat-timeout=") for a in argv)
    assert argv.count(f"--ft-cfg-path={cfg}") == 1


def test_nested_yaml_section_and_bad_files(tmp_path: Path) -> None:
    nested = tmp_path / "n.yaml"
    nested.write_text("trainer:\n  - x: 1\n  - fault_tolerance:\n      safety_factor: 3\n")
    assert "safety_factor" in ft_config.user_ft_settings((f"--ft-cfg-path={nested}",))
    none = tmp_path / "none.yaml"
    none.write_text("a: 1\n")
    for bad in (none, tmp_path / "missing.yaml"):
        with pytest.raises(ft_config.FtConfigError):
            ft_config.user_ft_settings((f"--ft-cfg-path={bad}",))


@pytest.mark.parametrize("flag", ["--ft-rank_heartbeat_timeout=5",
                                  "--ft-param-rank_heartbeat_timeout=5",
                                  "--ft-rank-heartbeat-timeout=5"])
def test_users_flag_any_spelling_once(flag: str) -> None:
    user = ft_config.user_ft_settings((flag,))
    argv = argv_for(ft_args=(flag,), user_ft=user)
    assert [a for a in argv if "heartbeat_timeout" in a.replace("-", "_")
            and "initial" not in a] == [flag]


def test_users_log_dir_and_cycle_info_dir_win() -> None:
    ft_args = ("--log-dir=/mine", "--ft-cycle-info-dir=/cyc")
    argv = argv_for(ft_args=ft_args, user_ft=ft_config.user_ft_settings(ft_args))
    assert [a for a in argv if a.startswith("--log-dir")] == ["--log-dir=/mine"]
    assert [a for a in argv if a.startswith("--ft-cycle-info-dir")] == ["--ft-cycle-info-dir=/cyc"]


def test_cycle_gets_its_own_cycle_info_dir() -> None:
    alloc = plan.Allocation(job_id=5, nodes=("n1", "n2"))
    opts = plan.LaunchOptions(script="t.py")
    c = plan.plan_cycle(alloc, opts, FEATS, ["n1", "n2"], {}, 3, "/s/cycles/r0-c3")
    assert c.cycle_info_dir == "/s/cycles/r0-c3/nvrx-cycles"
    assert "--ft-cycle-info-dir=/s/cycles/r0-c3/nvrx-cycles" in c.argv
    old = plan.plan_cycle(alloc, opts, plan.Features(FLAGS - {"--ft-cycle-info-dir"}, "0.4.1"),
                          ["n1"], {}, 1, "/s/c1")
    assert not any(a.startswith("--ft-cycle-info-dir") for a in old.argv)


@given(st.sampled_from(["--ft-", "--ft-param-", "--ft_", "--"]),
       st.lists(st.sampled_from(["rank", "heartbeat", "timeout", "safety", "factor"]),
                min_size=1, max_size=4),
       st.sampled_from(["-", "_"]))
@settings(max_examples=100, deadline=None)
def test_ft_key_spellings(prefix: str, words: list[str], sep: str) -> None:
    flag = prefix + sep.join(words) + "=1"
    key = ft_config.ft_key(flag)
    assert key == "_".join(words)


def test_task_level_env_stays_out_of_the_step() -> None:
    env = {"SLURM_GPUS_PER_TASK": "1", "SLURM_TRES_PER_TASK": "cpu:2,gres/gpu:1",
           "SLURM_CPUS_PER_TASK": "2", "SLURM_CPU_BIND": "cores", "SLURM_JOB_ID": "5",
           "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_NODELIST": "n[1-2]", "PATH": "/bin"}
    out = plan.step_env(env)
    assert out == {"SLURM_JOB_ID": "5", "SLURM_GPUS_ON_NODE": "8",
                   "SLURM_JOB_NODELIST": "n[1-2]", "PATH": "/bin"}


@pytest.mark.train
def test_feature_detection_is_cached_per_install(tmp_path: Path, monkeypatch) -> None:
    """ft_launcher --help runs once per installed ft_launcher (a copy of the real console
    script here); a changed script (reinstall, upgrade) is asked again."""
    import os
    import shutil
    import sys

    real = shutil.which("ft_launcher") or os.path.join(os.path.dirname(sys.executable),
                                                       "ft_launcher")
    if not os.path.exists(real):
        pytest.skip("nvidia-resiliency-ext not installed")
    exe = tmp_path / "bin" / "ft_launcher"
    exe.parent.mkdir()
    shutil.copy2(real, exe)
    monkeypatch.setenv("RESILIENT_CACHE_DIR", str(tmp_path / "cache"))
    first = plan.detect_features(str(exe))
    assert first.flag("heartbeat")
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1
    # the entry is what a later run reads: mark it, and the marker comes back without a run
    import json

    data = json.loads(entries[0].read_text())
    entries[0].write_text(json.dumps({**data, "flags": [*data["flags"], "--from-cache"]}))
    assert "--from-cache" in plan.detect_features(str(exe)).flags
    os.utime(exe, ns=(1, 1))  # "reinstalled": a new entry, asked again
    again = plan.detect_features(str(exe))
    assert "--from-cache" not in again.flags and again.flags == first.flags
    assert len(list((tmp_path / "cache").iterdir())) == 2
    entries[0].write_text("{corrupt")
    os.utime(exe, ns=(2, 2))
    assert plan.detect_features(str(exe), cache=False).flags == first.flags

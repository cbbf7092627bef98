"""Issue 12: hooks that hold up under bad input, bad state and a hostile environment.

These run the real hooks (in-process or as processes) on simulated nodes; Slurm is not needed
here because a healthy run must not ask it anything (the config points at a Slurm that does
not exist: any call would fail the run). Slurm-side behaviour is in test_holdup_cluster.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc

import pytest
from click.testing import CliRunner

from resilient_slurm.config import ConfigError, load_config
from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck.klog import sources
from resilient_slurm.healthcheck.seams import check_node
from resilient_slurm.hooks import nodestate
from resilient_slurm.hooks.health_cli import main as health_cli
from resilient_slurm_lab.hardware.klogfile import FileSource
from resilient_slurm_lab.hardware.plugin import ScenarioHardware
from resilient_slurm_lab.hardware.simulate import install_scenario

from ..healthcheck.helpers import by_check, make_config, on_nodes, write_scenario
from .conftest import hook_config, run_hook

XID79 = ("[86390.1] NVRM: Xid (PCI:0000:86:00): 79, pid='<unknown>', name=<unknown>, "
         "GPU has fallen off the bus.")


# -- item 4: content safety ----------------------------------------------------------------

def test_non_utf8_byte_in_kernel_log_still_finds_xid79(tmp_path, request):
    cfg = make_config(str(tmp_path))
    on_nodes(request, str(tmp_path / "nodes"))
    node = str(tmp_path / "nodes" / "n1")
    install_scenario(node, "clear")
    with open(os.path.join(node, "kernel.log"), "ab") as fh:
        fh.write(b"[86000.0] usb 1-1: bad descriptor \xff\xfe\xc3(\n" + XID79.encode() + b"\n")
    report = check_node(cfg, node="n1", only=["xid"])
    assert [r.code for r in by_check(report, "xid")] == ["XID79"]


def test_megabyte_line_of_efa_words_parses_in_linear_time():
    """The old pattern backtracked quadratically: this line never finished."""
    line = "efa " * 250_000 + "no admin trouble here"
    code = ("import sys; from resilient_slurm.healthcheck.klog.sources import parse_line; "
            "print(parse_line(sys.stdin.read()))")
    done = subprocess.run([sys.executable, "-c", code], input=line, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "None"
    fatal = "efa 0000:a8:00.0 rdmap168s0: Admin queue is closed"  # efa_com.c's words
    assert sources.parse_line(fatal).kind == "efa"  # type: ignore[union-attr]
    # a phrase the driver prints is only its word right after the prefix
    assert sources.parse_line("efa 0000:a8:00.0: " + "efa " * 1000 + "Admin queue is closed") \
        is None


def test_big_kernel_log_is_not_reread(tmp_path, request):
    """A 30 MB log with a saved position: the next run reads only what is new."""
    cfg = make_config(str(tmp_path))
    on_nodes(request, str(tmp_path / "nodes"))
    node = str(tmp_path / "nodes" / "n1")
    install_scenario(node, "clear")
    with open(os.path.join(node, "kernel.log"), "ab") as fh:
        chunk = (b"[100.0] audit: type=1400 apparmor=ALLOWED operation=open name=/x\n" * 16384)
        for _ in range(30 * 1024 * 1024 // len(chunk)):
            fh.write(chunk)
    # the first runs read it all, once (on a loaded machine a run may stop at its read budget:
    # the next one goes on from there)
    for _ in range(10):
        first = check_node(cfg, node="n1", only=["xid"])
        if "KLOG_PARTIAL" not in [r.code for r in by_check(first, "xid")]:
            break
    else:
        raise AssertionError("ten runs did not read the 30 MB log to its end")
    with open(os.path.join(node, "kernel.log"), "ab") as fh:
        fh.write(XID79.encode() + b"\n")
    tracemalloc.start()
    report = check_node(cfg, node="n1", only=["xid"])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [r.code for r in by_check(report, "xid")] == ["XID79"]
    assert peak < 8 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB: the log was read again"


def test_log_lines_are_parsed_inside_the_watchdog():
    src = FileSource.of_lines([XID79], "b", 100.0)
    read = sources.safe_read(src, None, 5.0)
    assert read._events is not None  # parsed in the gatherer's thread, not after the deadline
    assert [e.code for e in read._events] == [79]


# -- item 13: a ring wrap we cannot read back is unknown -----------------------------------

def test_klog_gap_is_unknown_unless_read_back_from_the_journal():
    from resilient_slurm.healthcheck.config import HealthConfig

    cfg = HealthConfig()
    ctx = cl.LogContext(cfg, lambda g: __import__(
        "resilient_slurm.healthcheck.policy", fromlist=["x"]).load_policy(g, cfg), {}, "hopper")
    gap = sources.LogRead("kmsg", "b", 100.0, [], {"seq": 9}, gap=True)
    (r,) = cl.evaluate_xid(gap, ctx)
    assert (r.status, r.code) == ("unknown", "KLOG_GAP")

    class Journal:
        name = "journal"

        def read(self, after, timeout):  # noqa: ANN001, ANN202
            return sources.LogRead("journal", "b", 100.0, [
                sources.LogRecord(0, 5.0, "old line"),
                sources.LogRecord(1, 7.0, XID79.split("] ", 1)[1]),
                sources.LogRecord(2, 9.5, "already in kmsg")])

    read = sources.LogRead("kmsg", "b", 100.0, [sources.LogRecord(50, 9.0, "first kept")],
                           {"seq": 51}, gap=True)
    sources.fill_gap(read, {"usec": 6_000_000}, Journal(), 5.0)  # type: ignore[arg-type]
    results = cl.evaluate_xid(read, ctx)
    assert read.gap_filled == "journal"
    assert {r.code for r in results} == {"KLOG_GAP_FILLED", "XID79"}


# -- item 7: values that make checks meaningless -------------------------------------------

@pytest.mark.parametrize("text,key", [
    ("[hooks]\nhealth_budget_s = nan\n", "hooks.health_budget_s"),
    ("[health]\nwatchdog_s = inf\n", "health.watchdog_s"),
    ("[health]\ntemperature_fail_c = -5.0\n", "health.temperature_fail_c"),
    ("[health.xid_overrides.hoper]\n'79' = 'drain'\n", "health.xid_overrides.hoper"),
    ("[health.boot_noise]\nhopp = [119]\n", "health.boot_noise.hopp"),
])
def test_meaningless_config_values_are_refused(tmp_path, text, key):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path), env={})
    assert key in str(err.value)


def test_non_utf8_config_and_scenario_exit_2_naming_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"[health]\nprofile = \"p5\xff\"\n")
    res = CliRunner().invoke(health_cli, ["check", "--config", str(bad)])
    assert res.exit_code == 2 and str(bad) in res.output and "Traceback" not in res.output
    scen = tmp_path / "scen.toml"
    scen.write_bytes(b"description = \"\xfe\"\n")
    good = tmp_path / "good.toml"
    good.write_text("[health]\n")
    res = CliRunner().invoke(health_cli, ["check", "--config", str(good), "--simulate",
                                          str(scen)])
    assert res.exit_code == 2 and str(scen) in res.output and "Traceback" not in res.output


def test_unknown_scenario_key_is_an_error(tmp_path):
    path = write_scenario(str(tmp_path), "typo", "[gpu]\ntemprature = 99\n")
    res = CliRunner().invoke(health_cli, ["check", "--simulate", path,
                                          "--config", str(tmp_path / "none.toml")])
    cfg = make_config(str(tmp_path))
    with pytest.raises(ConfigError) as err:
        check_node(cfg, hardware=ScenarioHardware(path), node="n1")
    assert "temprature" in str(err.value)
    assert res.exit_code == 2


def test_negative_temperature_and_ecc_from_the_tool_are_unknown(tmp_path):
    path = write_scenario(str(tmp_path), "neg", "[gpus.2]\ntemperature = -273\n"
                          "[gpus.4]\necc = [-1, 0]\n")
    report = check_node(make_config(str(tmp_path)), hardware=ScenarioHardware(path), node="n1",
                        only=["temperature", "ecc"])
    bad = {(r.check, r.status, r.device) for r in report.results if r.status != "ok"}
    assert ("temperature", "unknown", "gpu2") in bad and ("ecc", "unknown", "gpu4") in bad


# -- items 3 and 8: hooks -----------------------------------------------------------------

def test_healthy_hooks_never_ask_slurm_and_publish_their_verdict(tmp_path):
    config = hook_config(tmp_path, verdicts=True)
    for hook in ("prolog", "epilog", "health"):
        done = run_hook(hook, config)
        assert done.returncode == 0, (hook, done.stderr)
    from resilient_slurm import verdict_file

    rec = verdict_file.load(str(tmp_path / "root" / "verdicts" / "n1.json"))
    assert rec is not None and rec["status"] == "ok" and rec["healthy"]
    assert rec["source"] == "health" and rec["node"] == "n1" and rec["codes"] == []
    mode = os.stat(tmp_path / "root" / "verdicts" / "n1.json").st_mode & 0o777
    assert mode == 0o644


def test_broken_non_essential_io_does_not_change_the_verdict(tmp_path):
    config = hook_config(tmp_path, 'metrics_file = "/dev/null/metrics.prom"\n')
    text = open(config).read().replace(f'events_file = "{tmp_path}/root/events.jsonl"',
                                       'events_file = "/dev/null/events.jsonl"')
    open(config, "w").write(text)
    hooks_dir = tmp_path / "root" / "nodes" / "n1" / "hooks"
    assert run_hook("health", config).returncode == 0
    (hooks_dir / "streak.json").write_text("{not json")
    (hooks_dir / "jobs").mkdir(mode=0o700, exist_ok=True)
    (hooks_dir / "jobs" / "42.json").write_bytes(b"\xff\xfe garbage")
    for hook in ("epilog", "health", "prolog"):
        done = run_hook(hook, config)
        assert done.returncode == 0, (hook, done.stderr)
        assert "Traceback" not in done.stderr and "verdict unaffected" in done.stderr


def test_root_hooks_ignore_configuration_from_the_environment(tmp_path):
    config = hook_config(tmp_path)
    env = {"RESILIENT_SLURM_HEALTH_SIMULATE": "xid79",
           "RESILIENT_SLURM_HEALTH_TOOL_PATH": "/tmp/evil",
           "RESILIENT_SLURM_HOOKS_STATE_DIR": str(tmp_path / "evil")}
    done = run_hook("prolog", config, env)
    assert done.returncode == 0, done.stderr  # the file's healthy node, not the env's xid79
    assert not (tmp_path / "evil").exists()


def test_config_owner_and_mode_checked_at_run_time(tmp_path):
    config = hook_config(tmp_path)
    os.chmod(config, 0o666)
    done = run_hook("health", config)
    assert done.returncode == 2 and "writable by group or others" in done.stderr


def test_symlinked_state_dir_is_refused(tmp_path):
    config = hook_config(tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, tmp_path / "root" / "nodes" / "n1" / "hooks")
    done = run_hook("health", config)
    assert done.returncode == 4 and "symlink" in done.stderr
    assert os.listdir(target) == []


# -- item 9/10: no false holds ------------------------------------------------------------

def test_state_checks_and_unmapped_xids_never_hold(tmp_path):
    cfg = make_config(str(tmp_path))
    thermal = check_node(cfg, hardware=ScenarioHardware("thermal-slowdown"), node="n1")
    assert thermal.status == "fail" and nodestate.hold_for(thermal) is None
    path = write_scenario(str(tmp_path), "unmapped", "[kernel_log]\nappend = ["
                          '"[86000.0] NVRM: Xid (PCI:0000:53:00): 999, pid=1, name=x, new"]\n')
    unmapped = check_node(cfg, hardware=ScenarioHardware(path), node="n1", only=["xid"])
    (r,) = by_check(unmapped, "xid")
    assert (r.status, r.action) == ("unknown", "drain") and nodestate.hold_for(unmapped) is None
    xid79 = check_node(cfg, hardware=ScenarioHardware("xid79"), node="n1")
    assert nodestate.hold_for(xid79) is not None  # a mapped Xid does hold


def test_app_xids_from_one_job_do_not_drain_but_repeats_across_runs_do(tmp_path, request):
    cfg = make_config(str(tmp_path))
    on_nodes(request, str(tmp_path / "nodes"))
    node = str(tmp_path / "nodes" / "n1")
    install_scenario(node, "clear")
    xid13 = "NVRM: Xid (PCI:0000:53:00): 13, pid=1, name=python, Graphics Exception"

    def burst(n: int) -> object:
        with open(os.path.join(node, "kernel.log"), "a") as fh:
            fh.write(("[86000.0] " + xid13 + "\n") * n)
        return check_node(cfg, node="n1", only=["xid"])

    first = burst(3)
    assert first.status == "warn", [r.to_json() for r in first.results]
    assert burst(1).status == "warn"
    third = burst(1)
    (r,) = by_check(third, "xid")
    assert (r.status, r.code) == ("fail", "XID_APP_REPEAT")
    assert nodestate.hold_for(third) is None


def test_nonfatal_sxid_followup_lines_are_not_fatal():
    lines = ["nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 20034, Non-fatal, Link 30 LTSSM Fault Up",
             "nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 20034, Severity 0 Engine instance 30 "
             "Sub-engine instance 00",
             "nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 20034, Data {0x50610002, 0x10100030}"]
    from resilient_slurm.healthcheck.config import HealthConfig

    read = sources.LogRead("file", "b", 100.0,
                           [sources.LogRecord(i, None, t) for i, t in enumerate(lines)])
    results = cl.evaluate_sxid(read, cl.LogContext(HealthConfig(), lambda g: None))  # type: ignore[arg-type, return-value]
    assert [r.status for r in results] == ["warn"]


def test_efa_driver_action_comes_from_policy_data():
    from resilient_slurm.healthcheck import policy

    rule = policy.efa_rule_for("efa 0000:a8:00.0 rdmap168s0: Admin queue is closed")
    assert rule is not None and rule.action == "reboot" and rule.source


def test_ada_is_a_known_generation():
    from resilient_slurm.healthcheck.config import HealthConfig
    from resilient_slurm.healthcheck.policy import generation_of, load_policy

    assert generation_of("NVIDIA L40S") == "ada" and generation_of("NVIDIA L4") == "ada"
    assert generation_of(None, 8) == "ada"
    assert load_policy("ada", HealthConfig()).rule(79).action == "reboot"


# -- item 11: the epilog looks at the job's GPUs only -------------------------------------

def test_epilog_gpu_process_check_is_scoped_to_the_jobs_gpus(tmp_path):
    config = hook_config(tmp_path)
    node = tmp_path / "root" / "nodes" / "n1"
    scen = write_scenario(str(tmp_path / "s"), "other-job", "[gpus.5]\nprocesses = [4242]\n"
                          "memory = 70000\n")
    install_scenario(str(node), scen)
    done = run_hook("epilog", config, {"SLURM_JOB_GPUS": "0,1"})
    assert done.returncode == 0, done.stderr  # GPU 5 belongs to another job
    done = run_hook("epilog", config, {"SLURM_JOB_GPUS": "4,5"})
    assert done.returncode == 1  # ours: left behind (Slurm absent: the drain is only tried)


# -- item 12: diagnostic budgets ----------------------------------------------------------

def test_diag_budget_must_fit_prolog_epilog_timeout(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[hooks]\nepilog_diag_on_failure = true\nepilog_diag_level = 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path), env={})
    assert "PrologEpilogTimeout" in str(err.value)
    path.write_text("[hooks]\nepilog_diag_on_failure = true\nepilog_diag_level = 2\n"
                    "prolog_epilog_timeout_s = 300\n")
    hk = load_config(str(path), env={}).section("hooks")
    assert hk.diag_budget_s() >= 120  # level 2 takes about two minutes


def test_published_verdict_record_shape():
    from resilient_slurm.healthcheck.model import Report, Result
    from resilient_slurm.hooks import verdict

    rep = Report("n9", [Result("xid", "fail", "XID79", "lost", device="gpu3")])
    rec = verdict.verdict_record(rep, "epilog", 7, now=time.time())
    assert rec["codes"] == ["XID79"] and rec["healthy"] is False and rec["job"] == 7
    assert json.loads(json.dumps(rec)) == rec


# -- item 2: the prolog never fails on the lock ---------------------------------------------

@pytest.mark.integration  # two hook programs as processes, a 10 s dcgmi: about 10 s
def test_prolog_is_not_failed_by_a_slow_health_run(tmp_path):
    config = hook_config(tmp_path)
    text = open(config).read().replace("tool_timeout_s = 5", "tool_timeout_s = 15")
    text = text.replace("watchdog_s = 10", "watchdog_s = 20").replace(
        "health_budget_s = 10", "health_budget_s = 20")
    open(config, "w").write(text)
    scen = write_scenario(str(tmp_path / "s"), "slow", "[tools.dcgmi]\ndelay_s = 10\n")
    install_scenario(str(tmp_path / "root" / "nodes" / "n1"), scen)
    mod = "resilient_slurm_lab.hardware.hooks"
    health = subprocess.Popen(
        [sys.executable, "-I", "-c", f"import sys; from {mod} import health_main; "
         f"sys.exit(health_main(['--config', {config!r}]))"],
        env={"SLURMD_NODENAME": "n1"}, cwd="/", stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # the health run is now busy with its 10 s dcgmi
        done = run_hook("prolog", config)
        assert done.returncode == 0, done.stderr
    finally:
        assert health.wait(timeout=60) == 0


# -- item 10: policies ----------------------------------------------------------------------

def test_catalog_rows_and_nvlink5_severity_from_the_line():
    from resilient_slurm.healthcheck.config import HealthConfig
    from resilient_slurm.healthcheck.policy import load_policy

    cfg = HealthConfig()
    for gen in ("ampere", "ada", "hopper", "blackwell"):
        p = load_policy(gen, cfg)
        assert "training" in p.rule(136).meaning.lower()  # ALI_TRAINING_FAIL, not "(AWS table)"
        assert "initialization" in p.rule(143).meaning.lower()  # GPU_INIT_ERROR
    for gen in ("ampere", "hopper"):  # catalog: Xid 74 applies to A100 and H100 only
        assert load_policy(gen, cfg).rule(74).action == "reset_gpu"
    ctx = cl.LogContext(cfg, lambda g: load_policy(g, cfg), {"0000:04:00": (0, "blackwell")},
                        "blackwell")
    line = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP {} XC0 i0 Link 00 (0x00000004 0x{})"
    (r,) = cl.evaluate_xid(sources.LogRead("file", "b", 100.0, [
        sources.LogRecord(0, None, line.format("Nonfatal", "0"))]), ctx)
    assert (r.status, r.hold) == ("warn", False)
    (r,) = cl.evaluate_xid(sources.LogRead("file", "b", 100.0, [
        sources.LogRecord(0, None, line.format("Fatal", "40"))]), ctx)
    assert (r.status, r.action, r.hold) == ("fail", "reset_gpu", True)  # catalog decode row


def test_health_program_yields_to_a_starting_job(tmp_path):
    """While a prolog runs (it holds job-start.lock shared), a health run exits 0 at once."""
    import fcntl

    from resilient_slurm.events import read_events

    config = hook_config(tmp_path)
    hooks_dir = tmp_path / "root" / "nodes" / "n1" / "hooks"
    hooks_dir.mkdir(mode=0o700)
    with open(hooks_dir / "job-start.lock", "w") as lock:  # as a running prolog holds it
        fcntl.flock(lock, fcntl.LOCK_SH)
        done = run_hook("health", config)
    assert done.returncode == 0, done.stderr
    kinds = [e["kind"] for e in read_events(str(tmp_path / "root" / "events.jsonl"))]
    assert kinds[-1] == "health_yielded"


def test_symlink_planted_in_the_state_dir_is_not_followed(tmp_path):
    """Root must not write a job file (or anything) through a symlink planted in its state."""
    config = hook_config(tmp_path)
    hooks_dir = tmp_path / "root" / "nodes" / "n1" / "hooks"
    hooks_dir.mkdir(mode=0o700)
    target = tmp_path / "planted"
    target.mkdir()
    jobs = tmp_path / "root" / "nodes" / "n1" / "hooks" / "jobs"
    if jobs.exists():
        jobs.rmdir()
    os.symlink(target, jobs)
    done = run_hook("prolog", config)
    assert os.listdir(target) == [], "root wrote through the planted symlink"
    assert done.returncode == 0, done.stderr  # a job file is non-essential: warned
    (target / "42.json").write_text("{}")
    assert run_hook("epilog", config).returncode == 0
    assert os.listdir(target) == ["42.json"], "root removed a file through the symlink"

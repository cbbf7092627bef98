"""The Xid maps are NVIDIA's catalog, per generation (issue 23 item 8)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resilient_slurm.config import ConfigError
from resilient_slurm.healthcheck import checks_log as cl
from resilient_slurm.healthcheck import policy
from resilient_slurm.healthcheck.config import GPU_GENERATIONS, HealthConfig
from resilient_slurm.healthcheck.klog.sources import LogRead, LogRecord
from resilient_slurm.healthcheck.xid import table as xid_table
from resilient_slurm.healthcheck.xid.decode import line_rule

CFG = HealthConfig()
COLUMN = {"ampere": ("A100",), "ada": ("A100", "H100"), "hopper": ("H100",),
          "blackwell": ("B100",), "grace_blackwell": ("GB200",)}


def read(*lines: str) -> LogRead:
    return LogRead("file", "boot", 86400.0, [LogRecord(i, None, t) for i, t in enumerate(lines)],
                   {"source": "file", "boot_id": "boot", "seq": len(lines)})


def ctx(gen: str) -> cl.LogContext:
    return cl.LogContext(CFG, lambda g: policy.load_policy(g, CFG), {"0000:53:00": (0, gen)}, gen)


def xid(code: int, text: str = "detail") -> str:
    return f"NVRM: Xid (PCI:0000:53:00): {code}, pid=1, name=x, {text}"


def test_catalog_transcription_covers_every_code_once():
    listed = set(policy.catalog())
    unused = set(policy.unused_codes())
    assert not listed & unused
    assert listed | unused == set(range(1, 173))  # the copy read runs to Xid 172


def test_shipped_columns_are_the_catalog_columns():
    for gen in GPU_GENERATIONS:
        assert policy.load_policy(gen, CFG).columns == COLUMN[gen]


@pytest.mark.parametrize("gen", GPU_GENERATIONS)
def test_every_code_a_column_lists_takes_its_bucket_action(gen):
    """Fails on the old maps: 109 was restart_app (catalog RESET_GPU), 46/110/157/160... absent."""
    buckets = policy.bucket_actions()
    p = policy.load_policy(gen, CFG)
    for code, e in policy.catalog().items():
        rule = p.rule(code)
        listed = all(c in e.applies for c in COLUMN[gen])
        if e.immediate not in buckets or not (listed or e.immediate in policy.NEVER_DRAIN):
            assert not rule.mapped, (gen, code)
            continue
        action = buckets[e.immediate][0]
        if action == "decode":
            assert rule.decode, (gen, code)
        else:
            assert (rule.action, rule.mapped) == (action, True), (gen, code, e.immediate)
        assert rule.source.startswith("catalog"), rule


# Rows read from the catalog page by hand (independent of catalog.toml): generation -> Xid ->
# the action its map must take ("unknown": not listed for that column / no bucket).
SPOT = {
    "hopper": {46: "reset_gpu", 74: "reset_gpu", 109: "reset_gpu", 110: "reset_gpu",
               136: "reset_gpu", 151: "reboot", 156: "reset_gpu", 157: "ignore", 54: "drain",
               93: "ignore", 155: "unknown", 159: "unknown", 168: "unknown", 61: "unknown"},
    "ampere": {136: "unknown", 143: "unknown", 110: "unknown", 93: "ignore", 80: "restart_app"},
    "blackwell": {74: "unknown", 155: "reset_gpu", 159: "reset_gpu", 160: "ignore",
                  126: "restart_app", 54: "drain", 121: "ignore"},
    "grace_blackwell": {121: "ignore", 142: "drain", 54: "unknown", 161: "ignore",
                        162: "unknown", 167: "unknown"},
    "ada": {96: "restart_app", 110: "unknown", 79: "reboot", 143: "unknown"},
}


@pytest.mark.parametrize("gen", sorted(SPOT))
def test_spot_rows_read_from_the_catalog_page(gen):
    p = policy.load_policy(gen, CFG)
    for code, want in SPOT[gen].items():
        rule = p.rule(code)
        assert (rule.action if rule.mapped else "unknown") == want, (gen, code, rule)


@pytest.mark.parametrize("gen", GPU_GENERATIONS)
def test_ignore_and_restart_app_codes_never_drain(gen):
    """Fails on the old maps: 14, 37, 38, 44, 66, 67, 137, 157 (IGNORE) drained as unmapped."""
    for code, e in policy.catalog().items():
        if e.immediate not in policy.NEVER_DRAIN:
            continue
        results = cl.evaluate_xid(read(xid(code)), ctx(gen))
        assert all(r.status in ("ok", "warn") for r in results), (gen, code, results)
        assert not any(r.hold for r in results)


def test_only_the_catalogs_repeat_workflows_escalate_across_runs():
    """RESTART_APP never drains, except where the catalog's investigatory workflow
    (WORKFLOW_XID_13 / _31) says repeats on one GPU suspect it (was: every restart_app code,
    e.g. a copy-engine Xid 39, failed the GPU after three runs)."""
    for code, expect in ((13, "fail"), (31, "fail"), (39, "warn"), (94, "warn"), (8, "warn")):
        c = ctx("hopper")
        c.app_history = {"gpu0": [1.0, 2.0]}  # two earlier runs saw some
        (r,) = cl.evaluate_xid(read(xid(code)), c)
        assert r.status == expect, (code, r)
        assert not r.hold


@pytest.mark.parametrize("code,gen", [(171, "hopper"), (61, "hopper"), (173, "ampere"),
                                      (121, "nonexistent"), (136, "blackwell")])
def test_a_code_the_map_does_not_list_is_unknown_with_its_reason(code, gen):
    (r,) = cl.evaluate_xid(read(xid(code)), ctx(gen if gen != "nonexistent" else ""))
    assert (r.status, r.hold) == ("unknown", False), r
    if gen != "nonexistent":
        assert f"Xid {code} not in the {gen} map" in r.evidence
    else:
        assert "unknown GPU generation" in r.evidence


def test_gb200_corrected_c2c_and_nvlink_events_do_not_flap():
    """A GB200 node logging corrected C2C (121) and corrected NVLink5 events stays healthy."""
    lines = [xid(121, "C2C link corrected error")] * 40 + [
        "NVRM: Xid (PCI:0000:53:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 02 "
        "(0x00000004 0x00000100 0x00000000 0x00000000)",
        "NVRM: Xid (PCI:0000:53:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 05 "
        "(0x000004c6 0x00000001 0x00000000 0x00000000)",
        "NVRM: Xid (PCI:0000:53:00): 146, TLW_RX_PIPE0 Nonfatal XC0 i0 Link 07 "
        "(0x0000000a 0x00000001)",
    ] * 10
    (r,) = cl.evaluate_xid(read(*lines), ctx("grace_blackwell"))
    assert r.status == "ok", r
    assert "Xid 121" in r.reason


@pytest.mark.parametrize("text,action,hold", [
    ("RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040 0x0 0x0)", "reset_gpu", True),
    ("RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000004 0x00000001 0x0 0x0)", "restart_app", False),
    ("RLW_RXPIPE Nonfatal XC0 i0 Link 00 (0x00000006 0x00000002)", "ignore", False),
    ("RLW_RXPIPE Fatal XC0 i0 Link 00 (0x00000086 0x00000002)", "reset_gpu", True),  # promoted
    ("SAW_MVB Fatal XC0 i0 Link 03 (0x00000001 0x00000010)", "reset_gpu", True),
])
def test_nvlink5_lines_follow_the_catalog_decode(text, action, hold):
    line = f"NVRM: Xid (PCI:0000:53:00): {145 if text.startswith('RLW') else 144}, {text}"
    results = cl.evaluate_xid(read(line), ctx("blackwell"))
    if action == "ignore":
        assert [r.status for r in results] == ["ok"]
        return
    (r,) = results
    assert (r.action, r.hold) == (action, hold), r
    assert "144-150 decode" in r.evidence


@pytest.mark.parametrize("intrinfo,action", [
    (0x004505C6, "reset_gpu"),  # reason 4: INVESTIGATE_LINK_SI
    (0x025001C6, "reset_gpu"),  # reason 37: peer device
    (0x026001C6, "ignore"),     # reason 38: the catalog's IGNORE row
    (0x028001C6, "ignore"),     # reason 40
])
def test_xid149_link_events_decode_the_link_down_reason(intrinfo, action):
    rule = line_rule(policy.load_policy("grace_blackwell", CFG), 149,
                     f"NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x{intrinfo:08x} 0x00000000)")
    assert (rule.action, rule.mapped) == (action, True)


def test_undecodable_lines_fail_closed_but_unlisted_nonfatal_only_warns():
    p = policy.load_policy("blackwell", CFG)
    assert not line_rule(p, 145, "garbled").mapped
    assert not line_rule(p, 145, "RLW_NEWTHING Fatal XC0 i0 Link 0 (0x1 0x2)").mapped
    assert not line_rule(p, 149, "NETIR_LINK_EVT Fatal XC0 i0 Link 0 (0x03f001c6 0x0)").mapped
    warn = line_rule(p, 145, "RLW_NEWTHING Nonfatal XC0 i0 Link 0 (0x1 0x2)")
    assert warn.warn and warn.mapped
    assert not line_rule(p, 154, "GPU recovery action changed to 0x9 (Something New)").mapped


def test_doc_table_is_generated_from_the_data(tmp_path):
    assert xid_table.main(["--check"]) == 0, "docs/health.md: run xid_table --write"
    with open(xid_table.DOC, encoding="utf-8") as fh:
        doc = fh.read()
    stale = tmp_path / "health.md"
    stale.write_text(doc.replace("| 79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS | Y/Y/Y/Y | "
                                 "RESTART_BM | reboot", "| 79 | ROBUST_CHANNEL_GPU_HAS_FALLEN_"
                                 "OFF_THE_BUS | Y/Y/Y/Y | RESTART_BM | ignore"), encoding="utf-8")
    assert xid_table.main(["--check", "--doc", str(stale)]) == 1
    assert xid_table.main(["--write", "--doc", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == doc


_KEYS = st.one_of(st.integers(-5, 400).map(str), st.text(max_size=6),
                  st.sampled_from(["²", "١٢", "0079", "79 ", "+79", "1e3", ""]))
_ACTIONS = st.one_of(st.sampled_from(sorted(policy.ACTION_RANK)), st.text(max_size=10))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gen=st.sampled_from([*GPU_GENERATIONS, "hoper"]), key=_KEYS, action=_ACTIONS)
def test_site_override_is_applied_or_refused_never_a_traceback(tmp_path, gen, key, action):
    """Property: any ``[health.xid_overrides.<gen>] "<key>" = "<action>"`` an admin writes is
    either a ConfigError naming the key or applied exactly (was: "²" passed the check and
    then crashed the policy loader with ValueError)."""
    text = f"[health.xid_overrides.{gen}]\n{_toml_str(key)} = {_toml_str(action)}\n"
    d = tmp_path / f"c{abs(hash((gen, key, action)))}"
    d.mkdir(exist_ok=True)
    try:
        config = _load(str(d), text)
    except ConfigError as exc:
        assert "xid_overrides" in str(exc)
        return
    p = policy.load_policy(gen, config.health)
    rule = p.rule(int(key))
    assert (rule.action, rule.source) == (action, "config health.xid_overrides")


def _toml_str(s: str) -> str:
    """``s`` as a TOML basic string (any text a user could mean to write)."""
    body = "".join("\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 or
                   ord(c) == 0x7F else c for c in s)
    return f'"{body}"'


def _load(tmp: str, text: str):
    from resilient_slurm.config import load_config

    path = os.path.join(tmp, "config.toml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return load_config(path, env={})


@settings(max_examples=300, deadline=None)
@given(code=st.sampled_from([144, 145, 146, 147, 148, 149, 150, 154]),
       sub=st.one_of(st.sampled_from(["RLW_REMAP", "NETIR_LINK_EVT", "SAW_MVB", "TLW_TX", "TREX",
                                      "MSE_WATCHDOG", "X"]), st.text(max_size=12)),
       sev=st.sampled_from(["Fatal", "Nonfatal", "Non-fatal", "fatal", "", "Maybe"]),
       regs=st.lists(st.integers(0, 2**32 - 1), max_size=3), tail=st.text(max_size=20))
def test_decoded_lines_are_total_and_a_fatal_line_no_row_lists_is_never_ignored(
        code, sub, sev, regs, tail):
    text = f"{sub} {sev} XC0 i0 Link 01 (" + " ".join(f"0x{v:08x}" for v in regs) + f") {tail}"
    for gen in ("blackwell", "grace_blackwell"):
        rule = line_rule(policy.load_policy(gen, CFG), code, text)
        assert rule.action in policy.ACTION_RANK
        if rule.action == "ignore":  # only a catalog row (or a 154 line saying None) ignores
            assert rule.source.startswith("catalog"), rule


_NOISE = st.lists(st.one_of(st.integers(-(2**70), 2**70), st.booleans(), st.text(max_size=4),
                            st.floats(allow_nan=False, allow_infinity=False)), max_size=4)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _toml_str(v)
    return repr(v)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gen=st.sampled_from(GPU_GENERATIONS), codes=_NOISE)
def test_site_boot_noise_is_applied_or_refused_never_a_traceback(tmp_path, gen, codes):
    """Property: a ``[health.boot_noise]`` list is a ConfigError naming the key, or exactly
    the integers the admin wrote join the generation's boot noise."""
    text = f"[health.boot_noise]\n{gen} = [{', '.join(_toml_value(c) for c in codes)}]\n"
    d = tmp_path / f"n{abs(hash((gen, repr(codes))))}"
    d.mkdir(exist_ok=True)
    try:
        config = _load(str(d), text)
    except ConfigError as exc:
        assert "boot_noise" in str(exc) or "invalid TOML" in str(exc)
        return
    assert all(type(c) is int for c in codes), codes  # only integers are accepted
    assert set(codes) <= policy.load_policy(gen, config.health).boot_noise

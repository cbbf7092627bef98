"""Config errors an admin can act on: the file, the line, the close key; every numeric key
bounded; no file makes the loader raise anything but ConfigError (property test)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resilient_slurm.config import ConfigError, load_config, sections
from resilient_slurm.config_source import key_line

BIN = Path(sys.executable).parent


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return str(p)


def error(path: str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    return err.value


def test_typo_names_file_line_and_close_key(tmp_path: Path) -> None:
    path = write(tmp_path, "# site config\n[health]\nstate_dir = '/var/lib/x'\n"
                           "watchdog_sec = 30\n")
    assert str(error(path)) == (f"{path}:4: unknown key 'health.watchdog_sec' "
                                "(did you mean 'watchdog_s'?)")


def test_typo_in_a_nested_table_and_an_unknown_section(tmp_path: Path) -> None:
    err = error(write(tmp_path, '[hooks]\n[health.profiles."p5.x"]\ngpus = 8\n'
                                'efa_min_rate_gpbs = 2\n'))
    assert str(err).endswith(":4: unknown key 'health.profiles.p5.x.efa_min_rate_gpbs' "
                             "(did you mean 'efa_min_rate_gbps'?)")
    err = error(write(tmp_path, "\n[heatlh]\nwatchdog_s = 3\n"))
    assert str(err).endswith(":2: unknown section 'heatlh' (did you mean 'health'?)")


def test_bad_value_names_its_line(tmp_path: Path) -> None:
    err = error(write(tmp_path, "[health]\nprofile_patterns = { 'gpu-*' = 'p5.48xlarg' }\n"))
    assert str(err).startswith(f"{tmp_path}/config.toml:2: ")
    assert "unknown profile 'p5.48xlarg' (did you mean 'p5.48xlarge'?)" in str(err)
    assert err.key == "health.profile_patterns.gpu-*"


def test_key_line_finds_dotted_quoted_and_inline_keys() -> None:
    text = ('health.watchdog_s = 3\n[health.checks."ecc"]\nenabled = true\n'
            "[hooks]\nresume_after = 2 # x = 1\n")
    assert key_line(text, "health.watchdog_s") == 1
    assert key_line(text, "health.checks.ecc.enabled") == 3
    assert key_line(text, "hooks.resume_after") == 5
    assert key_line(text, "hooks.slurm_conf") is None  # not in the file: no line, no guess


@pytest.mark.parametrize("text,key", [
    ("[health]\nwatchdog_s = 1e12\n", "health.watchdog_s"),
    ("[health]\nboot_noise_window_s = 1e9\n", "health.boot_noise_window_s"),
    ("[health]\nxid_repeat_fail = 100000000000000000000000000000\n", "health.xid_repeat_fail"),
    ("[health.profiles.x]\ngpus = -1\n", "health.profiles.x.gpus"),
    ("[health.profiles.x]\npcie_width = 64\n", "health.profiles.x.pcie_width"),
    ("[health.boot_noise]\nhopper = [-5]\n", "health.boot_noise.hopper[0]"),
    ("[health]\ndcgm_diag_level = 3\n", "health.dcgm_diag_level"),  # 20 min in 40 s
    ("[hooks]\nprolog_epilog_timeout_s = 1e12\n", "hooks.prolog_epilog_timeout_s"),
    ("[hooks]\nresume_after = 0\n", "hooks.resume_after"),
    ("[health.xid_overrides.hopper]\n'²' = 'drain'\n", "health.xid_overrides.hopper.²"),
])
def test_bounds(tmp_path: Path, text: str, key: str) -> None:
    err = error(write(tmp_path, text))
    assert err.key == key, str(err)
    assert f":{text.count(chr(10))}: " in str(err)  # the value's line (the last one)


def test_a_diag_level_that_fits_is_accepted(tmp_path: Path) -> None:
    ok = load_config(write(tmp_path, "[health]\ndcgm_diag_level = 2\ndcgm_diag_timeout_s = 160"
                                     "\nwatchdog_s = 170\n"), env={})
    assert ok.health.dcgm_diag_level == 2


def _numeric_fields(cls: type, prefix: str, seen: set[type]) -> list[tuple[str, type]]:
    out = []
    for f in dataclasses.fields(cls):
        tp = get_type_hints(cls)[f.name]
        args = getattr(tp, "__args__", ())
        inner = [a for a in args if dataclasses.is_dataclass(a)]
        if tp in (int, float) or int in args or float in args:
            out.append((f"{prefix}.{f.name}", cls))
        for sub in ([tp] if dataclasses.is_dataclass(tp) else []) + inner:
            if sub not in seen:
                seen.add(sub)
                out += _numeric_fields(sub, f"{prefix}.{f.name}.*", seen)
    return out


def test_every_numeric_key_has_a_range() -> None:
    load_config(env={}, path="/dev/null")  # registers every section
    unbounded = [key for name, cls in sections().items()
                 for key, owner in _numeric_fields(cls, name, set())
                 if key.rsplit(".", 1)[1] not in getattr(owner, "BOUNDS", {})]
    assert unbounded == []


def test_an_unlisted_key_gets_the_default_range_for_input_only(tmp_path: Path) -> None:
    from resilient_slurm import config as cfgmod

    @dataclasses.dataclass
    class Extra:
        knob: float = -1.0  # a sentinel default, outside DEFAULT_BOUNDS

    cfgmod.register_section("extra_bounds")(Extra)
    try:
        assert load_config(write(tmp_path, ""), env={}).section("extra_bounds").knob == -1.0
        err = error(write(tmp_path, "[extra_bounds]\nknob = 1e12\n"))
        assert err.key == "extra_bounds.knob" and "between 0 and 1e+09" in str(err)
    finally:
        cfgmod._SECTIONS.pop("extra_bounds")


def test_health_cli_reports_an_overflowing_watchdog_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[health]\nwatchdog_s = 1e12\n")
    done = subprocess.run([str(BIN / "resilient-health"), "check", "--simulate", "healthy-p5",
                           "--config", path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"resilient-health: {path}:2: config key 'health.watchdog_s': must be between 0.5 and "
        "86400, got 1e+12"]


# --------------------------------------------------------------------------- property tests

KEYS = ["watchdog_s", "watchdog_sec", "simulate", "profile", "storage_paths", "dcgm_diag_level",
        "profile_patterns", "boot_noise", "xid_overrides", "checks", "profiles", "gpus",
        "resume_after", "owner_prefix", "prolog_epilog_timeout_s", "hopper", "79", "enabled",
        "temperature_warn_c", "kernel_log", "state_dir", "x"]
SCALARS = st.one_of(
    st.integers(), st.sampled_from([10**400, -(10**400), 2**63, 2**64 + 1, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.text(max_size=12), st.sampled_from(["p5.48xlarge", "hopper", "auto", "/abs", "drain"]))


def _toml_string(text: str) -> str:
    return '"' + "".join(c if c >= " " and c not in '"\\\x7f' else f"\\u{ord(c):04x}"
                         for c in text) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
    max_leaves=8)
def _typed(tp: Any) -> st.SearchStrategy[Any]:
    """Values of annotation ``tp``, extremes included (huge ints, nan, inf, odd text)."""
    ints = st.one_of(st.integers(), st.sampled_from([10**400, -(10**400), 2**63, 0, -1]))
    if tp is bool:
        return st.booleans()
    if tp is int:
        return ints
    if tp is float:
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True), ints)
    if tp is str:
        return st.one_of(st.text(max_size=12), st.sampled_from(
            ["p5.48xlarge", "hopper", "auto", "/abs", "drain", "{node}", "rhc:"]))
    args = getattr(tp, "__args__", ())
    if getattr(tp, "__origin__", None) is list:
        return st.lists(_typed(args[0]), max_size=3)
    if getattr(tp, "__origin__", None) is dict:
        keys = st.one_of(st.sampled_from(["hopper", "ada", "79", "gpu-*", "ecc", "p"]),
                         st.text(max_size=6))
        return st.dictionaries(keys, _typed(args[1]), max_size=3)
    if dataclasses.is_dataclass(tp):
        return _body(tp)
    return VALUES


def _body(cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A table for dataclass ``cls``: its keys with values of their types mostly, a wrong
    type or an unknown key now and then."""
    hints = get_type_hints(cls)
    fields = sorted(hints)
    key_value = st.one_of(
        st.sampled_from(fields).flatmap(lambda k: st.tuples(st.just(k), _typed(hints[k]))),
        st.sampled_from(fields).flatmap(lambda k: st.tuples(st.just(k), _typed(hints[k]))),
        st.tuples(st.sampled_from(KEYS), VALUES))
    return st.lists(key_value, max_size=5).map(dict)


def _docs() -> st.SearchStrategy[str]:
    from resilient_slurm.healthcheck.config import HealthConfig
    from resilient_slurm.hooks.config import HooksConfig

    sections = {"health": _body(HealthConfig), "hooks": _body(HooksConfig),
                "healthz": st.just({"x": 1})}
    return st.dictionaries(st.sampled_from(["health", "hooks", "health", "hooks", "healthz"]),
                           st.just(None), max_size=2).flatmap(
        lambda names: st.fixed_dictionaries({n: sections[n] for n in names})).map(
        lambda doc: "".join(f"[{name}]\n" + "".join(
            f"{_toml_string(k)} = {_toml_value(v)}\n" for k, v in body.items())
            for name, body in doc.items()))


DOCS = _docs()


def _load_only_config_errors(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "config.toml"
    p.write_bytes(data)
    try:
        load_config(str(p), env={})
    except ConfigError as exc:
        assert str(exc) and str(exc).isprintable()  # one line, whatever the file held


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(DOCS)
def test_no_structured_file_raises_anything_but_config_error(tmp_path: Path, doc: str) -> None:
    _load_only_config_errors(tmp_path, doc.encode("utf-8", "surrogatepass"))


@settings(max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(
    lambda t: t.encode("utf-8", "surrogatepass"))))
def test_no_byte_string_raises_anything_but_config_error(tmp_path: Path, data: bytes) -> None:
    _load_only_config_errors(tmp_path, data)

"""Simulated nodes: a node described as data, injected only at the hardware seams.

A scenario is a TOML file (shipped ones in ``scenarios/`` beside this module; format in
``scenarios/README.md``). Running one replaces exactly four things: the GPU backend
(:class:`.fakes.FakeNvml`), the kernel-log source (a list of lines), the sysfs root (a real
tree written to a temporary directory) and the tool search path (real generated ``dcgmi`` /
``fi_info`` executables that print, exit, hang or are absent). The engine, the runner, the
timeouts and the process-group kill are the real ones.

Installed nodes (the sandbox): ``install_scenario(node_dir, name)`` writes
``<node_dir>/scenario.toml`` and appends the scenario's kernel-log lines to
``<node_dir>/kernel.log`` (a new boot id starts a fresh log), so installing ``xid79`` makes
the next run see a *new* Xid, and the node's saved kernel-log position lives in
``<node_dir>/state``. A scenario file without a ``kernel.log`` beside it uses its own lines
and has no memory between runs.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import stat
import tempfile
from typing import Any

from resilient_slurm import fsutil
from resilient_slurm.config import Config, ConfigError, build_dataclass, tomllib
from resilient_slurm.healthcheck.config import HealthConfig

from .fakes import FakeNvml, write_gpu_pci, write_sysfs, write_tools
from .klogfile import FileSource

SCENARIO_DIR = os.path.join(os.path.dirname(__file__), "scenarios")
CLEAR = "healthy-p5"


def shipped_scenarios() -> list[str]:
    return sorted(f[:-5] for f in os.listdir(SCENARIO_DIR) if f.endswith(".toml"))


def scenario_path(name_or_path: str) -> str:
    """The file for a shipped name or a path; ``clear`` means ``healthy-p5``."""
    if name_or_path == "clear":
        name_or_path = CLEAR
    if os.sep not in name_or_path and not name_or_path.endswith(".toml"):
        path = os.path.join(SCENARIO_DIR, f"{name_or_path}.toml")
        if not os.path.exists(path):
            raise ConfigError("simulate", f"no shipped scenario {name_or_path!r} (shipped: "
                              f"{', '.join(shipped_scenarios())})")
        return path
    if not os.path.isfile(name_or_path):
        raise ConfigError("simulate", f"scenario file {name_or_path} does not exist")
    return name_or_path


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_GPU_KEYS = {"name", "architecture", "pci", "lost", "ecc", "ecc_mode", "remapped_rows",
             "retired_pages", "clock_reasons", "utilization", "temperature", "nvlink", "pcie",
             "fabric", "recovery_action", "processes", "memory", "ecc_corrected", "nvlink_crc"}
# The keys a scenario may hold, per table (``None``: any table below it is checked as ``gpu``).
SCHEMA: dict[str, Any] = {
    "description": True, "base": True, "profile": True,
    "nvml": {"behavior", "error", "driver", "count"},
    "gpu": _GPU_KEYS, "gpus": None,
    "kernel_log": {"boot_id", "uptime_s", "behavior", "lines", "append", "flood"},
    "rdma": {"efa", "efa_rate", "efa_down", "port_unreadable", "ib", "ib_rate", "ib_down",
             "unreadable"},
    "tools": {"dcgmi": {"behavior", "exit_code", "diag", "health", "delay_s", "argv_log"},
              "fi_info": {"behavior", "exit_code", "provider", "delay_s"},
              "systemctl": {"behavior", "exit_code", "delay_s", "fabricmanager", "imex"},
              "all_reduce_perf": {"behavior", "exit_code", "delay_s", "busbw_gbps"},
              "fi_pingpong": {"behavior", "exit_code", "delay_s", "gbps"},
              "ib_write_bw": {"behavior", "exit_code", "delay_s", "gbps"},
              "nvidia_smi": {"behavior", "exit_code", "delay_s", "reset", "argv_log"}},
    "site": {"health": True},
}


def check_schema(data: dict[str, Any], path: str) -> None:
    """Unknown keys in a scenario are an error naming the key (a typo must not pass)."""

    def bad(key: str, known: Any) -> ConfigError:
        return ConfigError("simulate", f"scenario {path}: unknown key '{key}' (known: "
                           f"{', '.join(sorted(known))})")

    for key, value in data.items():
        if key not in SCHEMA:
            raise bad(key, SCHEMA)
        spec = SCHEMA[key]
        if spec is True:
            continue
        if not isinstance(value, dict):
            raise ConfigError("simulate", f"scenario {path}: '{key}' must be a table")
        for sub, inner in value.items():
            if spec is None:  # [gpus.<index>]
                if not str(sub).isdigit() or not isinstance(inner, dict):
                    raise ConfigError("simulate", f"scenario {path}: 'gpus.{sub}' must be a "
                                      "table named by a GPU index")
                extra = set(inner) - _GPU_KEYS
                if extra:
                    raise bad(f"gpus.{sub}.{sorted(extra)[0]}", _GPU_KEYS)
            elif isinstance(spec, dict):
                if sub not in spec:
                    raise bad(f"{key}.{sub}", spec)
                inner_spec = spec[sub]
                if isinstance(inner_spec, set) and isinstance(inner, dict):
                    extra = set(inner) - inner_spec
                    if extra:
                        raise bad(f"{key}.{sub}.{sorted(extra)[0]}", inner_spec)
            elif sub not in spec:
                raise bad(f"{key}.{sub}", spec)


MAX_FLOOD = 1_000_000


def _flood(kl: dict[str, Any], path: str) -> list[str]:
    """``kernel_log.flood = {line, count}``: ``count`` copies of ``line`` (removed from kl)."""
    spec = kl.pop("flood", None)
    if spec is None:
        return []
    if not isinstance(spec, dict) or set(spec) != {"line", "count"} \
            or not isinstance(spec["line"], str) or not isinstance(spec["count"], int) \
            or isinstance(spec["count"], bool) or not 0 <= spec["count"] <= MAX_FLOOD:
        raise ConfigError("simulate", f"scenario {path}: kernel_log.flood must be "
                          f"{{line = \"...\", count = 0..{MAX_FLOOD}}}")
    return [spec["line"]] * spec["count"]


def load_scenario_data(path: str, _depth: int = 0) -> dict[str, Any]:
    """Parsed scenario with ``base`` resolved; ``kernel_log.flood`` then ``kernel_log.append``
    added to the lines."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except UnicodeDecodeError as exc:
        raise ConfigError("simulate", f"scenario {path}: not UTF-8 text (byte {exc.start}: "
                          f"{exc.reason})") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("simulate", f"scenario {path}: {exc}") from None
    check_schema(data, path)
    base_name = data.pop("base", None)
    if base_name:
        if _depth > 4:
            raise ConfigError("simulate", f"scenario {path}: 'base' nests too deep")
        if os.sep in base_name and not os.path.isabs(base_name):
            base_name = os.path.join(os.path.dirname(os.path.abspath(path)), base_name)
        base = load_scenario_data(scenario_path(base_name), _depth + 1)
        flood = _flood(data.get("kernel_log", {}), path)
        extra = flood + list(data.get("kernel_log", {}).pop("append", []))
        data = _merge(base, data)
        data.setdefault("kernel_log", {}).setdefault("lines", [])
        data["kernel_log"]["lines"] = list(data["kernel_log"]["lines"]) + list(extra)
    elif {"append", "flood"} & set(data.get("kernel_log", {})):
        kl = data["kernel_log"]
        flood = _flood(kl, path)
        kl["lines"] = list(kl.get("lines", [])) + flood + list(kl.pop("append", []))
    return data


class Scenario:
    """A loaded scenario and the fakes it stands for."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.data = load_scenario_data(path)
        self.name = os.path.splitext(os.path.basename(path))[0]
        self.profile = str(self.data.get("profile", ""))
        node_dir = os.path.dirname(self.path)
        self.installed = os.path.exists(os.path.join(node_dir, "kernel.log"))
        self.node_dir = node_dir if self.installed else None

    @property
    def state_dir(self) -> str | None:
        return os.path.join(self.node_dir, "state") if self.node_dir else None

    @property
    def boot_id(self) -> str:
        return str(self.data.get("kernel_log", {}).get("boot_id", "sim-boot-0"))

    def site_config(self, config: Config) -> Config:
        """``config`` with the scenario's ``[site.health]`` (the site settings it was recorded
        with, e.g. boot-noise codes) applied on top."""
        site = self.data.get("site", {}).get("health")
        if not site:
            return config
        health = build_dataclass(HealthConfig, site, f"{self.name}:site.health",
                                 base=config.health)
        health.validate()
        return Config({**config.sections, "health": health}, config.source)

    def gpu_backend(self) -> FakeNvml:
        return FakeNvml(self.data.get("nvml", {}), self.data.get("gpu", {}),
                        self.data.get("gpus", {}))

    def kernel_log_source(self) -> FileSource:
        kl = self.data.get("kernel_log", {})
        uptime = float(kl["uptime_s"]) if kl.get("uptime_s") is not None else None
        behavior = str(kl.get("behavior", "ok"))
        if self.node_dir:  # read from a byte offset, whatever the file holds
            return FileSource(os.path.join(self.node_dir, "kernel.log"), self.boot_id, uptime,
                              behavior)
        return FileSource.of_lines([str(x) for x in kl.get("lines", [])], self.boot_id, uptime,
                                   behavior)

    def materialize(self) -> tuple[str, str]:
        """The sysfs tree and tool executables of this scenario: (sysfs_root, bin_dir).

        Built once per distinct content into a private cache directory (building into a
        temporary directory, then renaming), reused read-only by later runs.
        """
        fake = self.gpu_backend()
        try:
            pcis = [fake.pci(i) for i in range(fake.count())]
        except (TypeError, ValueError):
            pcis = []  # a garbage GPU count: NVML's fake says so; no PCI tree
        spec = {"rdma": self.data.get("rdma", {}), "tools": self.data.get("tools", {}),
                "pci": pcis, "v": 4}  # v: the fakes' layout (4: the validation tools, nvidia-smi)
        key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
        base = _cache_base()
        final = os.path.join(base, key)
        if not os.path.isdir(final):
            tmp = tempfile.mkdtemp(prefix=".build-", dir=base)
            try:
                write_sysfs(os.path.join(tmp, "sys"), spec["rdma"])
                write_gpu_pci(os.path.join(tmp, "sys"), pcis)
                write_tools(os.path.join(tmp, "bin"), spec["tools"])
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise ConfigError("simulate", f"scenario {self.path}: bad [rdma] or [tools] "
                                  f"data: {exc}") from None
            try:
                os.rename(tmp, final)
            except OSError:  # another run built it first
                shutil.rmtree(tmp, ignore_errors=True)
        return os.path.join(final, "sys"), os.path.join(final, "bin")


def _cache_base() -> str:
    """``$TMPDIR/rhc-sim-<uid>``: created 0700, must be ours and not a symlink."""
    base = os.path.join(tempfile.gettempdir(), f"rhc-sim-{os.geteuid()}")
    os.makedirs(base, mode=0o700, exist_ok=True)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError("simulate", f"{base} is not a private directory of this user")
    return base


def resolve_scenario(value: str, node: str) -> Scenario:
    """The scenario ``value`` names (a shipped name or a path), ``{node}`` in it replaced by
    ``node``. ConfigError for an unknown name, a missing file or bad data."""
    return Scenario(scenario_path(value.replace("{node}", node)))


def install_scenario(node_dir: str, scenario: str) -> str:
    """Make ``node_dir``'s simulated node become ``scenario`` (name, path or ``clear``).

    Writes ``<node_dir>/scenario.toml`` atomically and appends the scenario's kernel-log lines
    to ``<node_dir>/kernel.log`` (fresh log when the boot id changes). Returns the scenario path.
    """
    src = scenario_path(scenario)
    new = load_scenario_data(src)  # validates before anything is written
    with open(src, encoding="utf-8") as fh:
        text = fh.read()
    os.makedirs(node_dir, exist_ok=True)
    target = os.path.join(node_dir, "scenario.toml")
    log = os.path.join(node_dir, "kernel.log")
    new_boot = str(new.get("kernel_log", {}).get("boot_id", "sim-boot-0"))
    with fsutil.locked(os.path.join(node_dir, ".scenario.lock"), timeout=10):
        old_boot = None
        if os.path.exists(target) and os.path.exists(log):
            try:
                old_boot = str(load_scenario_data(target).get("kernel_log", {})
                               .get("boot_id", "sim-boot-0"))
            except ConfigError:
                old_boot = None
        added = "".join(str(x) + "\n" for x in new.get("kernel_log", {}).get("lines", []))
        # Root-only, like dmesg with kernel.dmesg_restrict=1 (the scenario carries log lines).
        if old_boot == new_boot:  # append (bytes as they are: a log need not be UTF-8)
            with open(log, "ab") as fh:
                fh.write(added.encode())
            os.chmod(log, 0o600)
        else:
            fsutil.atomic_write(log, added, mode=0o600)
        fsutil.atomic_write(target, text, mode=0o600)
    return target

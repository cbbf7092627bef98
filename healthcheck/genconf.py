"""``resilient-health genconf``: a profile written from a known-good node's hardware.

As NHC's ``nhc-genconf``: run it once on a node you trust, review the file, install it as a
site profile (``[health.profiles.<name>]`` in config.toml). It reads the same seams as the
checks (NVML through :func:`.gpu.gather_gpus` with its timeout, the RDMA tree under the sysfs
root, the tool search path), so it can be tested on simulated hardware (the lab's).

What it records: GPU count and generation (NVML name / architecture), NVLinks up per GPU,
NVSwitch fabric (every GPU's fabric state *completed*), PCIe capability (the lowest max gen and
width over the GPUs), ECC on (then required), the NVML fields every GPU answers (then
``nvml_required``), whether the fabric manager / IMEX services are active (then required), EFA
adapter count and InfiniBand port count with their lowest port rate, and whether ``dcgmi`` /
``fi_info`` are installed (then required).

A node is not "known good" when anything it would record is broken: NVML errors, a link or
port that is not up, GPUs that disagree with each other. Those are ``problems``: the profile
would bake the fault in, so the CLI refuses to write it unless told to (``--force``).
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
from dataclasses import dataclass, field, fields
from typing import Any

from resilient_slurm import proc
from resilient_slurm.config import ConfigError, build_dataclass, tomllib
from resilient_slurm.healthcheck.config import ProfileSpec

from . import checks_fabric
from .gpu import GpuBackend, GpuSnapshot, gather_gpus
from .policy import generation_of
from .sysfs import RdmaInventory, read_rdma

# The NVML fields a known-good node's profile requires when every GPU answers them.
REQUIRED_CANDIDATES = ("ecc", "ecc_mode", "remapped_rows", "clock_reasons", "utilization",
                       "temperature", "pcie")
GENCONF_FIELDS = {"nvlink", "pcie", "fabric", *REQUIRED_CANDIDATES}


@dataclass
class Observation:
    """What genconf saw: the profile, facts for the file's header, and what is wrong."""

    spec: ProfileSpec
    gpu_names: list[str] = field(default_factory=list)
    driver: str = ""
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class CannotObserve(Exception):
    """NVML did not answer (init error, timeout, error): nothing can be vouched for."""


def _gpus(snap: GpuSnapshot, spec: ProfileSpec, obs: Observation) -> None:
    if not snap.usable:
        raise CannotObserve(snap.describe_failure())
    spec.gpus = snap.count or 0
    obs.driver = snap.driver
    if not snap.gpus:
        obs.notes.append("no GPUs visible to NVML: the profile expects none")
        return
    gens, links, max_gens, max_widths, fabric = set(), set(), [], [], set()
    for g in snap.gpus:
        dev = f"gpu{g.index}"
        obs.gpu_names.append(g.name)
        for name, err in sorted(g.errors.items()):
            if err != "NOT_SUPPORTED":
                obs.problems.append(f"{dev}: NVML {err} reading {name}")
        gens.add(generation_of(g.name, g.architecture))
        states = g.values.get("nvlink")
        if states is not None:
            down = [str(i) for i, up in enumerate(states) if not up]
            if down:
                obs.problems.append(f"{dev}: NVLink(s) {','.join(down)} down")
            links.add(sum(1 for up in states if up))
        elif g.errors.get("nvlink") == "NOT_SUPPORTED":
            links.add(0)
        pcie = g.values.get("pcie")
        if pcie is not None:
            cur_gen, cur_w, max_gen, max_w = pcie
            max_gens.append(int(max_gen))
            max_widths.append(int(max_w))
            if cur_w < max_w:
                obs.problems.append(f"{dev}: PCIe link running x{cur_w} of x{max_w}")
        state = g.values.get("fabric")
        fabric.add("not_supported" if g.errors.get("fabric") == "NOT_SUPPORTED" else state)
    if len(set(obs.gpu_names)) > 1:
        obs.problems.append(f"GPUs of different kinds: {', '.join(sorted(set(obs.gpu_names)))}")
    if len(gens) == 1 and "" not in gens:
        spec.gpu_generation = gens.pop()
    elif len(gens) == 1:
        obs.notes.append(f"GPU generation of {obs.gpu_names[0]!r} unknown to the Xid policy: "
                         "gpu_generation left empty (every Xid drains)")
    if len(links) > 1:
        obs.problems.append(f"GPUs have different numbers of NVLinks up: {sorted(links)}")
    spec.nvlinks_per_gpu = min(links) if links else 0
    if fabric == {"completed"}:
        spec.nvswitch = True
    elif fabric - {"not_supported", None}:
        obs.problems.append(f"GPU fabric state {', '.join(sorted(str(s) for s in fabric))}: "
                            "an NVSwitch node that is ready reports completed")
    spec.pcie_gen = min(max_gens) if max_gens else 0
    spec.pcie_width = min(max_widths) if max_widths else 0
    spec.require_ecc = all(bool((g.values.get("ecc_mode") or (False,))[0]) for g in snap.gpus)
    spec.nvml_required = [f for f in REQUIRED_CANDIDATES
                          if all(f in g.values for g in snap.gpus)]


def _services(tool_path: str, spec: ProfileSpec, obs: Observation) -> None:
    """Require the fabric manager / IMEX services this node runs (active now)."""
    for unit, attr in ((checks_fabric.FABRIC_MANAGER, "fabric_manager"),
                       (checks_fabric.IMEX, "imex")):
        out = proc.run(checks_fabric.probe_argv(unit), 5.0, search_path=tool_path)
        state = checks_fabric.parse_show(out.stdout) if out.ok else {}
        setattr(spec, attr, state.get("ActiveState") == "active")
        if not out.ok:
            obs.notes.append(f"{unit}: {out.describe()}: not required")


def _rdma(inv: RdmaInventory, spec: ProfileSpec, obs: Observation) -> None:
    if inv.error:
        obs.problems.append(f"RDMA devices unreadable: {inv.error}")
        return
    for p in inv.ports:
        if p.error:
            obs.problems.append(f"{p.name}: {p.error}")
        elif p.state != "ACTIVE" and p.kind != "eth":
            obs.problems.append(f"{p.name} ({p.kind}) is {p.state or '?'}")
    efa_rates = [p.rate_gbps for p in inv.ports if p.kind == "efa" and p.rate_gbps]
    ib_rates = [p.rate_gbps for p in inv.ports if p.kind == "ib" and p.rate_gbps]
    spec.efa = inv.count("efa")
    spec.efa_min_rate_gbps = min(efa_rates) if efa_rates else 0.0
    spec.ib_ports = sum(1 for p in inv.ports if p.kind == "ib")
    spec.ib_min_rate_gbps = min(ib_rates) if ib_rates else 0.0
    eth = sum(1 for p in inv.ports if p.kind == "eth")
    if eth:
        obs.notes.append(f"{eth} RoCE (Ethernet link layer) port(s) seen, not profiled")
    if not spec.efa and not spec.ib_ports:
        obs.notes.append("no EFA or InfiniBand devices: the profile expects none")


def observe(gpu: GpuBackend, sysfs_root: str, tool_path: str,
            nvml_timeout: float) -> Observation:
    """Read this node through the seams. Raises :class:`CannotObserve` when NVML is unusable."""
    spec = ProfileSpec()
    obs = Observation(spec)
    _gpus(gather_gpus(gpu, nvml_timeout, fields=set(GENCONF_FIELDS)), spec, obs)
    _rdma(read_rdma(sysfs_root), spec, obs)
    _services(tool_path, spec, obs)
    spec.require_dcgm = shutil.which("dcgmi", path=tool_path) is not None
    if not spec.require_dcgm:
        obs.notes.append("dcgmi not found: DCGM checks not required by this profile")
    spec.require_fi_info = spec.efa > 0 and shutil.which("fi_info", path=tool_path) is not None
    if spec.efa and not spec.require_fi_info:
        obs.notes.append("EFA present but fi_info not found: fi_info not required")
    obs.notes.append(f"{', '.join(FLOOR_KEYS)}: the validation's floors are not observed; set "
                     "them from your fleet's median (`resilient-health validate` prints each "
                     "node's figures) or a node will not validate")
    return obs


FLOOR_KEYS = ("allreduce_busbw_gbps", "loopback_gbps")  # measured, never observed


def default_name(obs: Observation) -> str:
    """``<count>x-<gpu name>`` in lower case, e.g. ``8x-nvidia-h100-80gb-hbm3``."""
    kind = obs.gpu_names[0] if obs.gpu_names else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "gpu"
    return f"{obs.spec.gpus}x-{slug}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # its escapes are a subset of TOML's basic strings
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def render(name: str, obs: Observation, node: str, match: list[str] | None = None,
           now: datetime.datetime | None = None) -> str:
    """The profile as a config fragment (``[health.profiles."<name>"]``), checked by reading
    it back through the config loader."""
    if not name or any(c in name for c in "\"\\\n"):
        raise ConfigError("--name", f"bad profile name {name!r}")
    spec = obs.spec
    spec.match = list(match or [])
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"# Written by `resilient-health genconf` on node {node} at {stamp}.",
             f"# GPUs: {', '.join(sorted(set(obs.gpu_names))) or 'none'}; "
             f"driver {obs.driver or '?'}."]
    lines += [f"# note: {n}" for n in obs.notes]
    lines += [f"# PROBLEM (written anyway, --force): {p}" for p in obs.problems]
    lines += ["# Review, then use it with `--profile NAME`, health.profile or profile_patterns.",
              f"[health.profiles.{json.dumps(name)}]"]
    for f in fields(ProfileSpec):
        lines.append(f"{f.name} = {_toml_value(getattr(spec, f.name))}")
    text = "\n".join(lines) + "\n"
    data = tomllib.loads(text)
    back = build_dataclass(ProfileSpec, data["health"]["profiles"][name], f"profile {name}")
    if back != spec:  # pragma: no cover - the writer and the loader disagree
        raise AssertionError(f"genconf wrote a profile that reads back differently: {back}")
    return text


__all__ = ["CannotObserve", "Observation", "default_name", "observe", "render"]

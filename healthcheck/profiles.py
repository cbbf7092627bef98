"""Profiles: expected hardware per node class, chosen by node-name pattern.

Order: explicit name (``--profile`` / ``health.profile``), ``health.profile_patterns``, the
``match`` globs of site profiles, then of shipped ones (``profiles.toml``), then a simulated
scenario's own ``profile``. No match: ``unknown`` (the node is drained: nothing says what it should
have), unless the admin set ``health.allow_unmatched_profile``, which makes it a warning and
compares no counts.
"""

from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass

from resilient_slurm.config import ConfigError, build_dataclass, tomllib
from resilient_slurm.healthcheck.config import SHIPPED_PROFILES, HealthConfig, ProfileSpec

from .gpu import FIELDS
from .model import OK, UNKNOWN, WARN, Result

SHIPPED = SHIPPED_PROFILES


def check_profile(where: str, spec: ProfileSpec) -> ProfileSpec:
    """``spec``, or a ConfigError naming ``where`` for an ``nvml_required`` field NVML lacks."""
    bad = [f for f in spec.nvml_required if f not in FIELDS]
    if bad:
        raise ConfigError(f"{where}.nvml_required", f"unknown NVML field {bad[0]!r} (known: "
                          f"{', '.join(FIELDS)})")
    return spec


@functools.lru_cache(maxsize=1)
def shipped_profiles() -> dict[str, ProfileSpec]:
    with open(SHIPPED, "rb") as fh:
        data = tomllib.load(fh)
    return {name: check_profile(f"profiles.toml:{name}",
                                build_dataclass(ProfileSpec, spec, f"profiles.toml:{name}"))
            for name, spec in data.get("profile", {}).items()}


def all_profiles(cfg: HealthConfig) -> dict[str, ProfileSpec]:
    for name, spec in cfg.profiles.items():
        check_profile(f"health.profiles.{name}", spec)
    merged = dict(cfg.profiles)  # site first: it wins on name and on match order
    for name, spec in shipped_profiles().items():
        merged.setdefault(name, spec)
    return merged


@dataclass
class Selection:
    name: str
    spec: ProfileSpec
    how: str  # explicit | pattern | match | scenario | auto

    def result(self, node: str, allow_unmatched: bool = False) -> Result:
        if self.how == "auto" and allow_unmatched:
            return Result("profile", WARN, "PROFILE_AUTO", f"no profile matches node '{node}': "
                          "expected hardware unknown, counts not compared (allowed by "
                          "health.allow_unmatched_profile)", f"node={node}")
        if self.how == "auto":
            return Result("profile", UNKNOWN, "PROFILE_UNMATCHED", f"no profile matches node "
                          f"'{node}': expected hardware unknown, so nothing vouches for it (add "
                          "a profile or set health.allow_unmatched_profile)", f"node={node}")
        return Result("profile", OK, "OK", f"profile {self.name} ({self.how})",
                      f"node={node} profile={self.name}")


def select_profile(cfg: HealthConfig, node: str, explicit: str | None = None,
                   scenario_profile: str = "") -> Selection:
    profiles = all_profiles(cfg)
    name = explicit or cfg.profile
    if name:
        if name not in profiles:
            key = "--profile" if explicit else "health.profile"
            raise ConfigError(key, f"unknown profile {name!r} (known: {', '.join(profiles)})")
        return Selection(name, profiles[name], "explicit")
    for pattern, pname in cfg.profile_patterns.items():
        if fnmatch.fnmatchcase(node, pattern):
            if pname not in profiles:
                raise ConfigError(f"health.profile_patterns.{pattern}",
                                  f"unknown profile {pname!r}")
            return Selection(pname, profiles[pname], "pattern")
    for pname, spec in profiles.items():
        if any(fnmatch.fnmatchcase(node, pat) for pat in spec.match):
            return Selection(pname, spec, "match")
    if scenario_profile and scenario_profile in profiles:
        return Selection(scenario_profile, profiles[scenario_profile], "scenario")
    return Selection("auto", ProfileSpec(), "auto")

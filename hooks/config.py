"""``[hooks]``: how the prolog, epilog and HealthCheckProgram act on a node.

Paths may contain ``{node}`` (replaced by the node name), so one file serves every node of a
sandbox where several nodes share one host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from resilient_slurm.config_schema import ConfigError, check_finite, register_section
from resilient_slurm.healthcheck.config import DIAG_LEVEL_BUDGET_S
from resilient_slurm.verdict_file import DEFAULT_PATH as DEFAULT_VERDICT_PATH

# The node watcher's default checks: NVML's one-shot answers (a lost GPU, ECC, row remapping,
# NVML's recovery action); a kernel-log check would move the health program's read position.
WATCH_CHECKS = ("gpu_count", "ecc", "row_remap", "recovery_action", "error_rates")
# Result codes that are precursors of a failure, not failures (hooks/precursor.py): a node
# showing one stays usable while a job runs there (published for its launcher to move off)
# and is drained for repair once none does.
PRECURSORS = ("ROW_REMAP_PENDING", "ECC_CORRECTED_RATE", "NVLINK_CRC_RATE")


@register_section("hooks")
@dataclass
class HooksConfig:
    """``[hooks]`` keys.

    ``owner_prefix`` starts every drain reason we write; only nodes whose reason starts with it
    are ever resumed by us. ``resume_after`` consecutive healthy health-program runs resume such
    a node. ``reboot_enabled`` lets an Xid whose policy action is ``reboot`` become
    ``scontrol reboot ASAP nextstate=RESUME`` instead of a drain. ``slurm_conf`` is needed by the
    HealthCheckProgram, whose environment holds only SLURMD_NODENAME. Budgets bound each hook's
    checks (keep them well under PrologEpilogTimeout and the 60 s HealthCheckProgram limit).
    ``verdict_file``: where each run publishes this node's latest verdict, world-readable
    (``docs/hooks.md``); empty: not published. The fleet guard (``hooks/fleet.py``) keeps a node
    up instead of draining it when more than ``max_drain_fraction`` of the nodes (at least one)
    would be drained by us for the same cause, or more than ``max_drains_per_interval`` (0: no
    limit) within ``drain_interval_s``.
    """

    owner_prefix: str = "rhc:"
    resume_after: int = 3
    reboot_enabled: bool = False
    max_drain_fraction: float = 0.1
    max_drains_per_interval: int = 10
    drain_interval_s: float = 600.0
    slurm_conf: str = ""
    slurm_bin_dir: str = "/usr/bin:/usr/local/bin:/opt/slurm/bin"
    slurm_timeout_s: float = 8.0
    state_dir: str = "/var/lib/resilient-slurm/hooks/{node}"
    events_file: str = "/var/log/resilient-slurm/events.jsonl"
    metrics_file: str = ""
    verdict_file: str = DEFAULT_VERDICT_PATH
    lock_timeout_s: float = 5.0
    prolog_budget_s: float = 20.0
    epilog_budget_s: float = 45.0
    health_budget_s: float = 30.0
    epilog_diag_on_failure: bool = False
    epilog_diag_level: int = 2
    epilog_diag_budget_s: float = 0.0  # 0: DIAG_LEVEL_BUDGET_S[epilog_diag_level]
    prolog_epilog_timeout_s: float = 120.0  # slurm.conf PrologEpilogTimeout
    memory_tier_dir: str = "/dev/shm"  # the epilog removes <dir>/<job id> (empty: never)
    # The node watcher (`resilient-health watch`, hooks/watch.py): these checks every
    # watch_interval_s, each run bounded by watch_budget_s; NVML only (no kernel log).
    watch_interval_s: float = 2.0
    watch_budget_s: float = 5.0
    watch_checks: list[str] = field(default_factory=lambda: list(WATCH_CHECKS))
    precursors: list[str] = field(default_factory=lambda: list(PRECURSORS))

    # Every numeric key's range (inclusive), checked at load; PrologEpilogTimeout is a uint16.
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "resume_after": (1, 1000), "slurm_timeout_s": (0.1, 600), "lock_timeout_s": (0.1, 600),
        "prolog_budget_s": (0.1, 65_533), "epilog_budget_s": (0.1, 65_533),
        "health_budget_s": (0.1, 58), "epilog_diag_level": (1, 4),
        "epilog_diag_budget_s": (0, 65_533), "prolog_epilog_timeout_s": (1, 65_533),
        # the fleet guard's keys (branch health-holds), bounded as its validate() does
        "max_drain_fraction": (0, 1), "max_drains_per_interval": (0, 1_000_000),
        "drain_interval_s": (1, 7 * 86_400),
        "watch_interval_s": (0.2, 3600), "watch_budget_s": (0.1, 600),
    }

    def diag_budget_s(self) -> float:
        """Seconds the epilog's ``dcgmi diag -r LEVEL`` may take."""
        return self.epilog_diag_budget_s or DIAG_LEVEL_BUDGET_S[self.epilog_diag_level]

    def validate(self) -> None:
        check_finite(self, "hooks")
        prefix = self.owner_prefix
        if not (2 <= len(prefix) <= 12) or not all(c.isalnum() or c in ":-_" for c in prefix):
            raise ConfigError("hooks.owner_prefix", "2-12 characters of letters, digits, ':-_'")
        if self.resume_after < 1:
            raise ConfigError("hooks.resume_after", "must be >= 1")
        if not 0.0 < self.max_drain_fraction <= 1.0:
            raise ConfigError("hooks.max_drain_fraction", "must be > 0 and <= 1 (1: no share "
                              "limit)")
        if not 0 <= self.max_drains_per_interval <= 1_000_000:
            raise ConfigError("hooks.max_drains_per_interval", "must be 0 (no limit) to 1000000")
        if not 1.0 <= self.drain_interval_s <= 7 * 86400:
            raise ConfigError("hooks.drain_interval_s", "must be 1 s to 7 days")
        for name in ("slurm_timeout_s", "lock_timeout_s", "prolog_budget_s", "epilog_budget_s",
                     "health_budget_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"hooks.{name}", "must be > 0")
        if self.health_budget_s + self.slurm_timeout_s * 2 + self.lock_timeout_s > 58:
            raise ConfigError("hooks.health_budget_s",
                              "budget + 2 x slurm_timeout_s + lock_timeout_s must stay under "
                              "Slurm's 60 s HealthCheckProgram limit")
        if not self.watch_checks:
            raise ConfigError("hooks.watch_checks", "name at least one check (the default: "
                              f"{', '.join(WATCH_CHECKS)})")
        for code in self.precursors:
            if not (code and code.isascii() and all(c.isupper() or c.isdigit() or c == "_"
                                                    for c in code)):
                raise ConfigError("hooks.precursors", f"{code!r}: a result code (upper-case "
                                  "letters, digits, '_'), e.g. ECC_CORRECTED_RATE")
        if self.epilog_diag_level not in (1, 2, 3, 4):
            raise ConfigError("hooks.epilog_diag_level", "must be 1, 2, 3 or 4")
        overhead = 2 * self.slurm_timeout_s + self.lock_timeout_s
        limit = self.prolog_epilog_timeout_s
        if self.prolog_budget_s + overhead >= limit:
            raise ConfigError("hooks.prolog_budget_s", f"budget + 2 x slurm_timeout_s + "
                              f"lock_timeout_s must stay under PrologEpilogTimeout ({limit:g} s, "
                              "hooks.prolog_epilog_timeout_s)")
        epilog = self.epilog_budget_s + overhead
        if self.epilog_diag_on_failure:
            epilog += self.diag_budget_s() + 1.0
            if self.diag_budget_s() < DIAG_LEVEL_BUDGET_S[self.epilog_diag_level] / 2:
                raise ConfigError("hooks.epilog_diag_budget_s", f"dcgmi diag -r "
                                  f"{self.epilog_diag_level} needs about "
                                  f"{DIAG_LEVEL_BUDGET_S[self.epilog_diag_level]:g} s")
        if epilog >= limit:
            what = " + diagnostic" if self.epilog_diag_on_failure else ""
            raise ConfigError("hooks.epilog_budget_s", f"epilog budget{what} "
                              f"+ 2 x slurm_timeout_s + lock_timeout_s = {epilog:g} s does not "
                              f"fit PrologEpilogTimeout ({limit:g} s, "
                              "hooks.prolog_epilog_timeout_s)")
        for name in ("state_dir", "events_file"):
            value = getattr(self, name)
            if not value.startswith("/"):
                raise ConfigError(f"hooks.{name}", "must be an absolute path")
        for name in ("metrics_file", "verdict_file", "memory_tier_dir"):
            value = getattr(self, name)
            if value and not value.startswith("/"):
                raise ConfigError(f"hooks.{name}", "must be an absolute path")

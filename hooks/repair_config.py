"""``[repair]``: the repair loop (docs/repair.md).

Node side (the health program): with ``enabled``, a drain of ours is lifted only after the
validation set passes (``validate_checks``, ``dcgmi diag -r validate_dcgm_level``, within
``validate_budget_s``), and a node asked to reset its GPUs does so when no process holds them.
Controller side (``resilient-slurm repair``): the escalation ladder (``ladder_file``, the
shipped ``hooks/repair_ladder.toml`` when empty), the history of remediations per node
(``ledger_file``, kept ``history_window_s``), the budgets (``max_at_once`` nodes rebooting or
being replaced at a time; at most max(``hourly_min``, ``hourly_fraction`` x nodes) started per
hour), and ``rma_command`` (argv; the evidence bundle's path is appended) for a node isolated
for a person.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from resilient_slurm.config_schema import ConfigError, check_finite, register_section

VALIDATE_CHECKS = ("dcgm_diag", "allreduce_bw", "loopback_bw")


@register_section("repair")
@dataclass
class RepairConfig:
    """``[repair]`` keys (see the module docstring)."""

    enabled: bool = False
    validate_checks: list[str] = field(default_factory=lambda: list(VALIDATE_CHECKS))
    validate_dcgm_level: int = 3
    validate_budget_s: float = 1800.0
    ladder_file: str = ""
    ledger_file: str = "/var/lib/resilient-slurm/repair/ledger.json"
    events_file: str = "/var/log/resilient-slurm/repair-events.jsonl"
    history_window_s: float = 30 * 86400.0
    max_at_once: int = 3
    hourly_fraction: float = 0.1
    hourly_min: int = 3
    rma_command: list[str] = field(default_factory=list)
    rma_timeout_s: float = 60.0

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "validate_dcgm_level": (1, 4), "validate_budget_s": (1, 86_400),
        "history_window_s": (3600, 366 * 86_400), "max_at_once": (1, 100_000),
        "hourly_fraction": (0, 1), "hourly_min": (0, 100_000), "rma_timeout_s": (1, 3600),
    }

    def validate(self) -> None:
        check_finite(self, "repair")
        from resilient_slurm.healthcheck.engine import CHECK_SETS  # every check declared

        known = CHECK_SETS["validate"]
        for name in self.validate_checks:
            if name not in known:
                raise ConfigError("repair.validate_checks", f"unknown validation check "
                                  f"{name!r} (known: {', '.join(known)})")
        for name in ("ledger_file", "events_file"):
            if not getattr(self, name).startswith("/"):
                raise ConfigError(f"repair.{name}", "must be an absolute path")
        if self.ladder_file and not self.ladder_file.startswith("/"):
            raise ConfigError("repair.ladder_file", "must be an absolute path")
        if self.rma_command and not str(self.rma_command[0]).startswith("/"):
            raise ConfigError("repair.rma_command", "the program must be an absolute path "
                              "(an argv list, never a shell string)")

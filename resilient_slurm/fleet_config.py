"""``[fleet]``: what ``resilient-slurm fleet`` reads and how it judges (``docs/observability.md``).

The node log is ``[hooks] events_file``; ``jobs_index`` is the file ``resilient-launch
--job-index`` appends one line to per start of a job (where its events are). A node drained
``repeat_drains`` times within ``repeat_window_s`` is a repeat offender. A fault of a job is
matched to the hooks' verdicts and drains of its node within ``match_window_s`` after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from resilient_slurm.config_schema import check_bounds, check_finite, register_section

DEFAULT_JOBS_INDEX = "/var/lib/resilient-slurm/jobs.jsonl"


@register_section("fleet")
@dataclass
class FleetConfig:
    """``[fleet]`` keys (see the module doc)."""

    jobs_index: str = DEFAULT_JOBS_INDEX
    repeat_drains: int = 3
    repeat_window_s: float = 7 * 86400.0
    match_window_s: float = 3600.0

    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "repeat_drains": (1, 1000), "repeat_window_s": (60, 366 * 86400),
        "match_window_s": (1, 7 * 86400)}

    def __post_init__(self) -> None:
        check_finite(self, "fleet")
        check_bounds(self, "fleet")

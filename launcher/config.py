"""``resilient-launch``'s command line as one frozen value: :class:`LaunchConfig`, one field
per click parameter of ``launcher/cli.py``'s ``main`` (same name, the type click gives it),
built by :meth:`LaunchConfig.from_params` from ``ctx.params`` by its fields. A new option is
a new field here; ``from_params`` refuses a parameter without a field and a field without a
parameter, so the two cannot drift apart.

What each part of the launcher reads is derived from it: the supervisor's settings
(:meth:`LaunchConfig.supervisor_settings`, the fields both share by name, plus what the
command line resolved: the checkpoint and state directories, the training nodes, the
verdicts' location) and the straggler thresholds (:meth:`LaunchConfig.straggler_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from resilient_slurm.launcher.recovery import straggler
from resilient_slurm.launcher.settings import SupervisorSettings


@dataclass(frozen=True)
class LaunchConfig:
    """The parsed command line (defaults and bounds are the click options')."""

    script: str
    args: tuple[str, ...]
    nproc_per_node: str
    module: bool
    min_nodes: int | None
    spares: int
    max_restarts: int
    max_requeues: int
    exclusion_ttl: float
    heartbeat_timeout: float | None
    heartbeat_floor: float
    initial_heartbeat_timeout: float | None
    term_timeout: float | None
    checkpoint_dir: str | None
    state_dir: str | None
    no_progress_limit: int
    max_strikes: int
    verdict_path: str | None
    metrics_dir: str
    job_index: str
    max_blame_share: float
    node_query_interval: float
    health_timeout: float
    verdict_wait: float
    on_straggler: str
    straggler_factor: float
    straggler_window: int
    checkpoint_marker: str | None
    ft_args: tuple[str, ...]
    srun_args: tuple[str, ...]
    ft_launcher: str
    inprocess: bool
    no_instrument: bool
    dry_run: bool

    @classmethod
    def from_params(cls, **params: Any) -> LaunchConfig:
        """The config of click's parsed parameters (``ctx.params``): each field from the
        parameter of its name. Raises ``TypeError`` naming a parameter without a field or a
        field without a parameter."""
        names = [f.name for f in fields(cls)]
        extra = sorted(set(params) - set(names))
        missing = [n for n in names if n not in params]
        if extra or missing:
            raise TypeError(f"LaunchConfig and the command's parameters differ: parameters "
                            f"without a field {extra}, fields without a parameter {missing}")
        return cls(**{n: params[n] for n in names})

    def straggler_settings(self) -> straggler.StragglerSettings:
        """The straggler thresholds (``--straggler-*``, ``--on-straggler``); the share of
        nodes a straggler verdict may blame is ``--max-blame-share`` when it is a proper
        fraction, else straggler's default."""
        share = self.max_blame_share if 0 < self.max_blame_share < 1 \
            else straggler.DEFAULT_MAX_SHARE
        return straggler.StragglerSettings(self.straggler_factor, self.straggler_window,
                                           share, self.on_straggler)

    def supervisor_settings(self, **resolved: Any) -> SupervisorSettings:
        """The supervisor's settings: each field this config has by the same name, then
        ``resolved`` (what the command line resolved against the job: ``checkpoint_dir``,
        ``state_dir``, ``min_nodes``, ``verdict_path``, ``spares``), and the straggler
        thresholds."""
        ours = {f.name for f in fields(self)}
        shared = {f.name: getattr(self, f.name) for f in fields(SupervisorSettings)
                  if f.name in ours}
        return SupervisorSettings(**{**shared, "straggler": self.straggler_settings(),
                                     **resolved})

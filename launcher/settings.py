"""The supervisor's settings: what ``resilient-launch``'s options set for the cycle loop
(``launcher/cli.py`` builds them; ``launcher/supervisor.py`` and the watch read them)."""

from __future__ import annotations

from dataclasses import dataclass

from resilient_slurm.launcher.recovery import exclusions, straggler


@dataclass
class SupervisorSettings:
    checkpoint_dir: str | None  # None: progress from step reports only
    state_dir: str
    min_nodes: int
    max_requeues: int = 3
    no_progress_limit: int = 3
    max_strikes: int = 2
    max_blame_share: float = 0.5
    verdict_path: str = ""  # published health verdicts, "{node}" per node
    verdict_max_age: float = 300.0
    health_timeout: float = 30.0
    verdict_wait: float = 45.0  # s a failed cycle that blamed nobody waits for new verdicts
    watch_interval: float = 1.0
    state_check_interval: float = 5.0  # node watch (file reads; Slurm only when asked for)
    node_query_interval: float = 60.0  # single-node queries when nothing else asks for them
    checkpoint_marker: str | None = None  # the user's own completion-marker file name
    max_restarts: int | None = None  # in-job restarts per cycle, counted for the whole job
    exclusion_ttl: float = exclusions.DEFAULT_TTL_S  # seconds; 0: exclusions never expire
    straggler: straggler.StragglerSettings | None = None  # None: no straggler verdicts
    lost_node_wait: float = 130.0  # s for Slurm to flag a node whose launcher vanished
    spares: int = 0  # --spares K: standby nodes of the allocation (launcher/recovery/spares.py)
    metrics_dir: str = ""  # --metrics-dir: the job's textfile for node_exporter (job_metrics.py)
    job_index: str = ""  # --job-index: where `resilient-slurm fleet` finds this job

"""Build the Grafana dashboard (prometheus/dashboard.json) with grafana-foundation-sdk.

    .venv/bin/python scripts/dashboard.py            # write prometheus/dashboard.json
    .venv/bin/python scripts/dashboard.py --check    # exit 1 when the file is not this output

Every panel's query is run against a real Prometheus fed by the hooks' and a job's textfiles
in tests/test_dashboard.py and must return data. The queries use the metrics and recording
rules of docs/observability.md (prometheus/rules.yml).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "prometheus",
                   "dashboard.json")


@dataclass(frozen=True)
class Panel:
    title: str
    expr: str
    legend: str
    unit: str
    kind: str  # timeseries, stat, bargauge
    description: str


PANELS = (
    Panel("Health run age per node", "resilient:health_staleness:seconds", "{{node}}", "s",
          "timeseries", "Seconds since each node's HealthCheckProgram last ran to its verdict; "
          "ResilientHealthCheckStale fires past three intervals."),
    Panel("Health interval per node", "resilient:health_interval:seconds", "{{node}}", "s",
          "stat", "slurm.conf's HealthCheckInterval as each node's health program read it."),
    Panel("Nodes drained by the hooks, by cause", "resilient:nodes_drained:count",
          "{{cause}}", "none", "timeseries", "Nodes a drain of ours stands on, per cause."),
    Panel("Drained share per cause", "resilient:drained_share:ratio", "{{cause}}",
          "percentunit", "timeseries", "Compare with the fleet guard's share "
          "(hooks.max_drain_fraction)."),
    Panel("Drains per node in 7 days", "resilient:node_drains_7d:count", "{{node}}", "none",
          "bargauge", "ResilientNodeRepeatOffender fires at 3."),
    Panel("Fleet goodput", "resilient:fleet_goodput:ratio", "fleet", "percentunit", "stat",
          "Productive seconds over wall seconds, all jobs with metrics."),
    Panel("Goodput per job", "resilient:job_goodput:ratio", "job {{slurm_job}}",
          "percentunit", "timeseries", "ResilientJobGoodputLow fires under 50%."),
    Panel("Badput share by cause", "resilient:badput_share:ratio", "{{cause}}",
          "percentunit", "bargauge", "Lost wall time by cause over all jobs' wall time."),
    Panel("Lost GPU-hours per node", "resilient:node_lost_gpu_hours:sum", "{{node}}", "h",
          "bargauge", "GPU-hours of training the faults on each node cost the jobs."),
    Panel("Faults by class", "sum by (fault_class) (resilient_job_faults_total)",
          "{{fault_class}}", "none", "bargauge", "Faults the jobs saw, by class."),
    Panel("Recovery time (median) by fault class", "resilient:recovery_seconds:p50",
          "{{fault_class}}", "s", "bargauge", "Fault to training again, median over the "
          "recovered faults."),
)


def build() -> dict[str, object]:
    from grafana_foundation_sdk.builders import bargauge, prometheus, stat, timeseries
    from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    kinds: dict[str, type[timeseries.Panel | stat.Panel | bargauge.Panel]] = {
        "timeseries": timeseries.Panel, "stat": stat.Panel, "bargauge": bargauge.Panel}
    source = DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (Dashboard("resilient-slurm: fleet health and goodput").uid("resilient-slurm")
             .tags(["resilient-slurm", "slurm", "goodput"]).refresh("30s").time("now-24h", "now")
             .with_variable(DatasourceVariable("datasource").label("Prometheus")
                            .type("prometheus")))
    for p in PANELS:
        panel = (kinds[p.kind]().title(p.title).description(p.description).unit(p.unit)
                 .datasource(source).height(8).span(12)
                 .with_target(prometheus.Dataquery().expr(p.expr).legend_format(p.legend)
                              .ref_id("A")))
        board = board.with_panel(panel)
    encoded: dict[str, object] = json.loads(JSONEncoder(sort_keys=True, indent=1).encode(
        board.build()))
    return encoded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when prometheus/dashboard.json differs from the build")
    args = parser.parse_args(argv)
    text = json.dumps(build(), indent=1, sort_keys=True) + "\n"
    if args.check:
        with open(OUT, encoding="utf-8") as fh:
            if fh.read() != text:
                print(f"{OUT} is stale: run scripts/dashboard.py", file=sys.stderr)
                return 1
        return 0
    with open(OUT, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"wrote {os.path.normpath(OUT)}: {len(PANELS)} panels")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``sandbox up --metrics``: Debian's Prometheus and node_exporter beside the sandbox.

One ``prometheus-node-exporter`` (textfile collector only) per simulated node over its node
directory, where that node's hooks write ``metrics.prom`` (and ``.prolog``, ``.epilog``,
``.watch``), and one over the jobs' directory ``DIR/metrics/jobs`` (owned by the job user; the
batch host's textfile directory, where ``resilient-launch --metrics-dir`` writes); a
``prometheus`` scraping them every ``scrape_s`` and evaluating ``prometheus/rules.yml``. The
jobs index (``resilient-launch --job-index``, ``[fleet] jobs_index`` of the sandbox's config)
is ``DIR/metrics/jobs/index.jsonl``. ``sandbox env`` exports both for jobs
(``jobuser.job_env``); ``down`` stops the stack.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from resilient_slurm_lab.sandbox import prom
from resilient_slurm_lab.sandbox.cluster import Paths, read_meta, write_meta
from resilient_slurm_lab.sandbox.jobuser import (
    JobUser,
    jobs_index,
    jobs_metrics_dir,
    make_user_dir,
)


def prom_root(paths: Paths) -> str:
    return paths.p("prometheus")


def start(paths: Paths, nodes: Sequence[str], user: JobUser, scrape_s: float = 2.0
          ) -> prom.Stack:
    """Start the stack (see the module doc); recorded in the sandbox's meta."""
    folder = jobs_metrics_dir(paths)
    os.makedirs(paths.p("metrics"), mode=0o755, exist_ok=True)
    make_user_dir(folder, user, mode=0o755)
    index = jobs_index(paths)
    if not os.path.exists(index):
        with open(index, "a", encoding="utf-8"):
            pass
        os.chown(index, user.uid, user.gid)
        os.chmod(index, 0o644)
    targets = {n: paths.node_dir(n) for n in nodes}
    targets["jobs"] = folder
    stack = prom.start(prom_root(paths), targets, scrape_s=scrape_s)
    meta = read_meta(paths)
    meta["metrics"] = {**stack.to_json(), "url": stack.url}
    write_meta(paths, meta)
    return stack


def stop(paths: Paths) -> None:
    """Stop the stack this sandbox started, if any (``down`` calls it)."""
    stack = prom.load(prom_root(paths))
    if stack is not None:
        prom.stop(stack)
        os.unlink(os.path.join(prom_root(paths), "stack.json"))


def running(paths: Paths) -> prom.Stack | None:
    return prom.load(prom_root(paths))

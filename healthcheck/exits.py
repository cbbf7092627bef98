"""Exit statuses of ``resilient-health check``, defined once, and how a table is rendered.

``CHECK_EXITS``: ``resilient-health check``, which only reports. The statuses of a verdict
come from :data:`resilient_slurm.healthcheck.model.EXIT_CODES`; the hook programs' table,
built on them, is ``hooks/exits.py``'s ``HOOK_EXITS``. Each command's ``--help`` is rendered
from its table (:func:`render`), and tests/test_docs_tables.py checks the docs' tables
(healthcheck/README.md; docs/hooks.md and README.md for the hooks') against them.
"""

from __future__ import annotations

from resilient_slurm.healthcheck.model import EXIT_CODES, FAIL, OK, UNKNOWN

EXIT_HEALTHY = EXIT_CODES[OK]  # 0 (warn too)
EXIT_UNHEALTHY = EXIT_CODES[FAIL]  # 1
EXIT_USAGE = 2
EXIT_UNKNOWN = EXIT_CODES[UNKNOWN]  # 3

ExitTable = tuple[tuple[int, str], ...]

CHECK_EXITS: ExitTable = (
    (EXIT_HEALTHY, "healthy (warnings allowed)"),
    (EXIT_UNHEALTHY, "unhealthy (a check failed)"),
    (EXIT_USAGE, "usage or configuration error; the message names the key "
     "(`config key 'health.watchdog_s': ...`)"),
    (EXIT_UNKNOWN, "unknown (a check could not tell: tool missing, hung, unparseable; hooks "
     "treat it as unhealthy)"),
)


def render(table: ExitTable, title: str = "Exit codes", width: int = 88) -> str:
    """``title:`` and one entry per status, wrapped to ``width``, for a --help epilog."""
    import textwrap

    lines = [f"{title}:"]
    for code, meaning in table:
        lines += textwrap.wrap(meaning.replace("`", ""), width, initial_indent=f"  {code}  ",
                               subsequent_indent="     ")
    return "\n".join(lines)

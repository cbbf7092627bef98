"""Exit statuses of the hook programs and of ``resilient-health check``, defined once.

``HOOK_EXITS``: the prolog, the epilog and the HealthCheckProgram (bare ``resilient-health``).
``CHECK_EXITS``: ``resilient-health check``, which only reports. The statuses of a verdict
come from :data:`resilient_slurm.healthcheck.model.EXIT_CODES`. Each command's ``--help`` is
rendered from its table (:func:`render`), and tests/test_docs_tables.py checks the docs' tables
(docs/hooks.md, healthcheck/README.md, README.md) against them.
"""

from __future__ import annotations

from resilient_slurm.healthcheck.model import EXIT_CODES, FAIL, OK, UNKNOWN

EXIT_HEALTHY = EXIT_CODES[OK]  # 0 (warn too)
EXIT_UNHEALTHY = EXIT_CODES[FAIL]  # 1
EXIT_USAGE = 2
EXIT_UNKNOWN = EXIT_CODES[UNKNOWN]  # 3
EXIT_HOOK_ERROR = 4

ExitTable = tuple[tuple[int, str], ...]

HOOK_EXITS: ExitTable = (
    (EXIT_HEALTHY, "healthy (warnings allowed); also a health run that yielded to a starting "
     "job or to another health run, and an unhealthy node the fleet guard kept up (the shared "
     "cause is logged)"),
    (EXIT_UNHEALTHY, "unhealthy: drained, or the drain was tried and Slurm did not answer"),
    (EXIT_USAGE, "config or usage error (the message names the key or file)"),
    (EXIT_UNKNOWN, "a check could not tell (`unknown`): treated as unhealthy, drained"),
    (EXIT_HOOK_ERROR, "the hook could not run: its state directory was refused, or the health "
     "program's last-resort alarm fired"),
)

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

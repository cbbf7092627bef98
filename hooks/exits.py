"""Exit statuses of the hook programs, defined once.

``HOOK_EXITS``: the prolog, the epilog and the HealthCheckProgram (bare ``resilient-health``),
built on the statuses of a health verdict (``healthcheck/exits.py``, which also holds
``resilient-health check``'s ``CHECK_EXITS``) plus :data:`EXIT_HOOK_ERROR`. Each hook's
``--help`` is rendered from it, and tests/test_docs_tables.py checks the tables of docs/hooks.md
and README.md against it.
"""

from __future__ import annotations

from resilient_slurm.healthcheck.exits import (
    EXIT_HEALTHY,
    EXIT_UNHEALTHY,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    ExitTable,
)

EXIT_HOOK_ERROR = 4  # the hook could not run (hooks/shim.py's EXIT_BROKEN too)

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


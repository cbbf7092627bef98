"""The statuses of a health result and of a node's verdict, worst last: ``ok < warn < unknown <
fail``. ``unknown`` means a check could not tell; every hook treats it as failing. Shared by the
health checks (``healthcheck/model.py``), the hooks and the launcher's reader of the verdicts
the hooks publish (``launcher/recovery/published.py``, ``launcher/recovery/blame.py``)."""

from __future__ import annotations

OK = "ok"
WARN = "warn"
UNKNOWN = "unknown"
FAIL = "fail"
STATUSES = (OK, WARN, UNKNOWN, FAIL)

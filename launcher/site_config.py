"""What ``resilient-launch`` takes from the site's configuration: where the hooks publish
their verdicts (``[hooks] verdict_file``), so that a job finds them without being told.

The file is the hooks' (``/etc/resilient-slurm/config.toml``, 0644, or
``$RESILIENT_SLURM_CONFIG``); ``resilient_slurm.verdict_file.site_location`` reads its one key.
"""

from __future__ import annotations

from collections.abc import Mapping

import click

from resilient_slurm import verdict_file


def verdict_location(given: str | None, from_env: bool, env: Mapping[str, str]) -> str:
    """The verdict pattern the launcher reads: ``given`` (``--verdict-path``, or
    ``$RESILIENT_VERDICT_PATH`` when ``from_env``), else the site's ``[hooks] verdict_file``
    (precedence: ``verdict_file.site_location``). Says in the job's log which, and why the
    site's config could not be read when it could not. Raises ``ConfigError`` (exit 2) for a
    config file that is named but unreadable, or broken."""
    if given is not None:
        found = verdict_file.Location(given, "$RESILIENT_VERDICT_PATH" if from_env
                                      else "--verdict-path")
    else:
        found = verdict_file.site_location(env)
    if found.warning:
        click.echo(f"resilient-launch: warning: health verdicts: {found.warning}", err=True)
    click.echo(f"resilient-launch: health verdicts: {found.pattern or '- (none published)'} "
               f"({found.source})", err=True)
    return found.pattern

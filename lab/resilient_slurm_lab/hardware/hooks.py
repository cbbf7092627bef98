"""The sandbox's hooks: the product's prolog, epilog, HealthCheckProgram and node watcher, each
run on the sandbox node's simulated hardware (:class:`.plugin.ScenarioHardware` with no
scenario: ``<node_dir>/scenario.toml``, root-owned when run as root).

The sandbox installs its shims with :data:`SHIMS` in place of the product's
(``resilient_slurm.hooks.install``); a production node's shims run the product's entry points,
which never import the lab.
"""

from __future__ import annotations

from collections.abc import Sequence

from .plugin import ScenarioHardware

NODE = ScenarioHardware(root_owned=True)

SHIMS = {
    "prolog": (__name__, "prolog_main"),
    "epilog": (__name__, "epilog_main"),
    "healthcheck": (__name__, "health_main"),
    "watch": (__name__, "watch_main"),
}


def prolog_main(argv: Sequence[str] | None = None) -> int:
    from resilient_slurm.prolog.hook import prolog_main as product

    return product(argv, hardware=NODE)


def epilog_main(argv: Sequence[str] | None = None) -> int:
    from resilient_slurm.epilog.hook import epilog_main as product

    return product(argv, hardware=NODE)


def health_main(argv: Sequence[str] | None = None) -> int:
    from resilient_slurm.hooks.health import health_main as product

    return product(argv, hardware=NODE)


def watch_main(argv: Sequence[str] | None = None) -> int:
    from resilient_slurm.hooks.watch import watch_main as product

    return product(argv, hardware=NODE)

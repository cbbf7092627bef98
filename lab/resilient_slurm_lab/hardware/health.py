"""``python -m resilient_slurm_lab.hardware.health [--scenario S] [--nvml-hang CALL] ARGS``:
``resilient-health ARGS`` on simulated hardware.

``--scenario S``: a scenario (shipped name, path, ``{node}`` in a path), else the sandbox
node's (``<node_dir>/scenario.toml``, root-owned when run as root: the sandbox's
``clear-hold --recheck`` and ``validate``). ``--nvml-hang CALL``: that NVML call never returns
(after the calls before it), on the scenario's hardware with ``--scenario``, else on this
machine's (the GPU proof: a wedged driver over a real one). Options go before ARGS.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from resilient_slurm.healthcheck.seams import REAL, Hardware

from .plugin import NvmlHang, ScenarioHardware

USAGE = "usage: python -m resilient_slurm_lab.hardware.health [--scenario S] [--nvml-hang CALL] " \
        "RESILIENT-HEALTH-ARGS"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    scenario: str | None = None
    hang: str | None = None
    while args and args[0] in ("--scenario", "--nvml-hang"):
        if len(args) < 2:
            print(f"{USAGE}\n{args[0]} needs a value", file=sys.stderr)
            return 2
        if args[0] == "--scenario":
            scenario = args[1]
        else:
            hang = args[1]
        args = args[2:]
    hardware: Hardware = ScenarioHardware(scenario, root_owned=scenario is None)
    if hang is not None:
        try:
            hardware = NvmlHang(hang, hardware if scenario else REAL)
        except ValueError as exc:
            print(f"{USAGE}\n--nvml-hang: {exc}", file=sys.stderr)
            return 2
    from resilient_slurm.hooks.health_cli import main as resilient_health

    resilient_health.main(args=args, prog_name="resilient-health", obj=hardware)
    return 0  # not reached: click exits with the command's status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

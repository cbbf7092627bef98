"""Recorded ft_launcher output per NVRx release (``nvrx_output/<version>/``), read as events."""

from __future__ import annotations

from pathlib import Path

from resilient_slurm.launcher.shim import observe

DATA = Path(__file__).parent / "nvrx_output"
VERSIONS = sorted(p.name for p in DATA.iterdir() if (p / "restart.log").is_file())


def events_of(version: str, node: str = "node1") -> list[dict[str, object]]:
    """The events the watch loop's parser reads from one release's recorded run."""
    out = []
    for i, line in enumerate((DATA / version / "restart.log").read_text().splitlines()):
        seen = observe.parse_line(line)
        if seen is not None:
            out.append({"kind": seen[0], "ts": float(i), "node": node, **seen[1]})
    return out

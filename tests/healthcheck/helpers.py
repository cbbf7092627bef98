"""Helpers shared by the health-check tests (configs, scenario files)."""

from __future__ import annotations

import os
from typing import Any

from resilient_slurm.config import Config, load_config


def make_config(tmp: str, text: str = "", **health: Any) -> Config:
    """A config whose state dir is under ``tmp``; ``text`` is extra TOML for ``[health]``."""
    path = os.path.join(tmp, "config.toml")
    with open(path, "w") as fh:
        fh.write("[health]\n")
        fh.write(f'state_dir = "{os.path.join(tmp, "state")}"\n')
        fh.write(text)
    return load_config(path, env={}, overrides={"health": health} if health else None)


def write_scenario(directory: str, name: str, body: str, base: str = "healthy-p5") -> str:
    """A scenario file ``<directory>/<name>.toml`` = ``base`` + ``body`` (TOML text)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.toml")
    with open(path, "w") as fh:
        fh.write(f'base = "{base}"\n{body}\n' if base else body)
    return path


def by_check(report: Any, check: str) -> list[Any]:
    return [r for r in report.results if r.check == check]

"""Helpers of the sandbox tests: Slurm commands against one sandbox, parsed."""

from __future__ import annotations

import os
import subprocess

from resilient_slurm_lab.sandbox.cluster import Paths


def env_of(paths: Paths) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": paths.conf}


def show_job(paths: Paths, job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env_of(paths),
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def show_config(paths: Paths) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "config"], env=env_of(paths), capture_output=True,
                         text=True, timeout=30, check=True).stdout
    conf = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    return conf

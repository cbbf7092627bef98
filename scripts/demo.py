"""Placeholder demo until the resilience demo lands: a 4-node sandbox runs one 4-node job."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from resilient_slurm.sandbox import lifecycle


def main() -> int:
    root = tempfile.mkdtemp(prefix="rs-demo-")
    print(f"demo: starting a 4-node Slurm sandbox in {root}")
    paths = lifecycle.up(root, nodes=4)
    try:
        env = {**os.environ, "SLURM_CONF": paths.conf}
        subprocess.run(["sinfo"], env=env, check=True)
        out = subprocess.run(["srun", "-N4", "-l", "printenv", "SLURMD_NODENAME"], env=env,
                             check=True, capture_output=True, text=True).stdout
        print("demo: a 4-node job ran on:\n" + out)
    finally:
        lifecycle.down(root)
        print("demo: sandbox down")
    return 0


if __name__ == "__main__":
    sys.exit(main())

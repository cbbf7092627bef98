"""``python -m resilient_slurm.launcher.recovery.published PATTERN``: print this node's published
verdict file as one JSON line (read on the node by ``srun --overlap`` where the file is not on
shared storage; ``launcher/recovery/evidence.py``); it only reads. The file's format, default path
and parser: ``resilient_slurm.verdict_file``, the contract the hooks write by. A file it cannot
read is exit 1 with ``{"unreadable": "PATH: why"}`` on stdout (what the launcher records) and
the same on stderr.
"""

from __future__ import annotations

import json
import os
import sys

from resilient_slurm.verdict_file import MAX_BYTES, path_for


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m resilient_slurm.launcher.recovery.published PATTERN",
              file=sys.stderr)
        return 2
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    path = path_for(args[0], node)
    try:
        with open(path, "rb") as fh:
            sys.stdout.write(fh.read(MAX_BYTES).decode("utf-8", "replace").strip() + "\n")
    except OSError as exc:
        why = f"{path}: {exc.strerror or exc}"
        print(json.dumps({"unreadable": why}))
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m resilient_slurm.cli``: the ``resilient-slurm`` command."""

import sys

from resilient_slurm.cli import main

sys.exit(main())

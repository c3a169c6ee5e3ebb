"""Run a sweep declared beside a config, locally, on Slurm or through XManager:

    python launch/sweep.py --config=configs/grpo.py:tiny --sweep=batch_invariance \
        --workdir=runs/bi --launcher=local|slurm|xm [--parallel=N] [--dry_run] [--only=REGEX]

The flags and the launchers live in rlscale/sweep/ (cli.py); also `python -m rlscale.sweep`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlscale.sweep import cli  # noqa: E402  (after the checkout is on the path)

if __name__ == "__main__":
  cli.main()

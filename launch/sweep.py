"""Run a sweep declared beside a config, locally, on Slurm or through XManager:

    python launch/sweep.py --config=configs/grpo.py:tiny --sweep=batch_invariance \
        --workdir=runs/bi --launcher=local|slurm|xm [--parallel=N] [--dry_run] [--only=REGEX]

The flags and the launchers live in rlscale/sweep/ (cli.py); also `python -m rlscale.sweep`.
"""

from rlscale.sweep import cli

if __name__ == "__main__":
  cli.main()

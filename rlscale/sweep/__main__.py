"""`python -m rlscale.sweep`: the same as launch/sweep.py."""

from rlscale.sweep import cli

if __name__ == "__main__":
  cli.main()

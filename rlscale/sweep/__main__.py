"""`python -m rlscale.sweep`: the same as launch/sweep.py."""

from rlscale.sweep import cli

cli.main()

"""The entry point: python launch/main.py --config=configs/grpo.py [--workdir=DIR] [--config.x=y].

The flags and the run live in rlscale/run/main.py, shared with the installed `rlscale` command.
"""

from rlscale.run import main

if __name__ == "__main__":
  main.run()

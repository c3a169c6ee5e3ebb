"""The entry point: python launch/main.py --config=configs/grpo.py [--workdir=DIR] [--config.x=y].

The flags and the run live in rlscale/main.py, shared with the installed `rlscale` command.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlscale import main  # noqa: E402  (after the checkout is on the path)

if __name__ == "__main__":
  main.run()

"""Run a study (sweeps in order, a later one using an earlier one's choice), then its report:

    python launch/study.py --study=configs/studies/cpu.py --workdir=runs/study [--parallel=2]

The stages are declared in the study file; the runner is rlscale/sweep/study.py.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlscale.sweep import study_cli  # noqa: E402  (after the checkout is on the path)

if __name__ == "__main__":
  study_cli.main()

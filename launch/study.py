"""Run a study (sweeps in order, a later one using an earlier one's choice), then its report:

    python launch/study.py --study=configs/studies/cpu.py --workdir=runs/study [--parallel=2]

The stages are declared in the study file; the runner is rlscale/study/study.py.
"""

from rlscale.study import cli as study_cli

if __name__ == "__main__":
  study_cli.main()

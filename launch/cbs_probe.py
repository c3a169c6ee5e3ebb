"""Probe a run's critical batch by branching it, then report (rlscale/study/probe_cli.py):

    python launch/cbs_probe.py RUN_DIR --at=10,20,30 --batches=8,16,32,64 --seeds=3 \\
        [--responses=N] [--rates=3] [--optimizer=fresh] [--lr_scaling=sqrt] \\
        [--launcher=local --parallel=2] [--dry_run]
"""

from rlscale.study import probe_cli

if __name__ == "__main__":
  probe_cli.main()

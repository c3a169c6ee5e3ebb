"""Studies (study.py: stages of sweeps run in order, each stage's choice passed to the later
ones; lr_fit.py, the joint fit of E(B, lr); power.py, the verdict's seeds) and the
critical-batch probe (probe.py: branches of a run at several batches); their commands
(cli.py: launch/study.py, probe_cli.py: launch/cbs_probe.py) share cli_kit.py."""

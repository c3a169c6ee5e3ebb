"""Sweeps: points declared beside the config (axes.py, points.py), a manifest of where each
stands (manifest.py), and the launchers that run them (launchers/: local, Slurm, XManager);
cli.py is `launch/sweep.py`."""

"""Sweeps: points declared beside the config (axes.py, points.py), a manifest of where each
stands (manifest.py), and launchers that run them: local.py, slurm.py, xm.py; cli.py is
`launch/sweep.py`."""

"""Experiment configs: one file per experiment, get_config(arg) (shipped as rlscale.configs)."""

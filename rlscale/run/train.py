"""Run an experiment config: SFT of a base policy, or RL (any registered algorithm) from one."""

from __future__ import annotations

import os

import jax
import ml_collections
from absl import logging

from rlscale.resolve import experiment
from rlscale.run import workdir_lock
from rlscale.resolve.validate import validate


def default_workdir(cfg: ml_collections.ConfigDict, config_file: str | None) -> str:
  name = os.path.splitext(os.path.basename(config_file or cfg.kind))[0]
  return os.path.join("runs", f"{name}-{experiment.config_hash(cfg)}")


def main(cfg: ml_collections.ConfigDict, workdir: str | None = None,
         config_file: str | None = None, allow_config_change: tuple[str, ...] = (),
         base_policy_only: bool = False) -> dict:
  """Run `cfg` in `workdir`, resuming its checkpoints; `allow_config_change` lists the fields
  a resumed run may change (e.g. train.num_steps to extend it). With `base_policy_only`, only
  build (or find) the policy the run starts from: {"base_policy": its folder}."""
  workdir = workdir or default_workdir(cfg, config_file)
  validate(cfg, config_file=config_file, workdir=workdir)  # every field, before any compute
  if base_policy_only:
    if cfg.kind == "sft":
      return {}
    from rlscale.run import base_policy
    return {"base_policy": base_policy.resolve(cfg, config_file)}
  experiment.check_resume(workdir, cfg, allow_config_change)
  logging.info("workdir %s", os.path.abspath(workdir))
  with workdir_lock.held(workdir, jax.process_index() == 0):  # one run at a time in it
    if cfg.kind == "sft":
      from rlscale.trainer import sft_trainer as sft
      return sft.run(cfg, workdir)
    from rlscale.trainer import rl_trainer as rl_loop  # every algorithm of rlscale/rl/algorithm.py
    return rl_loop.run(cfg, workdir, config_file)

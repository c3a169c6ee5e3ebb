"""Run an experiment config: SFT of a base policy, or RL (any registered algorithm) from one.

The order is fixed: resolve the config once (every field checked; meshes, task, model config,
batch plan and an SFT base's recipe built; a run directory holding another config's
checkpoints refused: rlscale/resolve/resolved.py), take the directory's lock, find or build the
base policy (RL), and only then construct the trainer, which receives all of it.
"""

from __future__ import annotations

import os

import jax
import ml_collections
from absl import logging

from rlscale.resolve import experiment, resolved
from rlscale.run import base_policy, compile_cache, workdir_lock
from rlscale.trainer import rl_trainer, sft_trainer


def default_workdir(cfg: ml_collections.ConfigDict, config_file: str | None) -> str:
  name = os.path.splitext(os.path.basename(config_file or cfg.kind))[0]
  return os.path.join("runs", f"{name}-{experiment.config_hash(cfg)}")


def main(cfg: ml_collections.ConfigDict, workdir: str | None = None,
         config_file: str | None = None, allow_config_change: tuple[str, ...] = (),
         base_policy_only: bool = False) -> dict:
  """Run `cfg` in `workdir`, resuming its checkpoints; `allow_config_change` lists the fields
  a resumed run may change (e.g. train.num_steps to extend it). With `base_policy_only`, only
  build (or find) the policy the run starts from: {"base_policy": its folder}."""
  if workdir is None:  # an empty one given is an error of the resolve step
    workdir = default_workdir(cfg, config_file)
  # Before anything compiles: the points of a sweep share their compiled programs.
  compile_cache.enable(cfg.init.cache_dir if "init" in cfg else "runs/base")
  # Every field checked; meshes, task, model config, the plan (and an SFT base's recipe) built.
  # A run directory holding another config's checkpoints is refused here too.
  run = resolved.resolve(cfg, workdir, config_file, allow_config_change=allow_config_change)
  if base_policy_only:
    return {} if run.kind == "sft" else {"base_policy": base_policy.find_or_build(run)}
  logging.info("workdir %s", os.path.abspath(workdir))
  with workdir_lock.held(workdir, jax.process_index() == 0):  # one run at a time in it
    if run.kind == "sft":
      return sft_trainer.run(run)
    run = run.with_base(base_policy.find_or_build(run))
    return rl_trainer.run(run)  # every algorithm of rlscale/rl/algorithm.py

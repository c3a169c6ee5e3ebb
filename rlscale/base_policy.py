"""The policy an RL run starts from: a Hugging Face folder, or the SFT base built and cached."""

from __future__ import annotations

import os

import ml_collections
from absl import logging

from rlscale import config_files, experiment


def resolve(cfg: ml_collections.ConfigDict, config_file: str | None) -> str:
  """A Hugging Face folder with the base policy: init.hf_checkpoint, else model.hf_checkpoint,
  else the SFT base built from init.sft_config.

  The SFT recipe runs with this config's model, task, mesh and seed; its result is cached under
  init.cache_dir by the recipe's hash and reused by every later run.
  """
  if cfg.init.hf_checkpoint:
    return cfg.init.hf_checkpoint
  if cfg.model.hf_checkpoint:  # a real checkpoint is its own base
    return cfg.model.hf_checkpoint
  from rlscale import sft
  from rlscale.config_validation import validate
  sft_cfg = config_files.load(cfg.init.sft_config, config_file)
  with sft_cfg.unlocked():
    sft_cfg.model, sft_cfg.task, sft_cfg.mesh = cfg.model, cfg.task, cfg.mesh
    sft_cfg.seed = cfg.seed
  folder = os.path.join(cfg.init.cache_dir, f"sft-{experiment.config_hash(sft_cfg, ('mesh',))}")
  policy = os.path.join(folder, "policy")
  if os.path.exists(os.path.join(policy, sft.DONE)):
    logging.info("base policy: reusing %s", policy)
    return policy
  logging.info("base policy: building it with %s (%d SFT steps) into %s; later runs reuse it",
               cfg.init.sft_config, sft_cfg.train.num_steps, folder)
  validate(sft_cfg)
  sft.run(sft_cfg, folder)
  return policy

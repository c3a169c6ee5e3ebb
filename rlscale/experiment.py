"""What every run builds first: mesh, task, model config, run directory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from rlscale import models, sharding, tasks
from rlscale.checkpoints.hf import config_from_folder
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.metrics_writer import write_json


@dataclasses.dataclass
class Setup:
  mesh: Mesh
  rules: dict
  task: tasks.Task
  model_cfg: models.ModelConfig


def model_config(cfg: ml_collections.ConfigDict) -> models.ModelConfig:
  m = cfg.model.to_dict()
  if m.get("hf_checkpoint"):
    return config_from_folder(m["hf_checkpoint"], dtype=m["dtype"], param_dtype=m["param_dtype"])
  m.pop("hf_checkpoint", None)
  return models.from_config_dict(m)


def setup(cfg: ml_collections.ConfigDict) -> Setup:
  mesh = sharding.make_mesh(cfg.mesh.shape)
  rules = sharding.rules_from_config(cfg.mesh.rules)
  tokenizer = HFTokenizer(cfg.model.hf_checkpoint) if cfg.model.hf_checkpoint else None
  task = tasks.make(cfg.task, tokenizer)
  model_cfg = model_config(cfg)
  if model_cfg.vocab_size < task.tokenizer.vocab_size:
    raise ValueError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
                     f"vocabulary ({task.tokenizer.vocab_size})")
  logging.info("mesh %s over %d devices (%d processes); model %s, %.2fM parameters",
               dict(mesh.shape), jax.device_count(), jax.process_count(), model_cfg.family,
               model_cfg.num_params() / 1e6)
  return Setup(mesh, rules, task, model_cfg)


def config_hash(cfg: ml_collections.ConfigDict, drop: tuple[str, ...] = ()) -> str:
  """A short stable hash of the config's content (sections in `drop` left out)."""
  d = {k: v for k, v in cfg.to_dict().items() if k not in drop}
  blob = json.dumps(d, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:12]


def prepare_workdir(workdir: str, cfg: ml_collections.ConfigDict) -> None:
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  write_json(path, json.loads(cfg.to_json_best_effort()))

"""What every run builds first: mesh, task, model config, run directory."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from rlscale import models, tasks
from rlscale.parallel import roles
from rlscale.parallel import sharding
from rlscale.checkpoints.hf import config_from_folder
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.config import defaults
from rlscale.metrics.writer import write_json


@dataclasses.dataclass
class Setup:
  mesh: Mesh
  rules: dict
  task: tasks.Task
  model_cfg: models.ModelConfig
  sampler_mesh: Mesh | None = None  # mesh.roles='split': the sampler's; None: `mesh` samples

  @property
  def meshes(self) -> roles.Meshes:
    return roles.Meshes(self.mesh, self.sampler_mesh or self.mesh)


def model_config(cfg: ml_collections.ConfigDict) -> models.ModelConfig:
  m = cfg.model.to_dict()
  if m.get("hf_checkpoint"):
    return config_from_folder(m["hf_checkpoint"], dtype=m["dtype"], param_dtype=m["param_dtype"])
  m.pop("hf_checkpoint", None)
  return models.from_config_dict(m)


def setup(cfg: ml_collections.ConfigDict) -> Setup:
  meshes = roles.make_meshes(cfg.mesh)
  rules = sharding.rules_from_config(cfg.mesh.rules)
  tokenizer = HFTokenizer(cfg.model.hf_checkpoint) if cfg.model.hf_checkpoint else None
  task = tasks.make(cfg.task, tokenizer)
  model_cfg = model_config(cfg)
  if model_cfg.vocab_size < task.tokenizer.vocab_size:
    raise ValueError(f"model.vocab_size={model_cfg.vocab_size} is smaller than the tokenizer's "
                     f"vocabulary ({task.tokenizer.vocab_size})")
  logging.info("mesh %s over %d devices (%d processes); model %s, %.2fM parameters",
               dict(meshes.trainer.shape), jax.device_count(), jax.process_count(),
               model_cfg.family, model_cfg.num_params() / 1e6)
  if meshes.split:
    logging.info("roles split: the trainer's mesh %s on %d devices, the sampler's %s on %d",
                 dict(meshes.trainer.shape), meshes.trainer.size, dict(meshes.sampler.shape),
                 meshes.sampler.size)
  return Setup(meshes.trainer, rules, task, model_cfg,
               meshes.sampler if meshes.split else None)


def config_hash(cfg: ml_collections.ConfigDict, drop: tuple[str, ...] = ()) -> str:
  """A short stable hash of the config's content (sections in `drop` left out)."""
  d = {k: v for k, v in cfg.to_dict().items() if k not in drop}
  blob = json.dumps(d, sort_keys=True, default=str)
  return hashlib.sha256(blob.encode()).hexdigest()[:12]


# Fields a resumed run may change without asking: they change no number the run computes.
FREE_TO_CHANGE = ("train.log_every", "train.tensorboard", "train.async_checkpoint")
def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def _has_checkpoint(workdir: str) -> bool:
  folder = os.path.join(workdir, "checkpoints")
  return os.path.isdir(folder) and any(n.isdigit() for n in os.listdir(folder))


def check_resume(workdir: str, cfg: ml_collections.ConfigDict,
                 allow: tuple[str, ...] = ()) -> None:
  """Refuse to resume a run directory's checkpoints with another config.

  The config of a run with checkpoints is config.json; a field that differs (but those in
  FREE_TO_CHANGE and `allow`, e.g. train.num_steps to extend a run) is a ConfigError naming
  each field with its old and new value. Reads two small files; runs before any compute.
  """
  path = os.path.join(workdir, "config.json")
  if not (os.path.exists(path) and _has_checkpoint(workdir)):
    return
  with open(path) as f:
    old = _flat(json.load(f))
  old = defaults.fill_dict(old)  # a field added since: the value the old run used
  new = _flat(json.loads(cfg.to_json_best_effort()))
  changed = [f"{k}: {old.get(k, '(absent)')!r} -> {new.get(k, '(absent)')!r}"
             for k in sorted(set(old) | set(new))
             if old.get(k) != new.get(k) and k not in FREE_TO_CHANGE + tuple(allow)]
  if changed:
    from rlscale.config.errors import ConfigError
    raise ConfigError(f"{workdir} holds checkpoints of a run with another config: "
                      f"{'; '.join(changed)}. Resume with the same config, use another --workdir, "
                      f"or allow the change with --allow_config_change="
                      f"{','.join(c.split(':')[0] for c in changed)}")


def prepare_workdir(workdir: str, cfg: ml_collections.ConfigDict) -> None:
  """config.json (the run's config) and config_history.jsonl (every config it started with)."""
  os.makedirs(workdir, exist_ok=True)
  config = json.loads(cfg.to_json_best_effort())
  write_json(os.path.join(workdir, "config.json"), config)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config_history.jsonl"), "a") as f:
      f.write(json.dumps({"time": time.time(), "config": config}, sort_keys=True) + "\n")


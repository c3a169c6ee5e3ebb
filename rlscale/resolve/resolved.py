"""The one resolve step: a config becomes a checked, frozen description of a run.

`resolve` fills the fields a config lacks (config/defaults.py), checks every field
(resolve/validate.py: one ConfigError naming each bad one), builds the meshes, the task and the
model config (resolve/experiment.py), and plans the batch once (plan/batch.py) -- all before
any compilation. Trainers take the result, never a bare config. An RL run's base policy is
found or built (run/base_policy.py) before its trainer is constructed and recorded in `base`.
"""

from __future__ import annotations

import dataclasses

import ml_collections

from rlscale.config import defaults
from rlscale.plan import batch
from rlscale.resolve import experiment
from rlscale.resolve.validate import validate


@dataclasses.dataclass(frozen=True)
class Resolved:
  """A run as it will execute: its frozen config, its setup (meshes, rules, task, model config),
  its batch plan, its directory and, for RL, the folder of the policy it starts from."""
  cfg: ml_collections.FrozenConfigDict
  workdir: str | None  # None: planned only (no directory checked or written)
  config_file: str | None
  setup: experiment.Setup
  plan: batch.BatchPlan
  base: str | None = None  # RL: a Hugging Face folder with the starting policy

  @property
  def kind(self) -> str:
    return self.cfg.kind

  def with_base(self, folder: str) -> "Resolved":
    return dataclasses.replace(self, base=folder)

  def config(self) -> ml_collections.ConfigDict:
    """An unfrozen copy of the config (to derive another config from it)."""
    return self.cfg.as_configdict()


def check(cfg: ml_collections.ConfigDict, workdir: str | None = None,
          config_file: str | None = None) -> ml_collections.ConfigDict:
  """The config with its defaults filled in, every field checked (a ConfigError otherwise)."""
  cfg = defaults.fill(cfg)
  validate(cfg, config_file=config_file, workdir=workdir)
  return cfg


def resolve(cfg: ml_collections.ConfigDict, workdir: str | None, config_file: str | None = None,
            setup: experiment.Setup | None = None) -> Resolved:
  """Check `cfg` and build what the run needs before compiling anything.

  `setup` replaces the one the config describes (benchmarks/rl_step.py trains on a task of its
  own); `config_file` locates a relative init.sft_config as the run will.
  """
  return build(check(cfg, workdir, config_file), workdir, config_file, setup)


def build(cfg: ml_collections.ConfigDict, workdir: str | None, config_file: str | None = None,
          setup: experiment.Setup | None = None) -> Resolved:
  """The Resolved of a config `check` returned: its setup and its one batch plan."""
  setup = setup or experiment.setup(cfg)
  plan = batch.plan_for(cfg, setup)
  return Resolved(ml_collections.FrozenConfigDict(cfg), workdir, config_file, setup, plan)

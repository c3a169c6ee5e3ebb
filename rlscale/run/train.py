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


def lane_configs(cfg: ml_collections.ConfigDict, seeds=(), lanes_file: str | None = None,
                 workdir: str | None = None, config_file: str | None = None):
  """(configs, run directories) of runs side by side: `seeds` (the config at each seed, run
  directories from `workdir` with `{seed}` in it, or beside the default one), or `lanes_file`,
  a JSON list of {"run_dir": ..., "overrides": {dotted field: value}} (what a sweep writes)."""
  import copy
  import json

  from rlscale.config.errors import ConfigError
  from rlscale.sweep.points import set_field
  if lanes_file:
    try:
      with open(lanes_file) as f:
        entries = json.load(f)
      pairs = [(e["run_dir"], dict(e.get("overrides", {}))) for e in entries]
    except (OSError, ValueError, TypeError, KeyError) as e:
      raise ConfigError(f"--lanes={lanes_file}: not a list of {{run_dir, overrides}} ({e})")
  else:
    if workdir and "{seed}" not in workdir:
      raise ConfigError(f"--seeds with --workdir={workdir}: put {{seed}} in it, one run "
                        f"directory per seed (e.g. --workdir=runs/x/seed={{seed}})")
    pattern = workdir or default_workdir(cfg, config_file) + "-seed{seed}"
    pairs = [(pattern.format(seed=s), {"seed": int(s)}) for s in seeds]
  if not pairs:
    raise ConfigError("runs side by side: no run given")
  cfgs = []
  for _, overrides in pairs:
    c = copy.deepcopy(cfg)
    with c.unlocked():
      for field, value in overrides.items():
        set_field(c, field, value)
    cfgs.append(c)
  return cfgs, [d for d, _ in pairs]


def main_lanes(cfgs: list, workdirs: list[str], config_file: str | None = None,
               allow_config_change: tuple[str, ...] = ()) -> list[dict]:
  """Run `cfgs` side by side (rlscale/trainer/lanes.py), each in its run directory."""
  import contextlib

  from rlscale.config.errors import ConfigError
  from rlscale.trainer import lanes
  compile_cache.enable(cfgs[0].init.cache_dir if "init" in cfgs[0] else "runs/base")
  bad = lanes.errors(cfgs, workdirs)
  if bad:
    raise ConfigError("runs side by side: " + "; ".join(bad))
  # Each lane's run on one device (its lane's): the plan and the model are a run's alone.
  try:
    env = experiment.setup(cfgs[0], devices=jax.local_devices()[:1])
  except ValueError as e:
    raise ConfigError(f"runs side by side put each run on one device: {e}") from e
  runs = [resolved.resolve(c, w, config_file, setup=env, allow_config_change=allow_config_change)
          for c, w in zip(cfgs, workdirs)]
  with contextlib.ExitStack() as held:
    for w in workdirs:
      held.enter_context(workdir_lock.held(w, jax.process_index() == 0))
    base = base_policy.find_or_build(runs[0])
    return lanes.run([r.with_base(base) for r in runs])

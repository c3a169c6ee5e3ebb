"""The policy an RL run starts from: a Hugging Face folder, or the SFT base built and cached.

Runs started together on an empty cache build the base once: process 0 of each run takes a lock
file beside the cache folder (`sft-<hash>.lock`), so the first run builds and the others wait,
then find the finished folder and reuse it. The lock is fcntl.flock, released by the kernel when
a run dies, so a crashed build never blocks the next run (which resumes it from its checkpoints).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

import jax
import ml_collections
from absl import logging

from rlscale.config.errors import ConfigError
from rlscale.resolve import experiment, resolved
from rlscale.trainer import sft_trainer


def find_or_build(run: resolved.Resolved) -> str:
  """A Hugging Face folder with the base policy of the RL run `run`: init.hf_checkpoint, else
  model.hf_checkpoint, else the SFT base built by its recipe (`run.recipe`, init.sft_config
  with this run's model, task and mesh), cached under init.cache_dir by the recipe's hash and
  reused by every later run.
  """
  cfg = run.cfg
  if cfg.init.hf_checkpoint:
    return cfg.init.hf_checkpoint
  if cfg.model.hf_checkpoint:  # a real checkpoint is its own base
    return cfg.model.hf_checkpoint
  recipe = run.recipe
  if recipe is None:  # the resolve step was given no config file to look beside
    raise ConfigError(f"init.sft_config={cfg.init.sft_config!r} was not found: give its path "
                      f"from here, or the config file it sits beside (--config)")
  policy = os.path.join(recipe.workdir, "policy")
  with _exclusive(recipe.workdir + ".lock", what=recipe.workdir):
    # sft.run is a collective over this run's processes: all of them build, or none.
    if _same_on_all_processes(not _complete(policy)):
      _build(recipe)
    else:
      logging.info("base policy: reusing %s", policy)
  return policy


def cache_folder(cfg: ml_collections.ConfigDict, config_file: str | None) -> str:
  """Where the base policy of `cfg` is cached: init.cache_dir/sft-<hash of its recipe>."""
  return experiment.recipe_folder(cfg, experiment.recipe(cfg, config_file))


def _complete(policy: str) -> bool:
  return os.path.exists(os.path.join(policy, sft_trainer.DONE))


def _build(recipe: resolved.Resolved) -> None:
  logging.info("base policy: building it (%d SFT steps) into %s; later runs reuse it",
               recipe.plan.num_steps, recipe.workdir)
  sft_trainer.run(recipe)  # writes COMPLETE last, from process 0
  if jax.process_count() > 1:  # every process is done before process 0 lets other runs in
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices("base policy built")


def _same_on_all_processes(flag: bool) -> bool:
  """Process 0's `flag`, on every process of the run (no collective in a single process)."""
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils
  return bool(multihost_utils.broadcast_one_to_all(flag))


@contextlib.contextmanager
def _exclusive(lock_path: str, what: str):
  """Hold an exclusive lock on `lock_path` in process 0; other processes of the run hold none.

  The lock file stays behind: removing it would let a waiting run lock a deleted file.
  """
  if jax.process_index() != 0:
    yield
    return
  os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
  with open(lock_path, "a") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      logging.info("base policy: waiting for %s: another run holds it while building %s",
                   lock_path, what)
      t0 = time.time()
      fcntl.flock(f, fcntl.LOCK_EX)
      logging.info("base policy: got %s after %.0f s", lock_path, time.time() - t0)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)

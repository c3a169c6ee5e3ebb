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

from rlscale.config import files as config_files
from rlscale.resolve import experiment, resolved
from rlscale.trainer import sft_trainer


def find_or_build(cfg: ml_collections.ConfigDict, config_file: str | None) -> str:
  """A Hugging Face folder with the base policy: init.hf_checkpoint, else model.hf_checkpoint,
  else the SFT base built from init.sft_config.

  The SFT recipe runs with this config's model, task and mesh; its result is cached under
  init.cache_dir by the recipe's hash and reused by every later run.
  """
  if cfg.init.hf_checkpoint:
    return cfg.init.hf_checkpoint
  if cfg.model.hf_checkpoint:  # a real checkpoint is its own base
    return cfg.model.hf_checkpoint
  sft_cfg = sft_config(cfg, config_file)
  folder = cache_folder(cfg, config_file)
  policy = os.path.join(folder, "policy")
  with _exclusive(folder + ".lock", what=folder):
    # sft.run is a collective over this run's processes: all of them build, or none.
    if _same_on_all_processes(not _complete(policy)):
      _build(cfg, sft_cfg, folder)
    else:
      logging.info("base policy: reusing %s", policy)
  return policy


def sft_config(cfg: ml_collections.ConfigDict,
               config_file: str | None) -> ml_collections.ConfigDict:
  """init.sft_config with the run's model, task and mesh. Its seed is its own (the
  `seed=` of init.sft_config), not the run's: RL seeds of a sweep share one base policy."""
  sft_cfg = config_files.load(cfg.init.sft_config, config_file)
  with sft_cfg.unlocked():
    for section in ("model", "task", "mesh"):
      sft_cfg[section] = ml_collections.ConfigDict(cfg[section])  # an unfrozen copy
  return sft_cfg


def cache_folder(cfg: ml_collections.ConfigDict, config_file: str | None) -> str:
  """Where the base policy of `cfg` is cached: init.cache_dir/sft-<hash of its recipe>."""
  sft_cfg = sft_config(cfg, config_file)
  return os.path.join(cfg.init.cache_dir, f"sft-{experiment.config_hash(sft_cfg, ('mesh',))}")


def _complete(policy: str) -> bool:
  return os.path.exists(os.path.join(policy, sft_trainer.DONE))


def _build(cfg: ml_collections.ConfigDict, sft_cfg: ml_collections.ConfigDict, folder: str) -> None:
  logging.info("base policy: building it with %s (%d SFT steps) into %s; later runs reuse it",
               cfg.init.sft_config, sft_cfg.train.num_steps, folder)
  sft_trainer.run(resolved.resolve(sft_cfg, folder))  # writes COMPLETE last, from process 0
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

"""One of two processes of one RL run on a mesh that spans both; run by test_distributed.py.

Usage: python two_process_rl.py CONFIG CACHE_DIR WORKDIR [ROLES]  (CONFIG: grpo.py, grpo.py+ds or ppo.py;
ROLES: colocated, or split: each process samples on 2 of its 4 devices; with
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID set and 4 CPU devices per process).
The test runs `config(...)` in its own process too, on 8 devices, and compares metrics.jsonl.
"""

import os
import sys

import jax
from absl import logging

from rlscale.config import files as config_files
from rlscale.parallel import distributed
from rlscale.run import train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SFT_ARGS = "optim.warmup_responses=0,train.num_steps=60,train.eval_every=0,train.checkpoint_every=0"


def config(name: str, cache_dir: str, roles: str = "colocated"):
  """The tiny config cut to 2 RL steps (evaluated and saved at step 2), without TensorBoard;
  NAME+ds (grpo.py+ds) with dynamic sampling, P prompts a round (steps of several rounds).

  The tiny SFT base (6 steps, all inside its 20-step warmup) earns no reward, so GRPO's
  advantages and gradients would all be 0: the base here trains 60 steps without warmup (its
  evaluations are left to the end) and partial credit rewards near answers. 30 steps sufficed
  until the model's initial draws changed with its parameter tree (gate and up as two weights):
  that base also earned 0 in both RL steps.
  """
  name, _, variant = name.partition("+")
  cfg = config_files.load(os.path.join(REPO, "configs", f"{name}:tiny"))
  with cfg.unlocked():
    if variant == "ds":
      cfg.rollout.dynamic_sampling, cfg.rollout.oversample = True, 1
    cfg.init.cache_dir = cache_dir
    cfg.init.sft_config = os.path.join(REPO, "configs", "sft.py:tiny," + SFT_ARGS)
    cfg.task.partial_credit = True
    cfg.mesh.shape = (-1, 1, 1)
    cfg.train.num_steps, cfg.train.eval_every, cfg.train.checkpoint_every = 2, 2, 2
    cfg.train.tensorboard = False
    if roles == "split":
      cfg.mesh.roles, cfg.mesh.sampler_devices = "split", 4
  return cfg


if __name__ == "__main__":
  logging.set_verbosity(logging.INFO)
  distributed.initialize()
  assert jax.process_count() == 2 and jax.device_count() == 8, (jax.process_count(),
                                                                jax.device_count())
  train.main(config(*sys.argv[1:3], *sys.argv[4:5]), sys.argv[3])

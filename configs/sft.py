"""Supervised training of the base policy on task demonstrations.

    python launch/main.py --config=configs/sft.py
    python launch/main.py --config=configs/sft.py:tiny      # seconds, for tests
    python launch/main.py --config=configs/sft.py:chain_sum # configs/grpo_chain_sum.py's base

The GRPO config builds this base itself (with its own model, task and mesh) when its
cached copy is missing.
"""

import ml_collections

from rlscale.config import sections as common


def tiny(c: ml_collections.ConfigDict) -> None:
  """Seconds on a laptop: the tests' shape."""
  c.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)
  c.task.num_eval = 64
  c.sft.batch_size = c.sft.microbatch = 32
  c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 6, 3, 3
  c.eval.generation_batch = 64


def chain_sum(c: ml_collections.ConfigDict) -> None:
  """The base of configs/grpo_chain_sum.py: the chained-sum task with flawed demonstrations."""
  common.chain_sum_default(c)
  c.optim.lr = 3e-3  # learns the arithmetic within 600 steps (loss 0.067; no scan on this task)
  c.train.num_steps = 600  # ~4.5 min on 2 CPU cores; arithmetic right, carries mostly dropped


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "sft"  # which trainer runs this config
  c.seed = 0  # parameter init and every random draw of the run
  common.arithmetic_default(c)  # model, mesh, task
  c.sft = ml_collections.ConfigDict()
  c.sft.batch_size = 128  # demonstrations per step (global)
  c.sft.microbatch = 128  # rows per forward/backward pass ('auto': rlscale/plan/batch.py chooses)
  c.optim = common.optim(lr=2e-3)
  c.optim.warmup_responses = 2560  # 20 steps, then constant: decay learns slower in this budget
  c.train = common.run(num_steps=900)
  c.train.eval_every = 100  # held-out greedy accuracy every N steps
  c.train.checkpoint_every = 100  # save every N steps
  c.eval = ml_collections.ConfigDict()
  c.eval.generation_batch = 512  # held-out rows per compiled decode call
  common.apply_arg(c, arg, {"tiny": tiny, "chain_sum": chain_sum}, common.ALIASES)
  return c

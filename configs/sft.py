"""Supervised training of the base policy on task demonstrations.

    python launch/main.py --config=configs/sft.py
    python launch/main.py --config=configs/sft.py:tiny      # seconds, for tests

The GRPO and PPO configs build this base themselves when their cached copy is missing.
"""

import ml_collections

from rlscale import config_common as common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "sft"  # which trainer runs this config
  c.seed = 0  # parameter init and every random draw of the run
  c.model = common.model("tiny", vocab_size=32)  # 17 characters used; 32 rows
  c.mesh = common.mesh()
  c.task = common.task("arithmetic")
  c.sft = ml_collections.ConfigDict()
  c.sft.batch_size = 128  # demonstrations per step (global)
  c.sft.microbatch = 128  # rows per forward/backward pass
  c.optim = common.optim(lr=1e-3)
  c.optim.warmup_steps = 20
  c.optim.schedule = "cosine"
  c.optim.final_lr_frac = 0.1
  c.train = common.run(num_steps=300)
  c.train.eval_every = 100
  c.train.checkpoint_every = 100
  c.eval = ml_collections.ConfigDict()
  c.eval.generation_batch = 512  # held-out rows per compiled decode call
  if arg == "tiny":
    c.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)
    c.task.digits, c.task.num_eval = 2, 64
    c.sft.batch_size = c.sft.microbatch = 32
    c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 6, 3, 3
    c.eval.generation_batch = 64
  elif arg:
    raise ValueError(f"configs/sft.py: unknown variant {arg!r} (known: tiny)")
  return c

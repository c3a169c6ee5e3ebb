"""GRPO on the embedded arithmetic task, from a supervised base policy.

    python launch/main.py --config=configs/grpo.py
    python launch/main.py --config=configs/grpo.py --config.rl.num_prompts=64
    python launch/main.py --config=configs/grpo.py:tiny        # seconds, for tests

Batch units follow DESIGN.md: num_prompts P x group_size G responses per step, cut into
num_minibatches optimizer steps per epoch, num_epochs passes, microbatch rows per pass.
"""

import ml_collections

from rlscale import config_common as common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "grpo"  # which trainer runs this config
  c.seed = 0  # every random draw of the run derives from it
  common.arithmetic_default(c)  # model, mesh, task: those of the cached base policy

  c.init = common.init()
  c.rollout = common.rollout(max_new_tokens=6)  # answers need <= 4 tokens with EOS

  c.rl = ml_collections.ConfigDict()
  c.rl.num_prompts = 64  # P: prompts per RL step
  c.rl.group_size = 8  # G: responses per prompt
  c.rl.num_minibatches = 1  # optimizer steps per epoch; a mini-batch is P*G/num_minibatches
  c.rl.num_epochs = 1  # passes over each step's responses
  c.rl.microbatch = 256  # responses per forward/backward pass (never changes the gradient)
  c.rl.advantage = "grpo"  # grpo (std-normalized) | dr_grpo (mean only) | rloo
  c.rl.clip_eps_low = 0.2  # ratio clip 1 - eps_low
  c.rl.clip_eps_high = 0.28  # ratio clip 1 + eps_high (DAPO's clip-higher)
  c.rl.kl_coef = 0.0  # weight of the KL penalty to the frozen base policy; 0 skips it
  c.rl.kl_estimator = "k3"  # k1 | k2 | k3
  c.rl.entropy_coef = 0.0  # entropy bonus weight
  c.rl.loss_aggregation = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
  c.rl.old_logprobs = "sampler"  # sampler: log-probs recorded while sampling; recompute: a forward

  c.optim = common.optim(lr=1e-4)
  c.optim.b2 = 0.99  # RL gradients are noisy and non-stationary: a shorter second-moment memory
  c.optim.reference_batch = 512  # lr was tuned at 512 responses per optimizer step (P=64, G=8)
  c.noise = common.noise_scale()
  c.target = common.target("eval/accuracy_greedy", 0.6)

  c.train = common.run(num_steps=200)
  c.eval = common.evaluation()

  if arg == "tiny":
    c.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)
    c.task.digits, c.task.num_eval = 2, 32
    c.rollout.max_new_tokens, c.rollout.generation_batch = 4, 32
    c.rl.num_prompts, c.rl.group_size, c.rl.microbatch = 4, 4, 8
    c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 4, 2, 2
    c.eval.generation_batch = 32
    c.init.sft_config = "configs/sft.py:tiny"
  elif arg:
    raise ValueError(f"configs/grpo.py: unknown variant {arg!r} (known: tiny)")
  return c

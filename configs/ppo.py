"""PPO with a critic on the embedded arithmetic task, from the same cached base policy as GRPO.

    python launch/main.py --config=configs/ppo.py
    python launch/main.py --config=configs/ppo.py --config.rl.prox_com=4   # batch-size-invariant
    python launch/main.py --config=configs/ppo.py:tiny        # seconds, for tests

The actor and the critic have their own optimizers, scaling rules, mini-batches and
micro-batches; batch units follow DESIGN.md as in configs/grpo.py.
"""

import ml_collections

from rlscale import config_common as common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "ppo"  # which trainer runs this config
  c.seed = 0  # every random draw of the run derives from it
  common.arithmetic_default(c)  # model, mesh, task: those of the cached base policy

  c.init = common.init()
  c.rollout = common.rollout(max_new_tokens=6)  # answers need <= 4 tokens with EOS

  c.rl = ml_collections.ConfigDict()
  c.rl.num_prompts = 128  # P: prompts per RL step
  c.rl.group_size = 4  # G: responses per prompt (PPO needs no groups; they share prompts)
  c.rl.num_minibatches = 2  # actor optimizer steps per epoch
  c.rl.num_epochs = 1  # passes over each step's responses
  c.rl.microbatch = 128  # responses per forward/backward pass of the actor
  c.rl.gamma = 1.0  # discount of the token-level rewards
  c.rl.lam = 0.95  # GAE lambda
  c.rl.whiten_advantages = True  # normalize advantages over the batch's valid tokens
  c.rl.clip_eps_low = 0.2  # ratio clip 1 - eps_low
  c.rl.clip_eps_high = 0.28  # ratio clip 1 + eps_high
  c.rl.dual_clip = 0.0  # dual clip c > 1 for negative advantages (Ye et al. 2020); 0: off
  c.rl.kl_coef = 0.0  # per-token KL penalty to the frozen base policy in the reward; 0: off
  c.rl.kl_estimator = "k1"  # k1 | k2 | k3 (of the penalty)
  c.rl.entropy_coef = 0.0  # entropy bonus weight
  c.rl.loss_aggregation = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum-norm
  c.rl.old_logprobs = "sampler"  # sampler: log-probs recorded while sampling; recompute: a forward
  # Batch-size-invariant PPO (Hilton et al. 2021): the clip anchor is an EWMA of the actor.
  c.rl.prox_com = 0.0  # its centre of mass in optimizer steps at optim.reference_batch; 0: off

  c.optim = common.optim(lr=1e-4)  # the actor's
  c.optim.b2 = 0.99  # RL gradients are noisy and non-stationary: a shorter second-moment memory
  c.optim.reference_batch = 256  # lr was tuned at 256 responses per optimizer step

  c.critic = ml_collections.ConfigDict()
  c.critic.hf_checkpoint = ""  # the critic's backbone; empty: the base policy's
  c.critic.num_minibatches = 2  # critic optimizer steps per epoch
  c.critic.num_epochs = 1  # critic passes over each step's responses
  c.critic.microbatch = 128  # responses per forward/backward pass of the critic
  c.critic.value_clip = 0.2  # clip of the value update around the old values; 0: off
  c.critic.warmup_steps = 10  # RL steps that train only the critic (its head starts random)
  c.critic.optim = common.optim(lr=3e-4)
  c.critic.optim.b2 = 0.99  # as the actor's
  c.critic.optim.reference_batch = 256  # responses per critic optimizer step at which lr was tuned

  c.noise = common.noise_scale()
  c.target = common.target("eval/accuracy_greedy", 0.6)
  c.train = common.run(num_steps=200)
  c.eval = common.evaluation()

  if arg == "tiny":
    c.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)
    c.task.num_eval = 32
    c.rollout.max_new_tokens, c.rollout.generation_batch = 4, 32
    c.rl.num_prompts, c.rl.group_size, c.rl.microbatch, c.rl.num_minibatches = 8, 2, 8, 1
    c.critic.microbatch, c.critic.num_minibatches, c.critic.warmup_steps = 8, 1, 1
    c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 4, 2, 2
    c.eval.generation_batch = 32
    c.init.sft_config = "configs/sft.py:tiny"
  elif arg:
    raise ValueError(f"configs/ppo.py: unknown variant {arg!r} (known: tiny)")
  return c

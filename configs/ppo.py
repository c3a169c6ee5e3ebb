"""PPO with a critic on the embedded arithmetic task, from the same cached base policy as GRPO.

    python launch/main.py --config=configs/ppo.py
    python launch/main.py --config=configs/ppo.py:ewma        # batch-size-invariant PPO
    python launch/main.py --config=configs/ppo.py:tiny        # seconds, for tests
    python launch/sweep.py --config=configs/ppo.py --sweep=actor_critic   # sweeps() below

The actor and the critic have their own optimizers, scaling rules, mini-batches and
micro-batches; batch units as in configs/grpo.py.
"""

import ml_collections

from rlscale.config import sections as common
from rlscale.sweep import axes as sw


def tiny(c: ml_collections.ConfigDict) -> None:
  """Seconds on a laptop: the tests' shape."""
  c.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)
  c.task.num_eval = 32
  c.rollout.max_new_tokens, c.rollout.generation_batch = 4, 32
  c.rl.num_prompts, c.rl.group_size, c.rl.microbatch, c.rl.num_minibatches = 8, 2, 8, 1
  c.critic.microbatch, c.critic.num_minibatches, c.critic.warmup_steps = 8, 1, 1
  c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 4, 2, 2
  c.eval.generation_batch = 32
  c.init.sft_config = "configs/sft.py:tiny"


def ewma(c: ml_collections.ConfigDict) -> None:
  """Batch-size-invariant PPO (Hilton et al. 2021): the clip anchor is an EWMA of the actor."""
  c.kind = "ppo_ewma"
  c.rl.prox_com = 4.0


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "ppo"  # the algorithm (rlscale/rl/algorithm.py): grpo | ppo | ppo_ewma
  c.seed = 0  # every random draw of the run derives from it
  common.arithmetic_default(c)  # model, mesh, task: those of the cached base policy

  c.init = common.init()
  c.rollout = common.rollout(max_new_tokens=6)  # answers need <= 4 tokens with EOS
  # G: PPO needs no groups; the responses to one prompt share it. Two actor optimizer steps.
  c.rl = common.rl(num_prompts=128, group_size=4, num_minibatches=2, kl_estimator="k1")
  c.rl.gamma = 1.0  # discount of the token-level rewards
  c.rl.lam = 0.95  # GAE lambda
  c.rl.whiten_advantages = True  # normalize advantages over the batch's valid tokens

  c.optim = common.optim(lr=1e-4)  # the actor's
  c.optim.b2 = 0.99  # RL gradients are noisy and non-stationary: a shorter second-moment memory
  c.optim.reference_batch = 256  # lr was tuned at 256 responses per optimizer step
  c.critic = common.critic(lr=3e-4, reference_batch=256)
  c.critic.num_minibatches = 2  # critic optimizer steps per epoch
  c.critic.optim.b2 = 0.99  # as the actor's

  c.noise = common.noise_scale()
  c.target = common.target("eval/accuracy_greedy", 0.6)
  c.train = common.run(num_steps=200)
  c.eval = common.evaluation()
  common.apply_arg(c, arg, {"tiny": tiny, "ewma": ewma}, common.ALIASES)
  return c


def sweeps(arg: str | None = None) -> dict[str, list[dict]]:
  """Named sweeps for launch/sweep.py: lists of overrides (rlscale/sweep/axes.py).

  actor_critic varies the actor's and the critic's batch (responses per optimizer step, by
  their mini-batch counts) separately, each with its sqrt lr rule, at equal responses: do they
  break at different batch sizes?
  """
  tiny = "tiny" in (arg or "").split(",")
  counts = [1, 2] if tiny else [1, 2, 4, 8]  # tiny: 8-row micro-batches of 16 responses
  middle = 1 if tiny else 2  # the other model's count while one varies (the default)
  rules = sw.fixed(**{"optim.lr_scaling": "sqrt", "critic.optim.lr_scaling": "sqrt"})
  actor = sw.product({"rl.num_minibatches": counts}, {"critic.num_minibatches": [middle]})
  critic = sw.product({"rl.num_minibatches": [middle]},
                      {"critic.num_minibatches": [n for n in counts if n != middle]})
  return {
      "actor_critic": sw.product(sw.chain(actor, critic), rules,
                                 {"seed": [0, 1] if tiny else [0, 1, 2]},
                                 sw.fixed(responses=256 if tiny else 65536),
                                 {"train.eval_every_responses": [64 if tiny else 8192]}),
  }

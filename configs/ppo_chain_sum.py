"""PPO with a critic on the chained-sum testbed, from the same cached base as its GRPO config.

    python launch/main.py --config=configs/ppo_chain_sum.py
    python launch/main.py --config=configs/ppo_chain_sum.py:ewma   # batch-size-invariant PPO
    python launch/main.py --config=configs/ppo_chain_sum.py:tiny   # seconds, for tests

configs/ppo.py with configs/grpo_chain_sum.py's model, task, base policy, response budget
and target; see those files for every field.
"""

import os

import ml_collections

from rlscale import config_common as common
from rlscale import config_files
from rlscale.sweep import axes as sw

_HERE = os.path.dirname(os.path.abspath(__file__))
ppo = config_files.load_module(os.path.join(_HERE, "ppo.py"))[0]  # the PPO recipe
grpo_chain_sum = config_files.load_module(os.path.join(_HERE, "grpo_chain_sum.py"))[0]


def tiny(c: ml_collections.ConfigDict) -> None:
  """Seconds on a laptop: the tests' shape."""
  ppo.tiny(c)
  c.task.terms = 3
  c.rollout.max_new_tokens = 16


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ppo.get_config()
  g = grpo_chain_sum.get_config()
  c.model, c.task, c.init, c.target = g.model, g.task, g.init, g.target
  c.rollout.max_new_tokens = g.rollout.max_new_tokens  # the longest scratchpad with EOS
  c.train.num_steps, c.train.eval_every = g.train.num_steps, g.train.eval_every
  common.apply_arg(c, arg, {"tiny": tiny, "ewma": ppo.ewma}, common.ALIASES)
  return c


def sweeps(arg: str | None = None) -> dict[str, list[dict]]:
  """actor_critic: the actor's and the critic's batch (responses per optimizer step, by their
  mini-batch counts, together) at equal responses, each with its sqrt lr rule: how do their
  gradient norms (signal and noise) follow the batch? Used by configs/studies/chain_sum_cpu.py."""
  tiny = "tiny" in (arg or "").split(",")
  counts = [1, 2] if tiny else [1, 2, 4, 8]  # B = 512 ... 64 responses at P=128, G=4
  # tiny: 4-row micro-batches, two passes per mini-batch of 8 for the noise scale.
  micro = {"rl.microbatch": 4, "critic.microbatch": 4} if tiny else {}
  return {
      "actor_critic": sw.product(
          sw.zip_axes({"rl.num_minibatches": counts, "critic.num_minibatches": counts}),
          sw.fixed(**{"optim.lr_scaling": "sqrt", "critic.optim.lr_scaling": "sqrt",
                      "train.eval_every_responses": 64 if tiny else 1024,
                      "eval.sampled": False, "responses": 256 if tiny else 10240, **micro})),
  }

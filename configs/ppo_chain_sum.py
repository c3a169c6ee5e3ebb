"""PPO with a critic on the chained-sum testbed, from the same cached base as its GRPO config.

    python launch/main.py --config=configs/ppo_chain_sum.py
    python launch/main.py --config=configs/ppo_chain_sum.py:ewma   # batch-size-invariant PPO
    python launch/main.py --config=configs/ppo_chain_sum.py:tiny   # seconds, for tests

configs/ppo.py with configs/grpo_chain_sum.py's model, task, base policy, response budget
and target; see those files for every field.
"""

import os

import ml_collections

from rlscale.config import sections as common
from rlscale.config import files as config_files
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


# PPO's batches in the CPU study: P = 2, 4, 16, 64 prompts of G = 4 in one mini-batch, B = 8,
# 16, 64, 256 responses per optimizer step (every other of GRPO's: a PPO response costs about
# twice a GRPO one, critic and all), B0 = 16 as GRPO's, each run's budget and evaluation
# spacing GRPO's at that B plus the critic's warm-up: it trains alone for its first 512
# responses at every B (critic.warmup_steps = 512 / (P x G) steps), the same responses at every
# batch; the report counts them wherever PPO is compared with GRPO. The critic keeps its
# config lr (3e-4, no rule).
PROMPTS, GROUP, REF_PROMPTS, WARMUP_RESPONSES = (2, 4, 16, 64), 4, 4, 512


def _grid(grpo_p: int) -> list[str]:
  """Three rates a factor sqrt(2) apart centred on the rate the GRPO scan chose at the same B
  (GRPO's P = grpo_p): its choice and the rates beside it in its scan (the study's "{lr@-1:..}";
  continued past the end of that scan). The study extends an edge choice as GRPO's."""
  return [f"{{lr@-1:p={grpo_p}}}", f"{{lr:p={grpo_p}}}", f"{{lr@+1:p={grpo_p}}}"]


def sweeps(arg: str | None = None) -> dict[str, list[dict]]:
  """lr_scan: the actor's learning rate at each P, 3 rates sqrt(2) apart centred on the rate
  the GRPO scan chose at the same B (_grid: on the chain-sum study PPO's choice was GRPO's at
  every B when it scanned GRPO's 5 rates), the GRPO scan's 3 seeds; the study chooses by the
  joint fit of E(B, lr) and extends an edge. confirm: each P at its chosen rate
  ("{optim.lr}"; its runner-up "{optim.lr#2}" too where the joint fit is not identified), as
  many fresh seeds as the power calculation asks ("{seeds}"). Evaluated and stopped as the
  GRPO study (grpo_chain_sum.SAMPLED, STAGED, STOP), no gradient clipping (actor or critic).
  Both read the study's choices: used by configs/studies/chain_sum_cpu.py."""
  tiny = "tiny" in (arg or "").split(",")
  prompts, group, ref, warmup = ((2, 4), 2, 2, 8) if tiny else (
      PROMPTS, GROUP, REF_PROMPTS, WARMUP_RESPONSES)
  grpo_group = 4 if tiny else 8  # the GRPO study's G: its P at the same B is P x G / that

  def at_b(table, p):  # GRPO's value at the same B (P x 8)
    return table[p * group // 8]

  def each(budgets):
    return sw.zip_axes({
        "p": list(prompts),
        "critic.warmup_steps": [max(1, warmup // (p * group)) for p in prompts],
        "responses": [32 if tiny else at_b(budgets, p) + warmup for p in prompts],
        "train.eval_every_responses": [8 if tiny else at_b(grpo_chain_sum.EVAL_EVERY, p)
                                       for p in prompts]})
  each_p, scan_p = each(grpo_chain_sum.BUDGET), each(grpo_chain_sum.SCAN_BUDGET)
  common_ = sw.fixed(**{"g": group, "rl.num_minibatches": 1, "critic.num_minibatches": 1,
                        **grpo_chain_sum.SAMPLED, **grpo_chain_sum.STAGED,
                        **({} if tiny else grpo_chain_sum.STOP),
                        "optim.lr_scaling": "none", "optim.grad_clip": 0.0,
                        "critic.optim.grad_clip": 0.0, "optim.reference_batch": ref * group,
                        # tiny sets 8-row micro-batches; its batches hold 4-16 rows
                        **({"rl.microbatch": "auto", "critic.microbatch": "auto"} if tiny
                           else {})})
  return {
      "lr_scan": sw.product(
          sw.chain(*(sw.product([pt], {"optim.lr": _grid(pt["p"] * group // grpo_group)})
                     for pt in scan_p)), {"seed": [0] if tiny else [0, 1, 2]}, common_),
      "confirm": sw.product(each_p, {"optim.lr": ["{optim.lr}", "{optim.lr#2}"]},
                            {"seed": ["{seeds}"]}, common_),
  }

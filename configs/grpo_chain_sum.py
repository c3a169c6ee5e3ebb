"""GRPO on the chained-sum testbed (rlscale/tasks/chain_sum.py), from its flawed SFT base.

    python launch/main.py --config=configs/grpo_chain_sum.py
    python launch/main.py --config=configs/grpo_chain_sum.py:p=64,g=8   # a batch of a study
    python launch/main.py --config=configs/grpo_chain_sum.py:tiny       # seconds, for tests

Responses are worked scratchpads (`7+5=12;12+9=21;21+3=24`, ~19-21 tokens) graded on their
final answer; the base (configs/sft.py:chain_sum) drops most carries, and GRPO must learn
to take them. Measured on 2 CPU cores with the 2,000-problem held-out set (base build 2 min
15 s alone, cached): the base answers 11.6% greedily and 20% sampled; at P=32, G=8, lr 2e-4
GRPO takes greedy accuracy to 0.45 in ~1.7k responses and to ~0.60, its plateau, by ~3k (12
steps), while the sampled accuracy (the expected reward) climbs more slowly, to ~0.55 over
the study's 2,560 responses per run. Batch units as in configs/grpo.py.
"""

import math

import ml_collections

from rlscale.config import sections as common
from rlscale.sweep import axes as sw


def tiny(c: ml_collections.ConfigDict) -> None:
  """Seconds on a laptop: the tests' shape."""
  c.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)
  c.task.terms, c.task.num_eval = 3, 32
  c.rollout.max_new_tokens, c.rollout.generation_batch = 16, 32
  c.rl.num_prompts, c.rl.group_size, c.rl.microbatch = 4, 4, 8
  c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 2, 2, 2
  c.eval.generation_batch = 32
  c.init.sft_config = "configs/sft.py:tiny"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "grpo"  # the algorithm (rlscale/rl/algorithm.py): grpo | ppo | ppo_ewma
  c.seed = 0  # every random draw of the run derives from it
  common.chain_sum_default(c)  # model, mesh, task: those of the cached base policy

  c.init = common.init("configs/sft.py:chain_sum")
  c.rollout = common.rollout(max_new_tokens=24)  # the longest scratchpad is 23 tokens with EOS
  c.rl = common.rl(num_prompts=32, group_size=8)
  c.rl.advantage = "grpo"  # grpo (std-normalized) | dr_grpo (mean only) | rloo

  c.optim = common.optim(lr=1e-4)  # best of 5e-5, 1e-4, 2e-4, 4e-4 at P=32 in responses to 0.4
  c.optim.b2 = 0.99  # RL gradients are noisy and non-stationary: a shorter second-moment memory
  c.optim.reference_batch = 256  # lr was tuned at 256 responses per optimizer step (P=32, G=8)
  c.noise = common.noise_scale()
  # 70% of the way from the base (0.116) to the plateau (~0.60), where the curve is still
  # steep; the CPU study sets its own target the same way from its runs (rlscale/study/study.py).
  c.target = common.target("eval/accuracy_greedy", 0.45)

  c.train = common.run(num_steps=40)  # 10,240 responses at P=32, G=8 (~1 min of steps)
  c.train.eval_every = 5  # held-out evaluation every N steps (and at the end)
  c.eval = common.evaluation()
  common.apply_arg(c, arg, {"tiny": tiny}, common.ALIASES)
  return c


# The CPU study's batches (configs/studies/chain_sum_cpu.py): P = 1 ... 32 prompts of G = 8,
# B = 8 ... 256 responses per optimizer step, the reference B0 = 16 (P = 2). Each run's budget
# grows with B so that every verdict seed crosses the target (~0.51; at 0.49 B = 256 took
# 8-14 optimizer steps at its good rates, B = 16 ~800-1,500 responses), about 4x the best
# rate's responses, 5-6x at B = 8 and 16 where one seed in ten stalled short of 6,144 (BUDGET);
# a scan only ranks rates, so its runs stop at about 2.5x (SCAN_BUDGET: a rate slower than that
# is censored there, never chosen). Evaluations every 256 responses, 2
# steps at B = 256 (EVAL_EVERY: 4-12 before each crossing). Gradient clipping is off (at 1.0 it
# clipped most steps at B <= 16 and almost none at B >= 32: the update rule changed with B).
PROMPTS, REF_PROMPTS, LR0 = (1, 2, 4, 8, 16, 32), 2, 1e-4
BUDGET = {1: 8192, 2: 8192, 4: 6144, 8: 6144, 16: 8192, 32: 12288}  # responses per run, by P
SCAN_BUDGET = {1: 4096, 2: 4096, 4: 4096, 8: 4096, 16: 6144, 32: 8192}
EVAL_EVERY = {1: 256, 2: 256, 4: 256, 8: 256, 16: 256, 32: 512}
REF_BUDGET = 8192  # the target stage's runs: their final value is the gain the target is a fraction of
# The study's metric: the sampled accuracy (one temperature-1 response per held-out problem),
# the policy's expected reward. The greedy accuracy flips as soon as the right carry becomes
# the mode: 0.17 -> 0.47 in 10 steps at B = 256, then flat, while the sampled one climbs on for
# 40 steps (0.22 -> 0.33 -> 0.47); only the greedy one is scored by default.
SAMPLED = {"eval.greedy": False, "eval.sampled": True, "target.metric": "eval/accuracy_sampled"}
# Evaluation in stages against the study's target (set before the scan: "{target}"); a run
# ends at its first evaluation past 1.25 x its responses to target (target.stop_margin): the
# crossing and what follows it (a collapse) are seen, the budget guards the slow seeds only.
STAGED = {"eval.adaptive": True, "eval.generation_batch": 125, "target.value": "{target}"}
STOP = {"target.stop": True, "target.stop_margin": 0.25}


# The scan's centre at B0: the reference batch's best rate near the study's target (~0.5) is
# 2e-4, twice the starting rate (a scan centred on 1e-4 had its optimum at the upper edge at
# both B = 16 and B = 256, and ran two extensions to find it).
SCAN_LR0 = 2 * LR0


def lr_grid(p: int, ref: int = REF_PROMPTS, lr0: float = SCAN_LR0, rates: int = 5
            ) -> list[float]:
  """`rates` rates a factor sqrt(2) apart on the grid lr0 * 2^(k/2), centred on
  lr0 * (p / ref)^(1/4): half-way between a fixed rate and the sqrt rule, so that the scan
  brackets either (the study extends an edge when the optimum lies beyond it)."""
  centre = math.floor(math.log2(p / ref) / 2 + 0.5)  # (p/ref)^(1/4) = 2^(centre / 2)
  half = rates // 2
  return [float(f"{lr0 * 2 ** ((centre + d) / 2):.3g}") for d in range(-half, rates - half)]


def sweeps(arg: str | None = None) -> dict[str, list[dict]]:
  """Named sweeps for launch/sweep.py and the CPU study (configs/studies/chain_sum_cpu.py).

  Every verdict point of a batch has the same budget (BUDGET; a scan's SCAN_BUDGET), evaluated
  every EVAL_EVERY responses by the sampled accuracy of the 2,000 held-out problems (SAMPLED),
  in stages against the study's target (STAGED), B0 = 16 responses, no gradient clipping, the
  learning rate set per point (no scaling rule). "{lr}" is the study's choice for the point's
  own P, "{lr#2}" its runner-up (when the joint fit of E(B, lr) chose: the P's own scan's
  choice, one point where both agree), "{lr:p=4}" the choice at P = 4; "{seeds}" as many seeds as
  the study's power calculation asks. With `tiny` in the argument, the same sweeps at the
  tests' shape.
  """
  tiny = "tiny" in (arg or "").split(",")
  prompts, ref = ((1, 2), 2) if tiny else (PROMPTS, REF_PROMPTS)
  ref_budget = 64 if tiny else REF_BUDGET

  def budget(p, table=BUDGET):
    return 64 if tiny else table[p]

  def spacing(p):
    return 16 if tiny else EVAL_EVERY[p]

  base = {"g": 4 if tiny else 8,
          **SAMPLED, "optim.lr_scaling": "none", "optim.grad_clip": 0.0,
          "optim.reference_batch": ref * (4 if tiny else 8),
          **({"rl.microbatch": "auto"} if tiny else {})}  # tiny sets 8
  common_ = sw.fixed(**base, **STAGED, **({} if tiny else STOP))  # tiny: to its budget
  scan_seeds = {"seed": [0] if tiny else [0, 1, 2]}
  each_p = sw.zip_axes({"p": list(prompts), "responses": [budget(p) for p in prompts],
                        "train.eval_every_responses": [spacing(p) for p in prompts]})
  scan_p = sw.zip_axes({"p": list(prompts), "responses": [budget(p, SCAN_BUDGET) for p in prompts],
                        "train.eval_every_responses": [spacing(p) for p in prompts]})
  pairs_at = 2 if tiny else 4  # (P, G) with P x G equal to this P's batch at G = 8
  pairs = [(4, 2), (1, 8)] if tiny else [(8, 4), (2, 16)]
  # Dynamic sampling against none at three batches, the lr following the sqrt rule from LR0
  # at the reference batch, 3 seeds: responses to target against the responses generated and
  # those trained, invariance against the nominal and effective B.
  filtered = sw.product(
      {"rollout.dynamic_sampling": [False, True]}, {"p": [1, 2, 4] if tiny else [2, 4, 8]},
      {"seed": [0, 1, 2]},
      sw.fixed(**{**base, "responses": 64 if tiny else 2560, "optim.lr_scaling": "sqrt",
                  "lr": LR0, "target.value": 0.41,
                  "train.eval_every_responses": 16 if tiny else 128}))
  # The staleness bound against the batch (rollout.max_staleness = k): k = 0, 1, 2, 4, 8 at
  # B = 16 (the reference), 64 and 256, without a correction and with each of tis, mis and
  # decoupled PPO, 5 seeds (100-104), each P at the rate the CPU study chose for it and to the
  # study's target (0.51): does staleness cost responses to target, does a correction remove
  # the cost, and does it move where invariance breaks? (255 runs; the report's Staleness
  # section reads it.)
  stale_p = [1, 2] if tiny else [2, 8, 32]
  stale_lr = {1: 1e-4, 2: 1.41e-4, 8: 2e-4, 32: 4e-4}
  stale_each = sw.zip_axes({"p": stale_p, "lr": [stale_lr[p] for p in stale_p],
                            "responses": [budget(p) for p in stale_p],
                            "train.eval_every_responses": [spacing(p) for p in stale_p]})
  stale_common = sw.fixed(**{**base, **STAGED, "target.value": 0.51, **({} if tiny else STOP)})
  stale_seeds = {"seed": [100, 101] if tiny else [100, 101, 102, 103, 104]}
  staleness = sw.chain(
      sw.product({"rollout.max_staleness": [0]}, stale_each, stale_seeds, stale_common),
      sw.product({"rollout.max_staleness": [1, 2] if tiny else [1, 2, 4, 8]},
                 {"rl.off_policy_correction": ["none", "tis", "mis", "decoupled"]},
                 stale_each, stale_seeds, stale_common))
  # A configuration the study did not run, to check the advisor's prediction of it
  # (analysis/advise.py on docs/study: its B = 512 row, E from the study's fit of E(B), the rate
  # the sqrt rule from B = 256's chosen 4e-4): P = 64 at 5.66e-4, 5 seeds the study never used,
  # evaluated as B = 256 is, stopped at 1.25 x its crossing.
  heldout = sw.product({"p": [4] if tiny else [64], "lr": [LR0 if tiny else 5.66e-4],
                        "responses": [64 if tiny else 16384],
                        "train.eval_every_responses": [spacing(32)]},
                       {"seed": [200, 201] if tiny else [200, 201, 202, 203, 204]},
                       stale_common)  # the study's evaluation, target 0.51 and stop
  return {
      "dynamic_sampling": filtered,
      "staleness": staleness,
      "heldout": heldout,
      # The reference batch at the starting rate on the scan's seeds, evaluated at its start
      # and end only: the study's target is a fraction of the gain it makes.
      "reference": sw.product({"p": [ref], "lr": [LR0], "responses": [ref_budget]},
                              scan_seeds, sw.fixed(**{**base, "train.eval_every_responses":
                                                      ref_budget})),
      # The learning rate at every batch: 5 rates per P (lr_grid), 3 seeds; the study picks
      # one per P (and a runner-up) and extends a scan whose best rate is at its edge.
      "lr_scan": sw.product(sw.chain(*(sw.product([pt], {"lr": lr_grid(pt["p"], ref)[1:3] if tiny
                                                         else lr_grid(pt["p"], ref)})
                                       for pt in scan_p)),
                            scan_seeds, common_),
      # The verdict: every P at its chosen rate and its runner-up, on seeds the scan did not
      # use, as many as the power calculation asks.
      "confirm": sw.product(each_p, {"lr": ["{lr}", "{lr#2}"]},
                            {"seed": ["{seeds}"]}, common_),
      # Equal P x G, split differently, at the chosen rate of that batch: does only P x G
      # matter?
      "pairs": sw.product(sw.zip_axes({"p": [p for p, _ in pairs], "g": [g for _, g in pairs]}),
                          {"lr": ["{lr:p=%d}" % pairs_at],
                           "responses": [budget(pairs_at)],
                           "train.eval_every_responses": [spacing(pairs_at)]},
                          {"seed": ["{seeds}"]},
                          {k: [v] for k, v in common_[0].items() if k != "g"}),
  }

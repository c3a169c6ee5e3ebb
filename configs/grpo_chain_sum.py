"""GRPO on the chained-sum testbed (rlscale/tasks/chain_sum.py), from its flawed SFT base.

    python launch/main.py --config=configs/grpo_chain_sum.py
    python launch/main.py --config=configs/grpo_chain_sum.py:p=64,g=8   # a batch of a study
    python launch/main.py --config=configs/grpo_chain_sum.py:tiny       # seconds, for tests

Responses are worked scratchpads (`7+5=12;12+9=21;21+3=24`, ~19-21 tokens) graded on their
final answer; the base (configs/sft.py:chain_sum) drops most carries, and GRPO must learn
to take them. Measured on 2 CPU cores (base build 4 min 42 s, cached): held-out greedy
accuracy 14.2% -> 35.4% at 2,560 responses (10 steps, 23 s) -> 40% target near 4-5k
responses (the middle of this 40-step run) -> ~45% plateau from ~5k responses on (the base's
pass@8 is 44.8%: what sampling never finds, GRPO does not learn). Batch units follow
DESIGN.md as in configs/grpo.py.
"""

import ml_collections

from rlscale import config_common as common
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
  # P=32 passes 0.35 at ~2.5k responses, where the curve is steepest (base 0.14, plateau ~0.45).
  c.target = common.target("eval/accuracy_greedy", 0.35)

  c.train = common.run(num_steps=40)  # 10,240 responses at P=32, G=8 (~1 min of steps)
  c.train.eval_every = 5  # held-out evaluation every N steps (and at the end)
  c.eval = common.evaluation()
  common.apply_arg(c, arg, {"tiny": tiny}, common.ALIASES)
  return c


def sweeps(arg: str | None = None) -> dict[str, list[dict]]:
  """Named sweeps for launch/sweep.py and the CPU study (configs/studies/chain_sum_cpu.py).

  Every point of a sweep sees the same responses, evaluated (greedy only) every 512 of them.
  With `tiny` in the argument, the same sweeps at the tests' shape.
  """
  tiny = "tiny" in (arg or "").split(",")
  seeds = {"seed": [0, 1]}
  evals = sw.fixed(**{"train.eval_every_responses": 32 if tiny else 512, "eval.sampled": False})
  lrs = {"lr": [5e-5, 1e-4, 2e-4]}  # around the config's lr, at the reference batch
  prompts = [2, 4, 8] if tiny else [16, 32, 64, 128, 256]  # B = 128 ... 2048 at G=8
  ref = 4 if tiny else 32  # the P of the reference batch (tiny: the middle one)
  pairs = [(4, 4), (1, 16)] if tiny else [(16, 16), (64, 4)]  # P x G of the reference's
  return {
      # The learning rate at the reference batch, before any batch is compared with it.
      "lr_tuning": sw.product(lrs, seeds, sw.fixed(responses=128 if tiny else 8192), evals),
      # Curves against responses: where does invariance break, with and without the lr rule?
      # At the reference (P=32) both rules give the same lr: that run is not repeated.
      "batch_invariance": sw.product(
          sw.chain(sw.product({"p": prompts}, {"optim.lr_scaling": ["sqrt"]}),
                   sw.product({"p": [p for p in prompts if p != ref]},
                              {"optim.lr_scaling": ["none"]})),
          sw.fixed(g=8), seeds, sw.fixed(responses=256 if tiny else 16384), evals),
      # Equal P x G (= B here): does only the product matter?
      "group_vs_prompts": sw.product(sw.zip_axes({"p": [p for p, _ in pairs],
                                                  "g": [g for _, g in pairs]}),
                                     sw.fixed(**{"optim.lr_scaling": "sqrt"}), seeds,
                                     sw.fixed(responses=256 if tiny else 16384), evals),
  }

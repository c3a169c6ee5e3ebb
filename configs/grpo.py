"""GRPO on the embedded arithmetic task, from a supervised base policy.

    python launch/main.py --config=configs/grpo.py
    python launch/main.py --config=configs/grpo.py:p=16,g=8          # P and G of a sweep point
    python launch/main.py --config=configs/grpo.py --config.rl.num_prompts=64
    python launch/main.py --config=configs/grpo.py:tiny        # seconds, for tests
    python launch/sweep.py --config=configs/grpo.py --sweep=batch_invariance   # sweeps() below

Batch units: num_prompts P x group_size G responses per step, cut into
num_minibatches optimizer steps per epoch, num_epochs passes, microbatch rows per pass;
rlscale/plan/batch.py derives what is left 'auto' and logs its choice.
"""

import ml_collections

from rlscale.config import sections as common
from rlscale.sweep import axes as sw


def tiny(c: ml_collections.ConfigDict) -> None:
  """Seconds on a laptop: the tests' shape."""
  c.model.update(d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)
  c.task.digits, c.task.num_eval = 2, 32
  c.rollout.max_new_tokens, c.rollout.generation_batch = 4, 32
  c.rl.num_prompts, c.rl.group_size, c.rl.microbatch = 4, 4, 8
  c.train.num_steps, c.train.eval_every, c.train.checkpoint_every = 4, 2, 2
  c.eval.generation_batch = 32
  c.init.sft_config = "configs/sft.py:tiny"


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "grpo"  # the algorithm (rlscale/rl/algorithm.py): grpo | ppo | ppo_ewma
  c.seed = 0  # every random draw of the run derives from it
  common.arithmetic_default(c)  # model, mesh, task: those of the cached base policy

  c.init = common.init()
  c.rollout = common.rollout(max_new_tokens=6)  # answers need <= 4 tokens with EOS
  c.rl = common.rl(num_prompts=64, group_size=8)
  c.rl.advantage = "grpo"  # grpo (std-normalized) | dr_grpo (mean only) | rloo

  c.optim = common.optim(lr=1e-4)
  c.optim.b2 = 0.99  # RL gradients are noisy and non-stationary: a shorter second-moment memory
  c.optim.reference_batch = 512  # lr was tuned at 512 responses per optimizer step (P=64, G=8)
  c.noise = common.noise_scale()
  c.target = common.target("eval/accuracy_greedy", 0.6)

  c.train = common.run(num_steps=200)
  c.eval = common.evaluation()
  common.apply_arg(c, arg, {"tiny": tiny}, common.ALIASES)
  return c


def sweeps(arg: str | None = None) -> dict[str, list[dict]]:
  """Named sweeps for launch/sweep.py: lists of overrides (rlscale/sweep/axes.py).

  Every batch comparison runs each point for the same number of responses, evaluated at the
  same responses_seen. With `tiny` in the argument, the same sweeps at the tiny shape.
  """
  tiny = "tiny" in (arg or "").split(",")
  equal = sw.fixed(responses=512 if tiny else 131072)
  evals = {"train.eval_every_responses": [128 if tiny else 16384]}
  seeds = {"seed": [0, 1] if tiny else [0, 1, 2]}
  prompts = [4, 8, 16] if tiny else [8, 16, 32, 64, 128, 256, 512, 1024]
  # P x G of (P, G) pairs with equal responses per step.
  pairs = {"p": [16, 8, 4], "g": [4, 8, 16]} if tiny else {"p": [128, 64, 32], "g": [4, 8, 16]}
  return {
      # Curves against responses: where does invariance break, with and without the lr rule?
      "batch_invariance": sw.product({"p": prompts}, sw.fixed(g=8),
                                     {"optim.lr_scaling": ["sqrt", "none"]}, seeds, equal, evals),
      # Equal P x G: does only the product matter (Hunyuan: (128, 8) ~ (64, 16))?
      "group_vs_prompts": sw.product(pairs, {"optim.lr_scaling": ["sqrt"]}, seeds, equal, evals),
      # Overlapped generation (one step off-policy) against on-policy: responses and time to
      # target at each P (split it over devices with mesh.roles='split' to gain time).
      "overlap": sw.product({"rollout.max_staleness": [0, 1]}, {"p": prompts[:3]},
                            sw.fixed(g=8), seeds, equal, evals),
      # The staleness bound k against the batch: does training on responses up to k updates
      # old cost responses to target, and does it move where invariance breaks?
      "staleness": sw.product({"rollout.max_staleness": [0, 1, 2, 4, 8]}, {"p": prompts[:3]},
                              sw.fixed(g=8), seeds, equal, evals),
      # Dynamic sampling (groups of equal rewards dropped and refilled) against none at three
      # P: responses to target against generated and trained responses, nominal and effective B.
      "dynamic_sampling": sw.product({"rollout.dynamic_sampling": [False, True]},
                                     {"p": prompts[1:4]}, sw.fixed(g=8),
                                     {"optim.lr_scaling": ["sqrt"]},
                                     {"seed": [0, 1, 2]}, equal, evals),
      # Throughput against the generation batch; the learning is the same at every point.
      "generation_batch": sw.product(
          {"rollout.generation_batch": [4, 8, 16] if tiny else [32, 64, 128, 256, 512]},
          sw.fixed(steps=4 if tiny else 50)),
  }

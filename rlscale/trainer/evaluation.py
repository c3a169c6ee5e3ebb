"""Held-out evaluation: accuracy of greedy and of sampled (temperature 1) responses.

The sampled accuracy is the policy's expected reward on the held-out set (the RL objective);
the greedy one flips as soon as the right token becomes the mode, often in a few steps.
"""

from __future__ import annotations

import numpy as np
import jax
from flax import nnx
from jax.experimental import multihost_utils

from rlscale.parallel import distributed
from rlscale.trainer import rollout
from rlscale.parallel import sharding
from rlscale.sampling import Sampler, SamplingParams, generate
from rlscale.tasks.base import Task


class Evaluator:
  """Scores the policy on the task's fixed held-out set, split over processes."""

  def __init__(self, task: Task, graphdef: nnx.GraphDef, mesh, rules, *, max_new_tokens: int,
               generation_batch: int, decode_chunk: int = 64, sampled: bool = True,
               greedy: bool = True):
    self.task = task
    eos, pad = task.tokenizer.eos_ids, task.tokenizer.pad_id
    common = dict(max_new_tokens=max_new_tokens, eos_ids=eos, pad_id=pad, decode_chunk=decode_chunk)
    temperatures = {"greedy": 0.0} if greedy else {}
    if sampled:
      temperatures["sampled"] = 1.0
    self.samplers = {name: Sampler(graphdef, SamplingParams(temperature=t, **common), mesh, rules)
                     for name, t in temperatures.items()}
    problems = task.eval_problems()
    self.num = len(problems)
    # Pad the set to whole generation batches split evenly over processes and batch shards;
    # a call never holds more rows than the set needs (8 problems decode 8 rows, not 512).
    unit = sharding.batch_divisor(mesh, rules) * jax.process_count()
    self.gb = max(unit, min(generation_batch, -(-self.num // unit) * unit) // unit * unit)
    total = -(-self.num // self.gb) * self.gb
    padded = problems + [problems[0]] * (total - self.num)
    rows = distributed.process_rows(total)
    self.problems = padded[rows]
    self.real = np.arange(rows.start, rows.stop) < self.num
    self.tokens, self.mask = rollout.prompts(task, self.problems)
    self.eos = eos

  def __call__(self, state: nnx.State, key: jax.Array) -> dict[str, float]:
    out = {}
    for name, sampler in self.samplers.items():
      r = generate(sampler, state, self.tokens, self.mask, key, self.gb)
      toks, mask = rollout.host_rollout(r)
      rewards, correct, finished = rollout.score(self.task, self.problems, toks, mask, self.eos)
      sums = np.array([correct[self.real].sum(), rewards[self.real].sum(),
                       mask.sum(axis=1)[self.real].sum(), finished[self.real].sum()], np.float64)
      if jax.process_count() > 1:
        sums = np.asarray(multihost_utils.process_allgather(sums)).sum(axis=0)
      out[f"eval/accuracy_{name}"] = sums[0] / self.num
      out[f"eval/reward_{name}"] = sums[1] / self.num
      out[f"eval/response_len_{name}"] = sums[2] / self.num
      out[f"eval/finished_{name}"] = sums[3] / self.num
    return out

"""Held-out evaluation: accuracy of greedy and of sampled (temperature 1) responses, and the
likelihood of reference responses.

The sampled accuracy is the policy's expected reward on the held-out set (the RL objective);
the greedy one flips as soon as the right token becomes the mode, often in a few steps. With
`reference`, each held-out problem's reference response (Task.reference_response, EOS included)
is scored teacher-forced: eval/reference_logprob is the mean over problems of its summed log p,
eval/reference_prob the mean of its probability, the chance that a temperature-1 response is
exactly it: a lower bound on the sampled accuracy when the reference is the one right answer's
usual form, and free of sampling noise (one forward pass, no draw).
"""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils

from rlscale.parallel import distributed
from rlscale.trainer import rollout
from rlscale.parallel import sharding
from rlscale.sampling import Sampler, SamplingParams, generate
from rlscale.tasks.base import Task, right_pad, turn_end_id


class Evaluator:
  """Scores the policy on the task's fixed held-out set, split over processes."""

  def __init__(self, task: Task, graphdef: nnx.GraphDef, mesh, rules, *, max_new_tokens: int,
               generation_batch: int, decode_chunk: int = 64, sampled: bool = True,
               greedy: bool = True, reference: bool = False, logprob_chunk: int = 0):
    self.task, self.graphdef, self.mesh, self.rules = task, graphdef, mesh, rules
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
    self.reference = (self._reference_rows(problems, max_new_tokens, logprob_chunk) if reference
                      else None)

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
    if self.reference is not None:
      out.update(self._reference_scores(state))
    return out

  def _reference_rows(self, problems, max_new_tokens: int, chunk: int):
    """(tokens, mask) of prompt + reference response + EOS for this process's rows, and the
    jitted sum of the response's log-probs per row. The length is the whole held-out set's
    longest reference (`problems`, every process's), so every process pads alike."""
    tok = self.task.tokenizer

    def encode(p):
      return tok.encode(self.task.reference_response(p)) + [turn_end_id(tok)]

    n = max(len(encode(p)) for p in problems)
    answers = [encode(p) for p in self.problems]
    if n > max_new_tokens:
      logging.warning("eval.reference: reference responses of up to %d tokens exceed "
                      "rollout.max_new_tokens=%d; scored whole", n, max_new_tokens)
    resp, resp_mask = right_pad(answers, n, tok.pad_id)
    tokens = np.concatenate([self.tokens, resp], axis=1)
    mask = np.concatenate([self.mask, resp_mask], axis=1)
    graphdef, mesh, rules = self.graphdef, self.mesh, self.rules

    def summed(state, tokens_BxT, mask_BxT):
      with sharding.activation_sharding(mesh, rules):  # vocabulary chunks: no [B, n, V] logits
        lp = nnx.merge(graphdef, state).response_logprobs(tokens_BxT, mask_BxT, n, chunk)[0]
      return jnp.sum(jnp.where(mask_BxT[:, -n:], lp, 0.0), axis=1)

    return tokens, mask, jax.jit(summed, out_shardings=sharding.batch_sharding(mesh, 1, rules))

  def _reference_scores(self, state: nnx.State) -> dict[str, float]:
    tokens, mask, summed = self.reference
    take = self.gb // jax.process_count()  # this process's rows per call, as in the decode
    # Every call dispatched before the first fetch: the device never waits on the host.
    calls = [summed(state, sharding.put_batch(tokens[i:i + take], self.mesh, self.rules),
                    sharding.put_batch(mask[i:i + take], self.mesh, self.rules))
             for i in range(0, len(tokens), take)]
    logp = np.concatenate([np.asarray(distributed.host_local(c)) for c in calls])
    logp = logp[self.real].astype(np.float64)
    sums = np.array([logp.sum(), np.exp(logp).sum()])
    if jax.process_count() > 1:
      sums = np.asarray(multihost_utils.process_allgather(sums)).sum(axis=0)
    return {"eval/reference_logprob": sums[0] / self.num, "eval/reference_prob": sums[1] / self.num}

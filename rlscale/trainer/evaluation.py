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

import dataclasses
import math

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


@dataclasses.dataclass(frozen=True)
class Stop:
  """An evaluation in stages (eval.adaptive): rows [0, n1), then up to n2 = 2 n1, 4 n1, ...,
  the whole set; it stops after the first stage whose `metric` (eval/accuracy_sampled, say)
  lies more than z standard errors (of a rate equal to `target`, on the rows scored) from
  `target`. `first_only`: the first stage alone (the run has reached its target: no later
  evaluation can move its crossing); runs side by side give it per lane, each lane's own."""
  metric: str
  target: float
  z: float = 2.0
  first_only: bool | tuple[bool, ...] = False


def is_settled(hits: float, rows: float, target: float, z: float) -> bool:
  """An evaluation in stages may stop: `hits` of `rows` lie more than z standard errors of a
  rate equal to `target` (binomial, on `rows`) from it, on either side."""
  return abs(hits / rows - target) > z * math.sqrt(target * (1 - target) / rows)


class Evaluator:
  """Scores the policy on the task's fixed held-out set, split over processes.

  A row's sample depends only on the evaluation's key and the row's index in the set, so
  the first n rows of an evaluation in stages score exactly what the whole set's evaluation
  scores on them. With `lanes` (runs side by side) the state and the key carry the lane axis,
  and the result is a list with each lane's metrics.
  """

  def __init__(self, task: Task, graphdef: nnx.GraphDef, mesh, rules, *, max_new_tokens: int,
               generation_batch: int, decode_chunk: int = 64, sampled: bool = True,
               greedy: bool = True, reference: bool = False, logprob_chunk: int = 0,
               lanes=None):
    self.task, self.graphdef, self.mesh, self.rules = task, graphdef, mesh, rules
    self.lanes = lanes
    eos, pad = task.tokenizer.eos_ids, task.tokenizer.pad_id
    common = dict(max_new_tokens=max_new_tokens, eos_ids=eos, pad_id=pad, decode_chunk=decode_chunk)
    temperatures = {"greedy": 0.0} if greedy else {}
    if sampled:
      temperatures["sampled"] = 1.0
    self.samplers = {name: Sampler(graphdef, SamplingParams(temperature=t, **common), mesh, rules,
                                   lanes)
                     for name, t in temperatures.items()}
    problems = task.eval_problems()
    self.num = len(problems)
    # Pad the set to whole generation batches split evenly over processes and batch shards;
    # a call never holds more rows than the set needs (8 problems decode 8 rows, not 512).
    unit = sharding.batch_divisor(mesh, rules) * jax.process_count()
    self.gb = max(unit, min(generation_batch, -(-self.num // unit) * unit) // unit * unit)
    total = -(-self.num // self.gb) * self.gb
    self.padded = problems + [problems[0]] * (total - self.num)
    rows = distributed.process_rows(total)
    self.problems = self.padded[rows]
    self.real = np.arange(rows.start, rows.stop) < self.num
    self.tokens, self.mask = rollout.prompts(task, self.problems)
    self.eos = eos
    self.reference = (self._reference_rows(problems, max_new_tokens, logprob_chunk) if reference
                      else None)
    self._stage_prompts = None  # every row's prompt, made on the first evaluation in stages

  def __call__(self, state: nnx.State, key: jax.Array, stop: Stop | None = None):
    """The metrics of the whole set, or of the stages `stop` asks for (then eval/rows says how
    many problems they rest on); a list of them for lanes."""
    if stop is not None:
      return self._staged(state, key, stop)
    out = [{} for _ in range(len(self.lanes or [0]))]
    for name, sampler in self.samplers.items():
      r = generate(sampler, state, self.tokens, self.mask, key, self.gb)
      toks, mask = rollout.host_rollout(r)
      for lane, (t, m) in enumerate(self._per_lane(toks, mask)):
        sums = self._sums(self.problems, t, m, self.real)
        if jax.process_count() > 1:
          sums = np.asarray(multihost_utils.process_allgather(sums)).sum(axis=0)
        out[lane].update(_metrics(name, sums, self.num))
    if self.reference is not None:
      if self.lanes is not None:
        raise ValueError("eval.reference is not scored for runs side by side")
      out[0].update(self._reference_scores(state))
    return out if self.lanes is not None else out[0]

  def _per_lane(self, toks, mask):
    return [(toks, mask)] if self.lanes is None else list(zip(toks, mask))

  def _sums(self, problems, toks, mask, real) -> np.ndarray:
    """[correct, reward, response tokens, finished, rows] summed over the real rows."""
    rewards, correct, finished = rollout.score(self.task, problems, toks, mask, self.eos)
    return np.array([correct[real].sum(), rewards[real].sum(), mask.sum(axis=1)[real].sum(),
                     finished[real].sum(), real.sum()], np.float64)

  def stages(self) -> list[int]:
    """The rows scored after each stage of an evaluation in stages: whole generation batches,
    doubling, the last the whole (padded) set."""
    total, out, n = len(self.padded), [], self.gb
    while n < total:
      out.append(n)
      n *= 2
    return out + [total]

  def _staged(self, state, key, stop: Stop):
    """Stages of rows [0, n1), [n1, n2), ... each decoded whole (every process its share of
    each call's rows), until every lane's `stop.metric` is settled."""
    name = stop.metric.rpartition("_")[2]
    if stop.metric not in (f"eval/accuracy_{n}" for n in self.samplers):
      raise ValueError(f"an evaluation in stages needs {stop.metric} among the evaluation's "
                       f"metrics ({', '.join(f'eval/accuracy_{n}' for n in self.samplers)})")
    if self._stage_prompts is None:
      self._stage_prompts = rollout.prompts(self.task, self.padded)
    tokens, mask = self._stage_prompts
    real_all = np.arange(len(self.padded)) < self.num
    lanes = len(self.lanes or [0])
    sums = {n: np.zeros((lanes, 5)) for n in self.samplers}
    settled = [None] * lanes  # each lane's sums when its metric settled
    start = 0
    first = (tuple(stop.first_only) if isinstance(stop.first_only, (tuple, list))
             else (bool(stop.first_only),) * lanes)
    if len(first) != lanes:
      raise ValueError(f"an evaluation in stages of {lanes} lanes got first_only for "
                       f"{len(first)}")
    stages = self.stages()[:1] if all(first) else self.stages()
    for end in stages:
      active = [s is None for s in settled]  # a lane that settled decodes no further
      for n, sampler in self.samplers.items():
        part = self._decode_rows(sampler, state, key, tokens, mask, start, end,
                                 None if self.lanes is None else active)
        for lane, (t, m) in enumerate(self._per_lane(*part)):
          if not active[lane]:
            continue
          rows = self._process_share(start, end)
          s = self._sums([self.padded[i] for i in rows], t, m, real_all[rows])
          if jax.process_count() > 1:
            s = np.asarray(multihost_utils.process_allgather(s)).sum(axis=0)
          sums[n][lane] += s
      start = end
      for lane in range(lanes):
        s = sums[name][lane]
        if settled[lane] is None and (end == stages[-1] or first[lane] or
                                      is_settled(s[0], s[4], stop.target, stop.z)):
          settled[lane] = {n: sums[n][lane].copy() for n in self.samplers}
      if all(x is not None for x in settled):
        break
    out = []
    for lane in range(lanes):
      m = {}
      for n in self.samplers:
        m.update(_metrics(n, settled[lane][n], settled[lane][n][4]))
      m["eval/rows"] = int(settled[lane][name][4])
      out.append(m)
    return out if self.lanes is not None else out[0]

  def _process_share(self, start: int, end: int) -> range:
    """This process's rows of global rows [start, end): an equal contiguous share of each
    call of `gb` rows."""
    procs, me = jax.process_count(), jax.process_index()
    take = self.gb // procs
    return [i for call in range(start, end, self.gb)
            for i in range(call + me * take, call + (me + 1) * take)]

  def _decode_rows(self, sampler, state, key, tokens, mask, start: int, end: int,
                   active=None):
    rows = self._process_share(start, end)
    r = generate(sampler, state, tokens[rows], mask[rows], key, self.gb,
                 row_ids=np.asarray(rows, np.int32), active=active)
    return rollout.host_rollout(r)

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


def _metrics(name: str, sums: np.ndarray, n: float) -> dict[str, float]:
  return {f"eval/accuracy_{name}": sums[0] / n, f"eval/reward_{name}": sums[1] / n,
          f"eval/response_len_{name}": sums[2] / n, f"eval/finished_{name}": sums[3] / n}

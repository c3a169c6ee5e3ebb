"""From problems to a training batch: prompts, sampling, scoring, the sequence batch."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rlscale.parallel import distributed
from rlscale.parallel import roles
from rlscale.parallel import sharding
from rlscale.rl.update import SequenceBatch
from rlscale.sampling import Rollout
from rlscale.tasks.base import INVALID, TIMEOUT, Problem, Task, left_pad

# Responses scored 0 without a verdict (Score.failure), counted per step over every process.
FAILURE_METRICS = {TIMEOUT: "reward/grader_timeouts", INVALID: "reward/invalid"}


def prompts(task: Task, problems: Sequence[Problem], group_size: int = 1):
  """Left-padded prompt tokens and mask, each problem repeated `group_size` times in a row."""
  rows = [task.prompt_ids(p) for p in problems for _ in range(group_size)]
  return left_pad(rows, task.max_prompt_len, task.tokenizer.pad_id)


def score(task: Task, problems: Sequence[Problem], tokens: np.ndarray, mask: np.ndarray,
          eos_ids: Sequence[int]):
  """rewards [B] float32, correct [B] bool, finished [B] bool for host-side responses.

  `problems[i]` is row i's problem. A response is finished when its last token is an EOS.
  """
  lengths = mask.sum(axis=1)
  rewards = np.zeros(len(problems), np.float32)
  correct = np.zeros(len(problems), bool)
  finished = np.zeros(len(problems), bool)
  for i, p in enumerate(problems):
    n = int(lengths[i])
    ids = tokens[i, :n]
    finished[i] = n > 0 and int(ids[-1]) in eos_ids
    s = task.score(ids[:-1] if finished[i] else ids, bool(finished[i]), p)
    rewards[i], correct[i] = s.reward, s.correct
  return rewards, correct, finished


def host_rollout(out: Rollout) -> tuple[np.ndarray, np.ndarray]:
  """This process's rows of the sampled tokens and their mask."""
  return distributed.host_local(out.tokens), distributed.host_local(out.mask)


class Responses(NamedTuple):
  """The rows `sequence_batch` reads of a Rollout."""
  tokens: jax.Array
  mask: jax.Array


def sequence_batch(prompt_tokens, prompt_mask, out: Rollout | Responses, mesh: Mesh,
                   rules) -> SequenceBatch:
  """Prompt and response side by side, on the (trainer's) mesh; the algorithm fills `extras`.
  The responses move there from the sampler's mesh when it has one (roles.to_mesh)."""
  pt = sharding.put_batch(prompt_tokens, mesh, rules)
  pm = sharding.put_batch(prompt_mask, mesh, rules)
  rt, rm = roles.to_mesh([out.tokens, out.mask], mesh, rules)
  tokens = jnp.concatenate([pt, rt], axis=1)
  mask = jnp.concatenate([pm, rm], axis=1)
  return SequenceBatch(tokens, mask, rm, {})


def reward_metrics(rewards, correct, finished, resp_mask, group_size: int) -> dict[str, Any]:
  """The step's reward and response metrics over all processes (this process's rows given)."""
  groups = correct.reshape(-1, group_size)
  lengths = resp_mask.sum(axis=1)
  g_sum, g_mean = distributed.global_sum, distributed.global_mean
  mean = g_mean(rewards)
  std = float(np.sqrt(max(g_mean(np.square(rewards.astype(np.float64))) - mean ** 2, 0.0)))
  return {"reward/mean": mean, "reward/std": std,
          "reward/accuracy": g_mean(correct), "reward/finished": g_mean(finished),
          "reward/solved_groups": g_mean(groups.all(axis=1)),  # every response correct
          "reward/unsolved_groups": g_mean(~groups.any(axis=1)),  # none correct
          "response/length_mean": g_mean(lengths), "response/length_max": int(distributed.global_max(lengths)),
          "response_tokens": int(g_sum(lengths.sum()))}


def failures_now(task: Task) -> dict[str, int]:
  """The task's count of responses scored 0 without a verdict, by why, so far (zeros for a
  task without the counter)."""
  seen = getattr(task, "failures", {})
  return {kind: int(seen.get(kind, 0)) for kind in FAILURE_METRICS}


def failure_metrics(task: Task, before: dict[str, int]) -> dict[str, int]:
  """Responses this process's task scored 0 without a verdict since `before`
  (`failures_now`), summed over every process: reward/grader_timeouts, reward/invalid."""
  now = failures_now(task)
  return {name: int(distributed.global_sum(now[kind] - before[kind]))
          for kind, name in FAILURE_METRICS.items()}


def group_metrics(rewards_GxN, correct, finished, lengths) -> dict[str, Any]:
  """`reward_metrics` of groups every process holds whole (dynamic sampling gathers them):
  [groups, G] arrays of every response generated in the step."""
  r = np.asarray(rewards_GxN, np.float64)
  c = np.asarray(correct, bool)
  return {"reward/mean": float(r.mean()), "reward/std": float(r.std()),
          "reward/accuracy": float(c.mean()), "reward/finished": float(np.mean(finished)),
          "reward/solved_groups": float(c.all(axis=1).mean()),
          "reward/unsolved_groups": float((~c.any(axis=1)).mean()),
          "response/length_mean": float(np.mean(lengths)),
          "response/length_max": int(np.max(lengths)), "response_tokens": int(np.sum(lengths))}


class Scored(NamedTuple):
  """A step's responses scored on the host: this process's rows."""
  rewards: np.ndarray  # [B] float32
  plen: np.ndarray  # [B] prompt tokens
  rlen: np.ndarray  # [B] response tokens
  metrics: dict[str, Any]  # reward_metrics and train_tokens, over every process
  informative: int  # groups whose rewards differ, over every process
  fractions: dict[str, float]  # why the others carry no signal (group-relative algorithms)


def score_step(task: Task, problems: Sequence[Problem], group_size: int, tokens: np.ndarray,
               resp_mask: np.ndarray, prompt_mask: np.ndarray,
               group_relative: bool) -> Scored:
  """Score a step's responses (G per problem, in order) and its host metrics."""
  from rlscale.trainer import group_filter
  repeated = [p for p in problems for _ in range(group_size)]
  before = failures_now(task)
  rewards, correct, finished = score(task, repeated, tokens, resp_mask, task.tokenizer.eos_ids)
  metrics = reward_metrics(rewards, correct, finished, resp_mask, group_size)
  metrics.update(failure_metrics(task, before))
  plen, rlen = prompt_mask.sum(axis=1), resp_mask.sum(axis=1)
  metrics["train_tokens"] = int(distributed.global_sum(rlen.sum() + plen.sum()))
  codes = group_filter.group_signal(rewards.reshape(-1, group_size),
                                    correct.reshape(-1, group_size))
  informative = int(distributed.global_sum(np.sum(codes == group_filter.INFORMATIVE)))
  fractions = {}  # a critic-based algorithm learns from groups of equal rewards too
  if group_relative:
    fractions = {k: distributed.global_mean(v)
                 for k, v in group_filter.reason_fractions(codes).items()}
  return Scored(rewards, plen, rlen, metrics, informative, fractions)


def advance(counters: dict[str, Any], plan, generated: int, trained: int, effective: int,
            tokens: int, fractions: dict[str, float], rounds: int) -> dict[str, Any]:
  """A step's sample axis: the counters advanced (responses generated, which time to target
  counts; trained; tokens) and its metrics, with the effective batch (informative responses
  per optimizer step)."""
  counters["responses_seen"] += generated
  counters["responses_trained"] += trained
  counters["tokens_seen"] += tokens
  return {"rollout/responses_generated": generated, "rollout/responses_trained": trained,
          "rollout/effective_responses": effective,
          "rollout/effective_batch": plan.effective_batch(effective),
          "rollout/rounds": rounds, **fractions}

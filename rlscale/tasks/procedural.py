"""What the embedded tasks share: problems drawn from seeded generators, a held-out set of
distinct problems, training problems that never repeat a held-out one, character prompts."""

from __future__ import annotations

import abc
import functools

import numpy as np

from rlscale.tasks.base import Problem, Task

_TRAIN, _EVAL = 0, 1


class Procedural(Task):
  """A task whose problems come from `_draw(rng)`; subclasses set seed, num_eval, tokenizer."""

  seed: int
  num_eval: int

  @abc.abstractmethod
  def _draw(self, rng: np.random.Generator) -> Problem:
    """One problem from `rng`."""

  @functools.cached_property
  def _eval(self) -> list[Problem]:
    out, seen, i = [], set(), 0
    while len(out) < self.num_eval and i < 50 * self.num_eval:
      p = self._draw(np.random.default_rng([self.seed, _EVAL, i]))
      i += 1
      if p.question not in seen:
        seen.add(p.question)
        out.append(p)
    return out

  @functools.cached_property
  def _eval_questions(self) -> frozenset[str]:
    return frozenset(p.question for p in self._eval)

  def problem(self, index: int) -> Problem:
    """Training problem `index`; problems of the held-out set are skipped."""
    for attempt in range(1000):
      p = self._draw(np.random.default_rng([self.seed, _TRAIN, index, attempt]))
      if p.question not in self._eval_questions:
        return p
    raise RuntimeError("task: the held-out set covers the whole problem space; lower num_eval")

  def eval_problems(self) -> list[Problem]:
    return list(self._eval)

  def prompt_ids(self, problem: Problem) -> list[int]:
    return self.tokenizer.encode(problem.question, add_special_tokens=True)

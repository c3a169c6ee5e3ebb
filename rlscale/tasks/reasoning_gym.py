"""Procedural problems from reasoning-gym (optional extra: pip install 'rlscale[reasoning]').

Only its generators are used. Its own scorers are not: several of them call `eval` on the
model's answer, and model text is never evaluated here. Responses are scored by comparing the
final (boxed) answer with the reference, numbers by value.
"""

from __future__ import annotations

from typing import Any, Mapping

from rlscale.tasks.base import Problem, Tokenizer
from rlscale.tasks.text import TextTask


class ReasoningGym(TextTask):
  def __init__(self, cfg: Mapping[str, Any], tokenizer: Tokenizer):
    super().__init__(cfg, tokenizer)
    try:
      import reasoning_gym
    except ImportError:
      raise ImportError("task.name='reasoning_gym' needs reasoning-gym: "
                        "pip install 'rlscale[reasoning]'") from None
    name, size = cfg["rg_dataset"], int(cfg["rg_size"])
    self._train = reasoning_gym.create_dataset(name, size=size, seed=self.seed)
    self._test = reasoning_gym.create_dataset(name, size=4 * self.num_eval, seed=self.seed + 10**6)
    self._train_size = size
    self._held_out = {e["question"] for e in self._test}

  @staticmethod
  def _problem(entry) -> Problem:
    return Problem(str(entry["question"]), str(entry["answer"]).strip())

  def _train_item(self, i: int) -> Problem:
    p = self._problem(self._train[i])
    # A training question that is also held out is replaced by its neighbour.
    return p if p.question not in self._held_out else self._problem(self._train[(i + 1) % self._train_size])

  def _eval_items(self) -> list[Problem]:
    return [self._problem(e) for e in self._test]

"""The embedded default task: procedurally generated integer arithmetic, no download.

Prompt `<bos>123+45=`, answer `168<eos>`. Operands have 1 to `digits` digits (the difficulty
knob); a product's second factor has at most `mul_digits`. Subtraction keeps a >= b.
"""

from __future__ import annotations

import functools

import numpy as np

from rlscale.tasks.base import Problem, Score, Task
from rlscale.tasks.char_tokenizer import CharTokenizer
from rlscale.tasks.verifiers import exact_integer

ALPHABET = "0123456789+-*="
_TRAIN, _EVAL = 0, 1


class Arithmetic(Task):
  def __init__(self, digits: int = 3, ops: str = "+-*", mul_digits: int = 1, num_eval: int = 500,
               seed: int = 0):
    if digits < 1 or mul_digits < 1:
      raise ValueError(f"task: digits={digits} and mul_digits={mul_digits} must be >= 1")
    if not ops or set(ops) - set("+-*"):
      raise ValueError(f"task.ops={ops!r}: use a non-empty subset of '+-*'")
    self.digits, self.ops, self.mul_digits = digits, ops, mul_digits
    self.num_eval, self.seed = num_eval, seed
    self.tokenizer = CharTokenizer(ALPHABET)
    self.max_prompt_len = 1 + 2 * digits + 2  # <bos> a op b =
    largest = max(2 * 10**digits if "+" in ops else 10**digits,
                  10**(digits + mul_digits) if "*" in ops else 0)
    self.max_answer_len = len(str(largest)) + 1  # digits and <eos>

  def _draw(self, rng: np.random.Generator) -> Problem:
    op = self.ops[rng.integers(len(self.ops))]
    def operand(max_digits):
      d = int(rng.integers(1, max_digits + 1))
      return int(rng.integers(0 if d == 1 else 10**(d - 1), 10**d))
    a = operand(self.digits)
    b = operand(self.mul_digits if op == "*" else self.digits)
    if op == "-" and b > a:
      a, b = b, a
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return Problem(f"{a}{op}{b}=", str(value))

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

  def demonstration(self, problem: Problem) -> str:
    return problem.answer

  def verify(self, response: str, problem: Problem) -> Score:
    ok = exact_integer(response, problem.answer)
    return Score(float(ok), ok)

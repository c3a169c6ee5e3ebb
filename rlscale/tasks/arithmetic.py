"""The embedded default task: procedurally generated integer arithmetic, no download.

Prompt `<bos>123+45=`, answer `168<eos>`. Operands are uniform below 10**digits (the difficulty
knob); a product's second factor is below 10**mul_digits. Subtraction keeps a >= b.
The reward is 1 for the exact answer and, with `partial_credit`, up to 0.5 for an integer
with some place values right (verifiers.digit_credit); `correct` is always exact.

Demonstrations for the base policy come in two styles: the bare answer (`168`) and, for a
`restate` share of problems, the whole equation (`123+45=168`). The verifier accepts only the
bare integer, so a base trained on the mix often answers in the rejected style: the format
gap that RL closes first on real models, here in miniature.
"""

from __future__ import annotations

import zlib

import numpy as np

from rlscale.tasks.base import Problem, Score
from rlscale.tasks.char_tokenizer import CharTokenizer
from rlscale.tasks.procedural import Procedural
from rlscale.tasks.verifiers import digit_credit, exact_integer

ALPHABET = "0123456789+-*="


class Arithmetic(Procedural):
  def __init__(self, digits: int = 3, ops: str = "+-*", mul_digits: int = 1, num_eval: int = 500,
               seed: int = 0, partial_credit: bool = False, restate: float = 0.0):
    if digits < 1 or mul_digits < 1:
      raise ValueError(f"task: digits={digits} and mul_digits={mul_digits} must be >= 1")
    if not ops or set(ops) - set("+-*"):
      raise ValueError(f"task.ops={ops!r}: use a non-empty subset of '+-*'")
    self.digits, self.ops, self.mul_digits = digits, ops, mul_digits
    if not 0.0 <= restate <= 1.0:
      raise ValueError(f"task.restate={restate} must be in [0, 1]")
    self.num_eval, self.seed, self.partial_credit = num_eval, seed, partial_credit
    self.restate = restate
    self.tokenizer = CharTokenizer(ALPHABET)
    self.max_prompt_len = 1 + 2 * digits + 2  # <bos> a op b =
    largest = max(2 * 10**digits if "+" in ops else 10**digits,
                  10**(digits + mul_digits) if "*" in ops else 0)
    self.max_answer_len = len(str(largest)) + 1  # digits and <eos>
    if restate:
      self.max_answer_len += self.max_prompt_len - 1  # a restated equation

  def _draw(self, rng: np.random.Generator) -> Problem:
    op = self.ops[rng.integers(len(self.ops))]
    a = int(rng.integers(0, 10**self.digits))
    b = int(rng.integers(0, 10**(self.mul_digits if op == "*" else self.digits)))
    if op == "-" and b > a:
      a, b = b, a
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return Problem(f"{a}{op}{b}=", str(value))

  def demonstration(self, problem: Problem) -> str:
    """The bare answer, or for a fixed `restate` share of problems the whole equation."""
    if zlib.crc32(f"{self.seed}:{problem.question}".encode()) < self.restate * 2**32:
      return problem.question + problem.answer
    return problem.answer

  def verify(self, response: str, problem: Problem) -> Score:
    ok = exact_integer(response, problem.answer)
    reward = 1.0 if ok else digit_credit(response, problem.answer) if self.partial_credit else 0.0
    return Score(reward, ok)

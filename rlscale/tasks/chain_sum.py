"""A testbed where RL, not a format switch, makes the gain: chained sums with a scratchpad.

Prompt `<bos>7+5+9+3=`, response `7+5=12;12+9=21;21+3=24<eos>`: the running sum, one
addition per step, written out in full (about 19 tokens with EOS at 4 one-digit terms, at
most 23, so generation is a real share of an RL step). Only the final answer is graded: the
integer after the last `=` (or the whole response when it has none) must be the sum.

Why RL has headroom. The base policy's demonstrations come from two procedures: the right one,
and a systematically flawed one that forgets the carry out of the ones place (`12+9=11`).
Each step of a demonstration that needs that carry drops it with probability `flaw` (a fixed
hash of the question and the step: the demonstrations are a fixed data set, one worked
solution per question), and the chain goes on from the written value, so every line is
internally consistent with one of the two procedures. The base learns the arithmetic and
copies the operands but takes most carries the flawed way, and which way it goes depends on
the context it generalizes from: greedy decoding is often wrong, sampling sometimes carries
at every step that needs it, and pass@8 is far above pass@1. Measured on the held-out set
(configs/sft.py:chain_sum, 600 steps, 4 min 42 s on 2 CPU cores): greedy 14.2%, sampled
pass@1 20.7%, pass@8 44.8%; correct responses are 19.4 tokens long on average (EOS included).
The reward must teach the policy, in every context (first step, two-digit running sums, two
carries in a row), which procedure is right; no output format separates right from wrong
(both procedures write the same shape of text; there is no restated-equation trick to learn).
GRPO (configs/grpo_chain_sum.py) lifts greedy accuracy by 20 points within ~2,600 responses
and levels off near the base's pass@8 (~45%): contexts where the base never carries stay
flawed. `flaw` is the difficulty knob: the higher, the rarer a right chain in sampling.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from rlscale.tasks.base import Problem, Score
from rlscale.tasks.char_tokenizer import CharTokenizer
from rlscale.tasks.procedural import Procedural

ALPHABET = "0123456789+=;"
_INT = re.compile(r"[0-9]{1,12}")


class ChainSum(Procedural):
  def __init__(self, terms: int = 4, digits: int = 1, flaw: float = 0.65, num_eval: int = 500,
               seed: int = 0):
    for name, value, least in (("terms", terms, 2), ("digits", digits, 1),
                               ("num_eval", num_eval, 1), ("seed", seed, 0)):
      if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"task.{name}={value!r} must be an integer >= {least}")
    if isinstance(flaw, bool) or not isinstance(flaw, (int, float)) or not 0.0 <= flaw <= 1.0:
      raise ValueError(f"task.flaw={flaw!r} must be a number in [0, 1] (share of carries the "
                       "demonstrations drop)")
    space = 10 ** (terms * digits)
    if num_eval > space // 2:
      raise ValueError(f"task.num_eval={num_eval} leaves too few training problems: "
                       f"task.terms={terms}, task.digits={digits} give {space} problems; use at "
                       f"most {space // 2}")
    self.terms, self.digits, self.flaw = terms, digits, float(flaw)
    self.num_eval, self.seed = num_eval, seed
    self.tokenizer = CharTokenizer(ALPHABET)
    self.max_prompt_len = 1 + terms * digits + terms  # <bos>, the terms, their + and =
    largest = [10**digits - 1] * terms  # the longest scratchpad (the flawed one is never longer)
    self.max_answer_len = len(self.scratchpad(largest)) + 1  # and <eos>
    # The final sum comes last, so a rollout needs the whole scratchpad (its <eos> may be cut:
    # the grader reads the text)
    self.needs_new_tokens = self.max_answer_len - 1

  # --- problems ---

  def _draw(self, rng: np.random.Generator) -> Problem:
    terms = tuple(int(x) for x in rng.integers(0, 10**self.digits, size=self.terms))
    return Problem("+".join(map(str, terms)) + "=", str(sum(terms)), terms)

  # --- the two procedures ---

  @staticmethod
  def scratchpad(terms, drops=()) -> str:
    """The worked chain; steps in `drops` (0-based) forget the carry out of the ones place."""
    total, lines = terms[0], []
    for i, x in enumerate(terms[1:]):
      s = total + x
      if i in drops and total % 10 + x % 10 >= 10:
        s -= 10
      lines.append(f"{total}+{x}={s}")
      total = s
    return ";".join(lines)

  def demonstration(self, problem: Problem) -> str:
    """The right chain, except that each step needing a ones carry drops it with probability
    `flaw`, fixed per (seed, question, step)."""
    terms = tuple(int(x) for x in problem.question.rstrip("=").split("+"))
    drops = {i for i in range(len(terms) - 1)
             if zlib.crc32(f"{self.seed}:{problem.question}:{i}".encode()) < self.flaw * 2**32}
    return self.scratchpad(terms, drops)

  def reference_response(self, problem: Problem) -> str:
    """The right chain: every carry taken (the demonstrations drop some on purpose)."""
    return self.scratchpad(tuple(int(x) for x in problem.question.rstrip("=").split("+")))

  # --- grading ---

  def verify(self, response: str, problem: Problem) -> Score:
    """1 when the final answer (after the last `=`, else the whole text) is the sum."""
    text = response.strip()
    if len(text) > 4 * self.max_answer_len:
      return Score(0.0, False)
    final = text.rpartition("=")[2].strip()
    ok = bool(_INT.fullmatch(final)) and int(final) == int(problem.answer)
    return Score(1.0 if ok else 0.0, ok)

"""Answer extraction and comparison. Model text is parsed, never evaluated."""

from __future__ import annotations

import re
from fractions import Fraction

_INT = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:/[0-9]+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
MAX_CHARS = 10_000  # longer responses score 0 without being searched


def exact_integer(response: str, answer: str) -> bool:
  """The whole response (stripped) is the integer `answer`."""
  text = response.strip()
  if len(text) > 40 or not _INT.fullmatch(text):
    return False
  return int(text) == int(answer)


def digit_credit(response: str, answer: str, weight: float = 0.5) -> float:
  """Partial credit for a wrong integer: `weight` times the share of place values right.

  Digits are compared by place value (ones with ones, tens with tens); the share is over the
  longer of the two numbers, so extra or missing digits cost. Anything that is not a plain
  integer, or has the wrong sign, gets 0; the exact answer gets 1.
  """
  text = response.strip()
  if len(text) > 40 or not _INT.fullmatch(text):
    return 0.0
  if int(text) == int(answer):
    return 1.0
  a, b = text.lstrip("+"), answer.lstrip("+")
  if a.startswith("-") != b.startswith("-"):
    return 0.0
  a, b = a.lstrip("-")[::-1], b.lstrip("-")[::-1]
  same = sum(x == y for x, y in zip(a, b))
  return weight * same / max(len(a), len(b))


def parse_number(text: str) -> Fraction | None:
  """An integer, decimal or fraction written plainly ('12', '-0.5', '3/4'), else None."""
  text = text.strip().replace(",", "")
  if len(text) > 60 or not _NUMBER.fullmatch(text):
    return None
  try:
    if "/" in text:
      num, den = text.split("/")
      return Fraction(Fraction(num), int(den)) if int(den) else None
    return Fraction(text)
  except (ValueError, ZeroDivisionError):
    return None


def final_answer(response: str) -> str | None:
  """The answer a free-form response commits to: the last \\boxed{...}, else the last number."""
  if len(response) > MAX_CHARS:
    return None
  boxed = _BOXED.findall(response)
  if boxed:
    return boxed[-1].strip()
  numbers = _NUMBER.findall(response.replace(",", ""))
  return numbers[-1] if numbers else None


def same_answer(candidate: str | None, reference: str) -> bool:
  """Numbers compare by value, anything else by normalized text."""
  if candidate is None:
    return False
  a, b = parse_number(candidate), parse_number(reference)
  if a is not None and b is not None:
    return a == b
  norm = lambda s: " ".join(s.strip().lower().rstrip(".").split())
  return norm(candidate) == norm(reference)

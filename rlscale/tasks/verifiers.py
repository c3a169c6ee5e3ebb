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

"""Answer extraction and comparison. Model text is parsed, never evaluated.

`final_answer` + `same_answer` are the "numeric" grader of old runs and stay as they were. The
extraction below (`extract_answer`, `reference_answer`, `canonical_number`) feeds the graders of
rlscale/tasks/graders.py: every scan is a linear pass or a regex whose repetitions cannot trade
characters between them (none nested, none side by side over the same characters), so a long
or hostile response costs time linear in its length (tests/unit/tasks/test_graders.py times
hostile shapes at the graders' cap).
"""

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
  return normalize_text(candidate) == normalize_text(reference)


def normalize_text(text: str) -> str:
  """Lower case, one space between words, no trailing period: the form exact answers compare."""
  return " ".join(text.strip().lower().rstrip(".").split())


# --- extraction for the graders (rlscale/tasks/graders.py) ---
_BOX_COMMANDS = ("\\boxed", "\\fbox")
# "#### 72" (GSM8K), "The answer is 5", "Final answer: 5", "**Answer:** 5", "Answer is: 5".
# The space around the stars splits one way only: `\s*\**\s*` read "answer" and 20,000 spaces in
# 15 s, trying every split.
_ANCHOR = re.compile(r"####|\b(?:final\s+)?answer\b(?:\s*(?:\*+\s*)?(?:is\b\s*:?|[:：]))", re.I)
_HOPE = ("i hope it is correct.", "i hope it is correct")  # Minerva's closing line
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))
_LAST_NUMBER = re.compile(
    r"(?<![\w.])-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?:/[0-9]+)?(?:\s*%)?")
_SEPARATOR = r"(?:,|\\,|\{,\}|\s)"
# A number as written in an answer: currency sign, thousands separators, then % or unit words.
_PLAIN = re.compile(
    r"(?:\\?\$|[€£¥])?\s*(?P<num>[+-]?(?:[0-9]{1,3}(?:" + _SEPARATOR + r"[0-9]{3})+|[0-9]+)"
    r"(?:\.[0-9]+)?)\s*(?P<tail>\\?%|(?:[A-Za-z]{2,}(?![A-Za-z])\.?\s*)*)")
_MATH_WORDS = {"pi", "sqrt", "frac", "infty", "cdot", "times", "and", "or", "to"}
_PERCENT_WORDS = {"percent", "percentage", "pct"}
_RATIONAL = re.compile(r"[+-]?[0-9]{1,60}(?:\.[0-9]{1,60})?(?:/[0-9]{1,60})?")
_INTEGER = re.compile(r"[+-]?[0-9]{1,60}")


def last_boxed(text: str) -> str | None:
  """The content of the last \\boxed{...} or \\fbox{...}, nested braces balanced (an escaped
  \\{ or \\} is content), or of the short form '\\boxed 5'; None when there is no box or the
  last one never closes (a truncated answer is no answer)."""
  start = max(text.rfind(c) for c in _BOX_COMMANDS)
  if start < 0:
    return None
  i = start + (6 if text.startswith("\\boxed", start) else 5)
  if text[i:i + 1] == " ":
    words = text[i:].split(None, 1)
    return words[0].split("$")[0] if words else None
  if text[i:i + 1] != "{":
    return None
  depth, j = 0, i
  while j < len(text):
    c = text[j]
    if c == "\\":
      j += 2
      continue
    depth += (c == "{") - (c == "}")
    if depth == 0:
      return text[i + 1:j]
    j += 1
  return None


def anchored_answer(text: str) -> str | None:
  """What follows the last answer anchor ("####", "The answer is", "Final answer:", "Answer:")
  on the last line holding one, or the next line when nothing follows it on its own."""
  lines = [line for line in text.splitlines() if line.strip()]
  for k in range(len(lines) - 1, -1, -1):
    anchors = list(_ANCHOR.finditer(lines[k]))
    if anchors:
      rest = lines[k][anchors[-1].end():]
      if not strip_answer(rest) and k + 1 < len(lines):
        rest = lines[k + 1]
      return rest
  return None


def strip_answer(text: str) -> str:
  """An answer without what surrounds it in prose: 'I hope it is correct', a sentence after
  it, markdown bold, $...$ or \\(...\\) delimiters and trailing punctuation."""
  text = text.strip()
  for hope in _HOPE:
    if text.lower().endswith(hope):
      text = text[:-len(hope)].strip()
  cut = text.find(". ")
  if cut > 0:
    text = text[:cut]
  text = text.strip().rstrip(".,;:!").strip()
  for left, right in _DELIMITERS:
    if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
      text = text[len(left):-len(right)].strip()
  return text.strip("*").strip().rstrip(".").strip()


def extract_answer(response: str, last_number: bool = True) -> str | None:
  """The answer a response commits to: the last box, else the last <answer> tag, else the
  anchored final-line answer, else (`last_number`) the last number of the last line or (not
  `last_number`) the whole stripped response. None when there is none."""
  boxed = last_boxed(response)
  if boxed is not None:
    return strip_answer(boxed)
  if max(response.rfind(c) for c in _BOX_COMMANDS) >= 0:
    return None  # the last box never closes
  found = answer_tag(response)
  if found is None:
    found = anchored_answer(response)
  if found is not None:
    return strip_answer(found)
  if not last_number:
    return response.strip()
  lines = [line for line in response.splitlines() if line.strip()]
  numbers = _LAST_NUMBER.findall(lines[-1]) if lines else []
  return numbers[-1].replace(",", "") if numbers else None


def answer_tag(response: str) -> str | None:
  """The content of the last <answer>...</answer> (R1-style formats), None without one."""
  start = response.rfind("<answer>")
  end = response.find("</answer>", start)
  return response[start + 8:end] if start >= 0 and end >= 0 else None


def reference_answer(reference: str) -> str:
  """The answer of a reference: after its last '####' (GSM8K solutions), else its last box,
  else the whole text; stripped as model answers are."""
  if "####" in reference:
    return strip_answer(reference.rsplit("####", 1)[1])
  boxed = last_boxed(reference)
  return strip_answer(boxed if boxed is not None else reference)


def canonical_number(answer: str) -> str:
  """A plain number written with a currency sign, thousands separators ('1,000', '1\\,000',
  '1 000') or unit words ('18 dollars') as digits alone ('1000', '18'; a percent sign stays);
  anything else unchanged. A single letter or a math word after the number is not a unit."""
  m = _PLAIN.fullmatch(answer.strip())
  if m is None:
    return answer
  words = {w.lower() for w in m["tail"].replace(".", " ").split()}
  if words & _MATH_WORDS:
    return answer
  number = re.sub(_SEPARATOR, "", m["num"])
  return number + "%" if "%" in m["tail"] or words & _PERCENT_WORDS else number


def plain_equal(a: str, b: str) -> bool | None:
  """Two canonical answers compared without a parser where that settles it: integers by value
  (both ways), other plain numbers ('0.5', '1/2') when equal. None: a parser must decide."""
  if _INTEGER.fullmatch(a) and _INTEGER.fullmatch(b):
    return int(a) == int(b)
  if not (_RATIONAL.fullmatch(a) and _RATIONAL.fullmatch(b)):
    return None
  x, y = parse_number(a), parse_number(b)
  return True if x is not None and x == y else None

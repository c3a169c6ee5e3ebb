"""What a task gives the trainer: problems, prompts, demonstrations and a verifier."""

from __future__ import annotations

import abc
import collections
import dataclasses
import functools
import math
import numbers
from typing import Any, Protocol, Sequence

import numpy as np


class Tokenizer(Protocol):
  eos_ids: tuple[int, ...]
  pad_id: int

  @property
  def vocab_size(self) -> int: ...

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclasses.dataclass(frozen=True)
class Problem:
  question: str  # the problem as text, before any prompt template
  answer: str  # the reference answer the verifier compares with
  meta: Any = None  # task-specific data a verifier may need


TIMEOUT = "timeout"  # the check ran past the grader's time limit
INVALID = "invalid"  # no text a grader may read, or a verifier's result that is no score


@dataclasses.dataclass(frozen=True)
class Score:
  reward: float  # in [0, 1]
  correct: bool
  # Why the response scored 0 without a verdict: "" (it was graded), TIMEOUT or INVALID.
  # Counted in the step's metrics (Task.failures); left out of comparisons.
  failure: str = dataclasses.field(default="", compare=False)


class Task(abc.ABC):
  """A stream of training problems, a fixed held-out set, prompts and a verifier.

  Problem i of the training stream depends only on the task's seed and i, so the data position
  is one integer (checkpointed with the run) and every process can load just its own rows.
  """

  tokenizer: Tokenizer
  max_prompt_len: int  # prompts are left-padded to this many tokens
  max_answer_len: int  # tokens a correct response needs, EOS included

  @abc.abstractmethod
  def problem(self, index: int) -> Problem:
    """Problem `index` of the training stream."""

  @abc.abstractmethod
  def eval_problems(self) -> list[Problem]:
    """The held-out set, fixed for the task's configuration."""

  @abc.abstractmethod
  def prompt_ids(self, problem: Problem) -> list[int]:
    """The prompt's token ids (template and special tokens included)."""

  @abc.abstractmethod
  def demonstration(self, problem: Problem) -> str:
    """A correct response, for supervised training of the base policy."""

  def reference_response(self, problem: Problem) -> str:
    """A correct response, whose likelihood eval.reference measures (the probe's progress,
    launch/cbs_probe.py): the demonstration, which is correct by its contract."""
    return self.demonstration(problem)

  @abc.abstractmethod
  def verify(self, response: str, problem: Problem) -> Score:
    """Score a decoded response; malformed text scores 0 and never raises."""

  def problems(self, start: int, n: int) -> list[Problem]:
    return [self.problem(i) for i in range(start, start + n)]

  @functools.cached_property
  def failures(self) -> collections.Counter:
    """Responses this task scored 0 without a verdict, by why (TIMEOUT, INVALID); the trainer
    reports each step's increase (rollout.failure_metrics)."""
    return collections.Counter()

  def score(self, response_ids: Sequence[int], finished: bool, problem: Problem) -> Score:
    """A response that ran out of tokens before EOS scores 0. One that holds an id no answer
    may contain or bytes that are no UTF-8 (see `response_text`), whose verifier raises or
    returns no score (see `checked`), or whose check ran out of time, scores 0 and is counted
    in `failures`. `response_ids` come without their final EOS."""
    if not finished:
      return Score(0.0, False)
    try:
      text = response_text(self.tokenizer, response_ids)
      s = Score(0.0, False, INVALID) if text is None else checked(self.verify(text, problem))
    except Exception:  # a verifier bug or pathological text must not end a run
      s = Score(0.0, False, INVALID)
    if s.failure:
      self.failures[s.failure] += 1
    return s


def checked(s: Any) -> Score:
  """A verifier's result as a Score: its own when the reward is a real number in [0, 1]; 0 and
  INVALID for anything else (NaN, inf, a string, None, a reward outside [0, 1], no Score)."""
  if not isinstance(s, Score):
    return Score(0.0, False, INVALID)
  r = s.reward
  if (not isinstance(r, numbers.Real) or isinstance(r, (bool, np.bool_))
      or not math.isfinite(r) or not 0.0 <= r <= 1.0):
    return Score(0.0, False, INVALID)
  if s.failure:  # a grader's own: scored 0 already
    return Score(0.0, False, TIMEOUT if s.failure == TIMEOUT else INVALID)
  return Score(float(r), bool(s.correct))


def response_text(tokenizer: Tokenizer, ids: Sequence[int]) -> str | None:
  """The text a verifier sees, or None when the response holds an id the policy must not emit
  mid-answer: a special token (pad, BOS, EOS, template markers) or an id outside the
  tokenizer's vocabulary (a model's spare rows; the sampler draws from all of them); or when
  its bytes are no UTF-8 (a byte-level tokenizer decodes a broken sequence to U+FFFD).

  Decoding with special tokens skipped would drop such ids silently (`4 <pad> 6` would read
  `46`), and a Hugging Face tokenizer also drops ids it does not know. An id is special when
  skipping specials changes the decoded text, which holds for any tokenizer of the protocol.
  """
  ids = [int(i) for i in ids]
  if any(not 0 <= i < tokenizer.vocab_size for i in ids):
    return None
  text = tokenizer.decode(ids, skip_special_tokens=True)
  if "\ufffd" in text or tokenizer.decode(ids, skip_special_tokens=False) != text:
    return None
  return text


def turn_end_id(tokenizer: Tokenizer) -> int:
  """The id a demonstration ends with: the tokenizer's turn-ending token where it names one
  (HFTokenizer.eos_id: Llama 3.1's <|eot_id|>, not <|end_of_text|>), else its first stop id."""
  end = getattr(tokenizer, "eos_id", None)
  return tokenizer.eos_ids[0] if end is None else int(end)


def left_pad(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """[n, length] int32 tokens and bool mask, each row right-aligned."""
  tokens = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    if len(r) > length:
      raise ValueError(f"a prompt of {len(r)} tokens exceeds max_prompt_len={length}")
    if r:
      tokens[i, length - len(r):] = r
      mask[i, length - len(r):] = True
  return tokens, mask


def right_pad(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """[n, length] int32 tokens and bool mask, each row left-aligned (longer rows are cut)."""
  tokens = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    r = list(r)[:length]
    tokens[i, :len(r)] = r
    mask[i, :len(r)] = True
  return tokens, mask

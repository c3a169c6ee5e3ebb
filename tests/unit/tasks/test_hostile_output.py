"""Hostile model output and broken verifiers, through the step's scoring: every response gets a
reward, none ends the step, and each scored 0 without a verdict is counted in the step's metrics
(reward/grader_timeouts, reward/invalid)."""

import math
import time

import numpy as np
import pytest

from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.config.sections import task as task_config
from rlscale.tasks import graders
from rlscale.tasks.base import INVALID, TIMEOUT, Problem, Score, right_pad
from rlscale.tasks.chain_sum import ChainSum
from rlscale.tasks.text import TextTask
from rlscale.trainer import rollout
from tests.support.tiny_tokenizer import make_tokenizer_folder


class _Inline(TextTask):
  """A text task of one problem, graded by `task.grader`."""
  _train_size = 1

  def _train_item(self, i):
    return Problem("What is 40 + 6?", "46")

  def _eval_items(self):
    return [self._train_item(0)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return HFTokenizer(make_tokenizer_folder(str(tmp_path_factory.mktemp("tok"))))


def _task(tokenizer, grader="math", **fields):
  cfg = task_config("files")
  cfg.grader, cfg.num_eval, cfg.max_prompt_len = grader, 1, 64
  cfg.update(fields)
  return _Inline(cfg, tokenizer)


def _step(task, rows):
  """score_step on responses `rows` (ids without the final EOS), one group of them."""
  eos = task.tokenizer.eos_ids[0]
  toks, mask = right_pad([list(r) + [eos] for r in rows], max(map(len, rows)) + 1,
                         task.tokenizer.pad_id)
  problem = task.eval_problems()[0]
  return rollout.score_step(task, [problem], len(rows), toks, mask,
                            np.ones((1, task.max_prompt_len), bool), True)


def _counts(scored):
  return scored.metrics["reward/grader_timeouts"], scored.metrics["reward/invalid"]


def test_an_ordinary_step_counts_nothing(tokenizer):
  task = _task(tokenizer)
  scored = _step(task, [tokenizer.encode("So \\boxed{46}"), tokenizer.encode("I think 45")])
  assert scored.rewards.tolist() == [1.0, 0.0] and _counts(scored) == (0, 0)


def test_special_token_responses_score_zero_and_are_counted(tokenizer):
  task = _task(tokenizer)
  good = tokenizer.encode("So \\boxed{46}")
  pad, im_start, spare = tokenizer.pad_id, tokenizer.encode("<|im_start|>")[0], 10**6
  rows = [[pad] * 8, [im_start] * 8, good[:3] + [pad] + good[3:], good + [spare], good]
  scored = _step(task, rows)
  assert scored.rewards.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
  assert _counts(scored) == (0, 4)


def test_bytes_that_are_no_utf8_score_zero_and_are_counted(tokenizer):
  """A byte-level tokenizer has a token per byte: a lead byte with no continuation decodes to
  U+FFFD. Before, the text around it was graded (here: a right answer, reward 1)."""
  task = _task(tokenizer)
  good = tokenizer.encode("So \\boxed{46}")
  lead = tokenizer._tok.token_to_id("Ã")  # byte 0xC3, the first of a two-byte character
  assert "\ufffd" in tokenizer.decode([lead] + tokenizer.encode("(") + good)
  e_acute = tokenizer.encode("é")  # the same byte and its continuation: valid UTF-8
  rows = [[lead] + tokenizer.encode("(") + good, good + [lead], e_acute + good, [lead] * 6]
  scored = _step(task, rows)
  assert scored.rewards.tolist() == [0.0, 0.0, 1.0, 0.0]
  assert _counts(scored) == (0, 3)


@pytest.mark.parametrize("grader", graders.NAMES)
def test_the_longest_text_is_scored_and_longer_is_counted(grader):
  """Responses at the graders' cap (MAX_RESPONSE_CHARS) are graded within seconds; one
  character more scores 0 unread, as INVALID."""
  g = graders.make({**task_config(), "grader": grader, "grader_regex": r"=\s*(\d+)"})
  n = graders.MAX_RESPONSE_CHARS
  for text in ("7+5=12;" * (n // 7), "answer" + " " * (n - 7) + "x", "\\boxed{" * (n // 7),
               "9" * n):
    start = time.monotonic()
    s = g(text, "12")
    assert s.failure in ("", TIMEOUT) and time.monotonic() - start < 10, text[:20]
  s = g("x" * (n + 1), "12")
  assert s == Score(0.0, False) and s.failure == INVALID


def test_regex_timeouts_are_counted_in_the_step(tokenizer):
  task = _task(tokenizer, "regex", grader_regex=r"boxed\{(\d+)\}|(?:a|aa)+$",
               grader_timeout_s=0.3)
  slow = tokenizer.encode("a" * 3000 + "b")
  scored = _step(task, [slow, tokenizer.encode("So \\boxed{46}"), slow])
  assert scored.rewards.tolist() == [0.0, 1.0, 0.0] and _counts(scored) == (2, 0)


class _Custom(ChainSum):
  """A task whose verifier returns what it is given."""

  def __init__(self, result):
    super().__init__()
    self.result = result

  def verify(self, response, problem):
    if isinstance(self.result, BaseException):
      raise self.result
    return self.result


NOT_A_SCORE = {"nan": Score(math.nan, True), "inf": Score(math.inf, True),
               "-inf": Score(-math.inf, False), "str": Score("0.5", True),
               "None": Score(None, False), "above 1": Score(1.5, True),
               "below 0": Score(-0.5, False), "bool": Score(True, True),
               "numpy nan": Score(np.float32("nan"), True), "bare float": 1.0, "bare None": None,
               "raises": ZeroDivisionError("a verifier bug")}


@pytest.mark.parametrize("kind", list(NOT_A_SCORE))
def test_a_verifier_result_that_is_no_score_is_refused_and_counted(kind):
  """NaN, inf, a string, None, a reward outside [0, 1] or no Score at all: 0, never correct,
  counted as INVALID. Before, a string or no Score raised out of the step, NaN scored 0 but
  stayed correct, and 1.5 became 1 unnoticed."""
  task = _Custom(NOT_A_SCORE[kind])
  problem = task.problem(0)
  ids = task.tokenizer.encode(task.reference_response(problem))
  s = task.score(ids, True, problem)
  assert s == Score(0.0, False) and s.failure == INVALID
  toks, mask = right_pad([ids + [task.tokenizer.eos_id]] * 2, len(ids) + 1, 0)
  scored = rollout.score_step(task, [problem], 2, toks, mask,
                              np.ones((1, task.max_prompt_len), bool), True)
  assert scored.rewards.tolist() == [0.0, 0.0] and _counts(scored) == (0, 2)
  assert scored.metrics["reward/accuracy"] == 0.0


def test_valid_custom_scores_pass_unchanged():
  for result in (Score(0.25, False), Score(1, True), Score(np.float32(0.5), np.True_)):
    task = _Custom(result)
    problem = task.problem(0)
    s = task.score(task.tokenizer.encode(task.reference_response(problem)), True, problem)
    assert (s.reward, s.correct, s.failure) == (float(result.reward), bool(result.correct), "")
    assert not task.failures

"""The rewards of the math config's task on the committed GSM8K-style held-out set: 30
responses whose rewards were decided by hand (tests/support/fixtures/gsm8k_style_responses.jsonl),
scored through the whole path a run takes: token ids, stop token, special ids, the grader."""

import json
import os

import pytest

from tests.support import REPO, FIXTURES
from rlscale import tasks
from rlscale.config import files as config_files
from rlscale.checkpoints.tokenizer import HFTokenizer
from tests.support.policy_folder import write_tokenizer

TABLE = os.path.join(FIXTURES, "gsm8k_style_responses.jsonl")
TEST_FILE = os.path.join(REPO, "rlscale", "data", "gsm8k_style", "test.jsonl")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("tok"))
  write_tokenizer(folder)
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo_math.py"))
  return tasks.make(cfg.task, HFTokenizer(folder))


def test_thirty_responses_score_as_checked_by_hand(task):
  questions = [json.loads(line)["question"] for line in open(TEST_FILE)]
  held_out = {p.question: p for p in task.eval_problems()}
  assert len(held_out) == 24 and set(held_out) == set(questions)  # the whole committed set
  rows = [json.loads(line) for line in open(TABLE)]
  assert len(rows) == 30
  wrong = []
  for r in rows:
    problem = held_out[questions[r["test_row"]]]
    ids = task.tokenizer.encode(r["response"])
    s = task.score(ids, r["finished"], problem)
    if s.reward != r["reward"] or s.correct != bool(r["reward"]):
      wrong.append((r["response"][:60], problem.answer, s.reward, r["reward"], r["why"]))
  assert not wrong, wrong

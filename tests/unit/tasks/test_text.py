"""Text tasks for real checkpoints: TFDS math_dataset (mocked) and reasoning-gym."""

import numpy as np
import pytest

from rlscale import tasks
from rlscale.trainer import rollout
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.config.sections import task as task_config
from rlscale.tasks.base import Problem, right_pad
from rlscale.tasks.text import TextTask
from tests.support.tiny_tokenizer import make_tokenizer_folder

MATH = [{"question": f"What is {a} + {b}?".encode(), "answer": f"{a + b}\n".encode()}
        for a in range(7) for b in range(6)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return HFTokenizer(make_tokenizer_folder(str(tmp_path_factory.mktemp("tok"))))


def _cfg(name, **kw):
  cfg = task_config(name)
  cfg.num_eval, cfg.max_prompt_len = 10, 64
  for k, v in kw.items():
    cfg[k] = v
  return cfg


def test_tfds_math_from_a_mocked_data_source(tokenizer):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(as_data_source_fn=lambda *a, **k: MATH):
    task = tasks.make(_cfg("tfds_math", data_dir="/nonexistent"), tokenizer)
    a = task.problems(0, 30)
    assert a == tasks.make(_cfg("tfds_math"), tokenizer).problems(0, 30)  # deterministic
    assert len(task.eval_problems()) == 10
    assert {p.question for p in a[:len(MATH)]} <= {m["question"].decode() for m in MATH}
    p = a[0]
    assert p.answer == str(sum(int(x) for x in p.question[8:-1].split(" + ")))
    prompt = tokenizer.decode(task.prompt_ids(p), skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>user\nWhat is") and prompt.endswith("<|im_start|>assistant\n")
    assert "\\boxed{}" in prompt
    assert task.verify(task.demonstration(p), p).correct
    assert task.verify(f"So the sum is {p.answer}.", p).correct
    assert not task.verify("eval('__import__(\"os\")')", p).correct
  with tfds.testing.mock_data(num_examples=12):  # tfds' own random mock rows: still no error
    task = tasks.make(_cfg("tfds_math"), tokenizer)
    assert len(task.problems(0, 5)) == 5


def test_overlong_prompts_are_skipped_not_truncated(tokenizer):
  tfds = pytest.importorskip("tensorflow_datasets")
  long = [{"question": b"What is " + b"1 + " * 200 + b"1?", "answer": b"201"}] * 3
  with tfds.testing.mock_data(as_data_source_fn=lambda *a, **k: long + MATH):
    task = tasks.make(_cfg("tfds_math"), tokenizer)
    for p in task.problems(0, 40):
      assert len(task.prompt_ids(p)) <= 64


def test_reasoning_gym_generators_with_our_verifier(tokenizer):
  pytest.importorskip("reasoning_gym")
  task = tasks.make(_cfg("reasoning_gym", rg_dataset="basic_arithmetic", rg_size=200), tokenizer)
  probs = task.problems(0, 20)
  assert probs == tasks.make(_cfg("reasoning_gym", rg_dataset="basic_arithmetic", rg_size=200),
                             tokenizer).problems(0, 20)
  held_out = {p.question for p in task.eval_problems()}
  assert not held_out & {p.question for p in probs}
  for p in probs[:5]:
    assert task.verify(task.demonstration(p), p).correct
    assert task.score(tokenizer.encode("no idea"), True, p).reward == 0.0


class _InMemory(TextTask):
  """A text task on a fixed list, needing neither TFDS nor reasoning-gym."""
  _train_size = 1

  def _train_item(self, i):
    return Problem("What is 40 + 6?", "46")

  def _eval_items(self):
    return [self._train_item(0)]


def test_special_and_spare_ids_inside_a_text_response_score_zero(tokenizer):
  """Template markers, pad and ids past the tokenizer's vocabulary are refused, not dropped."""
  task = _InMemory(_cfg("tfds_math"), tokenizer)
  p = task.problem(0)
  im_start, im_end = (tokenizer.encode(t) for t in ("<|im_start|>", "<|im_end|>"))
  assert tokenizer.pad_id == 0 and tokenizer.eos_ids == (2, 0) and im_start == [1]
  ids = tokenizer.encode("So \\boxed{46}")
  assert task.score(ids, True, p) == tasks.Score(1.0, True)
  spare = tokenizer.vocab_size
  for bad in (ids[:3] + [tokenizer.pad_id] + ids[3:], im_start + ids, ids + [spare],
              ids[:3] + im_end + ids[3:], ids + [10**6]):
    assert task.score(bad, True, p) == tasks.Score(0.0, False), bad
  # Through the batch scorer: either EOS ends a response, an EOS inside one is refused.
  rows = [ids + im_end, ids + [0], ids + [0] + im_end, [0] + ids + im_end, ids + [spare] + im_end]
  toks, mask = right_pad(rows, len(ids) + 2, tokenizer.pad_id)
  rewards, correct, finished = rollout.score(task, [p] * len(rows), toks, mask, tokenizer.eos_ids)
  assert finished.all() and correct.tolist() == [True, True, False, False, False]
  np.testing.assert_array_equal(rewards, correct.astype(np.float32))

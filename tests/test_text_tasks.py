"""Text tasks for real checkpoints: TFDS math_dataset (mocked) and reasoning-gym."""

import pytest

from rlscale import tasks
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.config_common import task as task_config
from tiny_tokenizer import make_tokenizer_folder

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

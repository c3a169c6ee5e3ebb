"""The chained-sum testbed: problems, the two demonstration procedures, the verifier, configs."""

import os

import pytest

from tests.support import REPO
from rlscale import tasks
from rlscale.config import files as config_files
from rlscale.run import train
from rlscale.config.sections import chain_sum_task
from rlscale.config.errors import ConfigError
from rlscale.resolve.resolved import validate
from rlscale.tasks.base import Problem
from rlscale.tasks.chain_sum import ChainSum



def _steps(text):
  """[(x, y, written sum)] of a scratchpad."""
  out = []
  for line in text.split(";"):
    lhs, s = line.split("=")
    x, y = lhs.split("+")
    out.append((int(x), int(y), int(s)))
  return out


def test_problems_are_deterministic_and_disjoint_from_the_held_out_set():
  a, b = ChainSum(seed=3), ChainSum(seed=3)
  assert a.problems(100, 20) == b.problems(100, 20)
  assert a.problems(0, 5) != ChainSum(seed=4).problems(0, 5)
  held_out = a.eval_problems()
  assert len({p.question for p in held_out}) == len(held_out) == 500
  assert held_out == b.eval_problems()
  assert not {p.question for p in held_out} & {p.question for p in a.problems(0, 3000)}
  for p in a.problems(0, 100):
    terms = [int(x) for x in p.question.rstrip("=").split("+")]
    assert len(terms) == 4 and all(0 <= x < 10 for x in terms) and int(p.answer) == sum(terms)
    assert len(a.prompt_ids(p)) <= a.max_prompt_len


def test_demonstrations_follow_one_of_two_procedures_step_by_step():
  task = ChainSum(flaw=0.65)
  lengths, dropped, carries = [], 0, 0
  for p in task.problems(0, 400):
    demo = task.demonstration(p)
    assert demo == task.demonstration(Problem(p.question, p.answer))  # one per question
    assert len(task.tokenizer.encode(demo)) + 1 <= task.max_answer_len
    steps = _steps(demo)
    terms = p.meta
    assert [y for _, y, _ in steps] == list(terms[1:]) and steps[0][0] == terms[0]
    for (x, y, s), nxt in zip(steps, steps[1:] + [None]):
      if x % 10 + y % 10 >= 10:
        carries += 1
        dropped += s == x + y - 10
      assert s in (x + y, x + y - 10) and (s == x + y or x % 10 + y % 10 >= 10)
      if nxt:
        assert nxt[0] == s  # the chain goes on from the written value
    lengths.append(len(demo))
  assert 0.55 < dropped / carries < 0.75  # about `flaw` of the carries are dropped
  right = [p for p in task.problems(0, 400) if task.verify(task.demonstration(p), p).correct]
  assert 0.05 < len(right) / 400 < 0.4  # the base sees both procedures
  assert sum(lengths) / len(lengths) >= 16
  assert all(task.verify(ChainSum(flaw=0.0).demonstration(p), p).correct
             for p in task.problems(0, 200))
  every = ChainSum(flaw=1.0)
  assert all(s == x + y - 10 for p in every.problems(0, 50)
             for x, y, s in _steps(every.demonstration(p)) if x % 10 + y % 10 >= 10)


@pytest.mark.parametrize("text", [
    "", " ", "=", ";", "+", "==", "7+5=12;12+9=", "32=", "=32=", "0032x", "9" * 500,
    "7+5=12;12+9=11;11+3=14;14+8=22", "3 2", "32;", "-32", "+32", "32.0", "\x00", "\u0663\u0662",
])
def test_wrong_or_malformed_responses_score_zero_without_raising(text):
  task = ChainSum()
  problem = Problem("7+5+9+3+8=", "32", (7, 5, 9, 3, 8))
  s = task.verify(text, problem)
  assert s.reward == 0.0 and not s.correct
  ids = task.tokenizer.encode("".join(c for c in text if c in "0123456789+=;"))
  assert task.score(ids, True, problem).reward in (0.0, 1.0)


def test_the_final_answer_is_graded():
  task = ChainSum()
  problem = Problem("7+5+9+3+8=", "32", (7, 5, 9, 3, 8))
  for text in ("7+5=12;12+9=21;21+3=24;24+8=32", "32", "1+1=3;3+3=32", " 32 "):
    assert task.verify(text, problem) == task.verify(text, problem)
    assert task.verify(text, problem).reward == 1.0, text
  ids = task.tokenizer.encode("7+5=12;12+9=21;21+3=24;24+8=32")
  assert task.score(ids, True, problem).correct
  assert not task.score(ids, False, problem).correct  # ran out of tokens before EOS
  assert task.score([task.tokenizer.pad_id] + ids, True, problem).reward == 0.0
  assert task.score([40, 41], True, problem).reward == 0.0  # ids past the vocabulary


@pytest.mark.parametrize("field,value", [("terms", 1), ("digits", 0), ("flaw", 1.5),
                                         ("flaw", "x"), ("num_eval", 0), ("num_eval", 10**6),
                                         ("seed", -1), ("terms", True)])
def test_bad_fields_are_refused_with_their_name(field, value):
  cfg = chain_sum_task().to_dict()
  cfg[field] = value
  with pytest.raises(ValueError, match=f"task.{field}="):
    tasks.make(cfg)


def test_config_validation_names_the_field():
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo_chain_sum.py:tiny"))
  with cfg.unlocked():
    cfg.task.flaw = 2.0
  with pytest.raises(ConfigError, match=r"task\.flaw=2\.0"):
    validate(cfg)


def test_the_configs_fit_the_task():
  for spec in ("grpo_chain_sum.py", "grpo_chain_sum.py:tiny"):
    cfg = config_files.load(os.path.join(REPO, "configs", spec))
    task = tasks.make(cfg.task)
    assert cfg.model.vocab_size >= task.tokenizer.vocab_size
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo_chain_sum.py"))
  assert cfg.rollout.max_new_tokens >= tasks.make(cfg.task).max_answer_len


@pytest.mark.slow
def test_tiny_config_runs(tiny_sft_base, tmp_path):
  """The tiny variant end to end (tiny SFT base, two GRPO steps): ~30 s on 2 CPU cores."""
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo_chain_sum.py:tiny"))
  with cfg.unlocked():
    cfg.init.cache_dir = tiny_sft_base
    cfg.init.sft_config = os.path.join(REPO, "configs", "sft.py:tiny,steps=2")
    cfg.noise.enabled = False
    cfg.eval.sampled = False
    cfg.train.checkpoint_every = 0
  summary = train.main(cfg, str(tmp_path / "run"))
  assert summary["step"] == cfg.train.num_steps
  assert 0.0 <= summary["eval/accuracy_greedy"] <= 1.0

"""Tasks and verifiers: determinism, held-out disjointness, adversarial model output."""

import numpy as np
import pytest

from rlscale import tasks
from rlscale.trainer import rollout
from rlscale.config.sections import task as task_config
from rlscale.tasks.arithmetic import Arithmetic
from rlscale.tasks.base import Problem, left_pad, right_pad
from rlscale.tasks.char_tokenizer import CharTokenizer
from rlscale.tasks.verifiers import exact_integer, final_answer, parse_number, same_answer

ADVERSARIAL = [
    "", " ", "\n", "-", "+", "=", "12+3", "1 2", "0x1f", "1e3", "nan", "inf", "-inf", "9" * 5000,
    "__import__('os').system('echo pwned')", "eval('1+1')", "exec('x=1')", "lambda: 1",
    "\u0663", "\uff11\uff12", "\x00\x01", "?" * 100, "1/0", "(1)", "3.0", "--5", "+-5", "5 5",
    "\\boxed{", "\\boxed{\\boxed{1}}", "{" * 1000, "1" + "0" * 400,
]


def test_problem_stream_is_deterministic_and_disjoint_from_the_held_out_set():
  a, b = Arithmetic(seed=3), Arithmetic(seed=3)
  assert a.problems(100, 20) == b.problems(100, 20)
  assert a.problems(0, 5) != Arithmetic(seed=4).problems(0, 5)
  held_out = {p.question for p in a.eval_problems()}
  assert len(held_out) == 500
  assert not held_out & {p.question for p in a.problems(0, 5000)}
  for p in a.problems(0, 200):
    x, y = (int(v) for v in p.question[:-1].replace("*", "+").replace("-", "+").split("+"))
    op = next(c for c in "+-*" if c in p.question)
    assert int(p.answer) == (x + y if op == "+" else x - y if op == "-" else x * y)
    assert len(a.prompt_ids(p)) <= a.max_prompt_len
    assert len(a.tokenizer.encode(p.answer)) + 1 <= a.max_answer_len


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_adversarial_responses_score_zero_without_raising(text):
  task = Arithmetic()
  problem = Problem("2+3=", "5")
  ids = [i for i in task.tokenizer.encode("".join(c for c in text if c in "0123456789+-*="))]
  assert task.score(ids, True, problem).reward in (0.0, 1.0)
  s = task.verify(text, problem)
  assert s.reward == 0.0 and not s.correct
  assert isinstance(same_answer(final_answer(text), "5"), bool)  # free-form parsing never raises


def test_unfinished_and_out_of_vocabulary_outputs():
  task = Arithmetic()
  problem = Problem("2+3=", "5")
  five = task.tokenizer.encode("5")
  assert task.score(five, True, problem).correct
  assert not task.score(five, False, problem).correct  # no EOS before the budget ran out
  assert task.score([250, 251], True, problem).reward == 0.0  # ids beyond the tokenizer
  assert task.tokenizer.decode([250, 7]) == "?4"


@pytest.mark.parametrize("partial_credit", [False, True])
def test_special_and_spare_ids_inside_a_response_score_zero(partial_credit):
  """The sampler draws from the model's whole vocabulary: pad, BOS, EOS and spare rows past the
  tokenizer's vocabulary are never dropped to make a right answer out of them."""
  task = Arithmetic(partial_credit=partial_credit)
  tok, p = task.tokenizer, Problem("40+6=", "46")
  four, six = tok.encode("4"), tok.encode("6")
  assert task.score(four + six, True, p) == tasks.Score(1.0, True)
  spare = tok.vocab_size  # the first of the model's rows the tokenizer does not know
  for ids in (four + [tok.pad_id] + six, [tok.bos_id] + four + six, four + six + [spare],
              four + [tok.eos_id] + six, four + six + [tok.pad_id], [-1] + four + six):
    assert task.score(ids, True, p) == tasks.Score(0.0, False), ids
  # The same through the batch scorer, with the final EOS stripped there.
  rows = [four + six + [tok.eos_id], four + [tok.pad_id] + six + [tok.eos_id],
          [tok.bos_id] + four + six + [tok.eos_id], four + six + [spare, tok.eos_id]]
  tokens, mask = right_pad(rows, 5, tok.pad_id)
  rewards, correct, finished = rollout.score(task, [p] * 4, tokens, mask, tok.eos_ids)
  assert finished.all() and correct.tolist() == [True, False, False, False]
  np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0, 0.0])


def test_score_never_raises_even_if_the_verifier_does():
  class Broken(Arithmetic):
    def verify(self, response, problem):
      raise RecursionError("pathological")
  assert Broken().score([5], True, Problem("1+1=", "2")).reward == 0.0


def test_number_parsing_and_comparison():
  assert exact_integer(" 42 ", "42") and exact_integer("-7", "-7") and not exact_integer("42.0", "42")
  assert parse_number("3/4") == parse_number("0.75") and parse_number("1/0") is None
  assert parse_number("1,000") == 1000 and parse_number("12abc") is None
  assert final_answer("so the answer is \\boxed{17}. Or 18?") == "17"
  assert final_answer("first 3, then 4, finally 12.") == "12."
  assert same_answer("12.", "12") and same_answer("0.5", "1/2") and same_answer(" Paris.", "paris")
  assert final_answer("x" * 20_000) is None


def test_char_tokenizer_round_trip_and_errors():
  tok = CharTokenizer("0123456789+-*=")
  ids = tok.encode("12+3=", add_special_tokens=True)
  assert ids[0] == tok.bos_id and tok.decode(ids) == "12+3="
  assert tok.decode(ids + [tok.eos_id], skip_special_tokens=False) == "<bos>12+3=<eos>"
  assert tok.decode([-1, 3, 17]) == "?0?"  # a negative id is no special token
  with pytest.raises(ValueError, match="'x' is not in the alphabet"):
    tok.encode("1x")


def test_padding_helpers_and_group_prompts():
  t, m = left_pad([[5, 6], [7]], 3, 0)
  np.testing.assert_array_equal(t, [[0, 5, 6], [0, 0, 7]])
  np.testing.assert_array_equal(m, [[False, True, True], [False, False, True]])
  t, m = right_pad([[5, 6, 7, 8], [7]], 3, 0)
  np.testing.assert_array_equal(t, [[5, 6, 7], [7, 0, 0]])
  with pytest.raises(ValueError, match="max_prompt_len=1"):
    left_pad([[1, 2]], 1, 0)
  task = Arithmetic(digits=2)
  probs = task.problems(0, 2)
  t, m = rollout.prompts(task, probs, group_size=3)
  assert t.shape == (6, task.max_prompt_len) and (t[0] == t[2]).all() and not (t[2] == t[3]).all()


def test_score_batch_marks_finished_rows():
  task = Arithmetic()
  probs = [Problem("2+3=", "5"), Problem("2+2=", "4"), Problem("1+1=", "2")]
  eos = task.tokenizer.eos_id
  five, four = task.tokenizer.encode("5"), task.tokenizer.encode("4")
  tokens = np.array([five + [eos, 0], four + four + [0], five + [eos, 0]])
  mask = np.array([[1, 1, 0], [1, 1, 0], [1, 1, 0]], bool)
  rewards, correct, finished = rollout.score(task, probs, tokens, mask, (eos,))
  np.testing.assert_array_equal(finished, [True, False, True])
  np.testing.assert_array_equal(correct, [True, False, False])
  np.testing.assert_array_equal(rewards, [1.0, 0.0, 0.0])


def test_task_factory_errors():
  cfg = task_config("arithmetic")
  assert isinstance(tasks.make(cfg), Arithmetic)
  cfg.name = "gsm9k"
  with pytest.raises(ValueError, match="gsm9k"):
    tasks.make(cfg)
  cfg.name = "tfds_math"
  with pytest.raises(ValueError, match="needs a tokenizer"):
    tasks.make(cfg)
  with pytest.raises(ValueError, match="digits=0"):
    Arithmetic(digits=0)
  with pytest.raises(ValueError, match="ops"):
    Arithmetic(ops="/")


def test_restated_demonstrations_are_rejected_by_the_verifier():
  task = Arithmetic(digits=2, restate=0.5)
  probs = task.problems(0, 400)
  demos = [task.demonstration(p) for p in probs]
  restated = [d != p.answer for d, p in zip(demos, probs)]
  assert 0.4 < np.mean(restated) < 0.6
  assert demos == [task.demonstration(p) for p in probs]  # the style is fixed per problem
  for d, p, r in zip(demos, probs, restated):
    assert task.verify(d, p).correct != r
    assert len(task.tokenizer.encode(d)) + 1 <= task.max_answer_len
  plain = Arithmetic(digits=2)
  assert all(plain.demonstration(p) == p.answer for p in plain.problems(0, 50))
  with pytest.raises(ValueError, match="restate"):
    Arithmetic(restate=1.5)


def test_partial_credit_by_place_value():
  from rlscale.tasks.verifiers import digit_credit
  assert digit_credit("46", "46") == 1.0
  assert digit_credit("47", "46") == 0.25  # tens right: half the places, times 0.5
  assert digit_credit("146", "46") == pytest.approx(0.5 * 2 / 3)  # an extra digit costs
  assert digit_credit("-46", "46") == 0.0 and digit_credit("4x6", "46") == 0.0
  task = Arithmetic(partial_credit=True)
  s = task.verify("47", Problem("40+6=", "46"))
  assert s.reward == 0.25 and not s.correct
  assert Arithmetic().verify("47", Problem("40+6=", "46")).reward == 0.0

"""Held-out evaluation with the tiny model on 8 devices: padding, denominators, determinism."""

import jax
import numpy as np
import pytest
from flax import nnx

from rlscale import models, tasks
from rlscale.config import sections as config_common
from rlscale.trainer import rollout
from rlscale.parallel import sharding
from rlscale.trainer.evaluation import Evaluator
from rlscale.sampling import generate
from rlscale.tasks import Score

NUM_EVAL = 10  # not a multiple of the 8 batch shards: the set is padded to 16 rows
MAX_NEW = 4
KEYS = ("accuracy", "reward", "response_len", "finished")


@pytest.fixture(scope="module")
def mesh8():
  return sharding.make_mesh((-1, 1, 1))


@pytest.fixture(scope="module")
def task():
  cfg = config_common.task("arithmetic")
  cfg.digits, cfg.num_eval = 2, NUM_EVAL
  return tasks.make(cfg)


@pytest.fixture(scope="module")
def policy(task, mesh8, rules):
  """configs/grpo.py's tiny shape with arithmetic_default's vocabulary (spare ids above 17)."""
  cfg = models.named("tiny", vocab_size=32, d_model=64, num_layers=2, num_heads=2, num_kv_heads=1,
                     head_dim=32, mlp_dim=128)
  assert cfg.vocab_size > task.tokenizer.vocab_size
  return nnx.split(models.create_sharded(models.CausalLM, cfg, mesh8, rules, jax.random.key(0)))


def _evaluator(task, policy, mesh, rules, generation_batch, sampled):
  return Evaluator(task, policy[0], mesh, rules, max_new_tokens=MAX_NEW,
                   generation_batch=generation_batch, sampled=sampled)


@pytest.fixture(scope="module")
def ev8(task, policy, mesh8, rules):
  return _evaluator(task, policy, mesh8, rules, 8, sampled=True)


@pytest.fixture(scope="module")
def ev16(task, policy, mesh8, rules):
  return _evaluator(task, policy, mesh8, rules, 16, sampled=False)


@pytest.fixture
def spy(task, monkeypatch):
  """Every row task.score sees: (question, response ids, finished), in row order."""
  seen = []
  original = task.score

  def score(ids, finished, problem):
    seen.append((problem.question, tuple(int(i) for i in ids), finished))
    return original(ids, finished, problem)

  monkeypatch.setattr(task, "score", score)
  return seen


def test_the_held_out_set_is_padded_to_whole_generation_batches(task, policy, mesh8, rules, ev8,
                                                                ev16):
  real = task.eval_problems()
  assert len(real) == NUM_EVAL
  for ev, gb in ((ev8, 8), (ev16, 16)):
    assert ev.num == NUM_EVAL and ev.gb == gb
    assert len(ev.problems) == 16 and ev.tokens.shape == (16, task.max_prompt_len)
    assert ev.real.tolist() == [True] * NUM_EVAL + [False] * 6
    assert ev.problems[:NUM_EVAL] == real and ev.problems[NUM_EVAL:] == [real[0]] * 6
    want, _ = rollout.prompts(task, real)
    np.testing.assert_array_equal(ev.tokens[:NUM_EVAL], want)
  # A generation batch the 8 shards do not divide is rounded down to a multiple, at least 8.
  for asked, gb in ((12, 8), (3, 8), (20, 16)):
    assert _evaluator(task, policy, mesh8, rules, asked, sampled=False).gb == gb


def test_only_the_real_problems_count(task, policy, ev8, monkeypatch):
  """Padding rows copy problem 0, which is marked correct: they must not count."""
  real = task.eval_problems()
  right = {real[i].question for i in (0, 3, 7)}
  half = real[1].question

  def score(ids, finished, problem):
    if problem.question in right:
      return Score(1.0, True)
    return Score(0.5 if problem.question == half else 0.0, False)

  monkeypatch.setattr(task, "score", score)
  out = ev8(policy[1], jax.random.key(1))
  for name in ("greedy", "sampled"):
    assert out[f"eval/accuracy_{name}"] == pytest.approx(3 / NUM_EVAL)
    assert out[f"eval/reward_{name}"] == pytest.approx(3.5 / NUM_EVAL)


def test_lengths_and_finished_are_means_over_the_real_problems(task, policy, ev8, spy):
  out = ev8(policy[1], jax.random.key(2))
  greedy = spy[:16]
  assert [q for q, _, _ in greedy] == [p.question for p in ev8.problems]
  # The same decode by hand, on the 10 real prompts only.
  toks, mask = rollout.prompts(task, task.eval_problems())
  r = generate(ev8.samplers["greedy"], policy[1], toks, mask, jax.random.key(2), 8)
  rtoks, rmask = rollout.host_rollout(r)
  rewards, correct, finished = rollout.score(task, task.eval_problems(), rtoks, rmask,
                                             task.tokenizer.eos_ids)
  assert out["eval/response_len_greedy"] == pytest.approx(rmask.sum() / NUM_EVAL)
  assert out["eval/finished_greedy"] == pytest.approx(finished.mean())
  assert out["eval/accuracy_greedy"] == pytest.approx(correct.mean())
  assert out["eval/reward_greedy"] == pytest.approx(rewards.mean())
  assert [f for _, _, f in greedy[:NUM_EVAL]] == finished.tolist()
  assert 0 < out["eval/response_len_greedy"] <= MAX_NEW
  assert 0 < out["eval/response_len_sampled"] <= MAX_NEW


def test_greedy_evaluation_is_deterministic_across_calls_and_generation_batches(
    policy, ev8, ev16, spy):
  a = ev8(policy[1], jax.random.key(3))
  rows_a = spy[:16]
  spy.clear()
  b = ev8(policy[1], jax.random.key(4))
  rows_b = spy[:16]
  spy.clear()
  c = ev16(policy[1], jax.random.key(5))
  rows_c = list(spy)
  assert len(rows_c) == 16  # ev16 is greedy only
  assert rows_a == rows_b == rows_c  # every row's response, not only the means
  greedy = {k: v for k, v in a.items() if k.endswith("_greedy")}
  assert greedy == {k: v for k, v in b.items() if k.endswith("_greedy")} == c
  # Copies of problem 0 in the padding answer what problem 0 answers.
  assert all(r[1:] == rows_a[0][1:] for r in rows_a[NUM_EVAL:])


def test_sampled_evaluation_follows_the_key(policy, ev8, spy):
  ev8(policy[1], jax.random.key(6))
  first = spy[16:32]
  spy.clear()
  ev8(policy[1], jax.random.key(6))
  again = spy[16:32]
  spy.clear()
  ev8(policy[1], jax.random.key(7))
  other = spy[16:32]
  assert first == again
  assert [r[1] for r in first] != [r[1] for r in other]


def test_metric_names(policy, ev8, ev16):
  sampled = ev8(policy[1], jax.random.key(8))
  greedy = ev16(policy[1], jax.random.key(8))
  assert set(greedy) == {f"eval/{k}_greedy" for k in KEYS}
  assert set(sampled) == {f"eval/{k}_{m}" for k in KEYS for m in ("greedy", "sampled")}
  for out in (sampled, greedy):
    for k, v in out.items():
      assert np.isfinite(v) and 0.0 <= v <= (MAX_NEW if "response_len" in k else 1.0), (k, v)


def test_a_call_holds_no_more_rows_than_the_set_needs(task, policy, mesh8, rules):
  """10 problems on 8 batch shards decode 16 rows per call, not the configured 512: a big
  model's evaluation of a small set must not pay for (and hold the KV cache of) 512 rows."""
  ev = _evaluator(task, policy, mesh8, rules, 512, sampled=False)
  assert ev.gb == 16 and len(ev.problems) == 16
  assert _evaluator(task, policy, mesh8, rules, 8, sampled=False).gb == 8  # smaller: kept


def test_reference_likelihood_matches_an_unsharded_forward_row_by_row(task, policy, mesh8, rules):
  """eval.reference on 8 batch shards, in calls of 8 of the 16 padded rows and with vocabulary
  chunks, against the policy's own teacher-forced log-probs of each (prompt, reference + EOS)
  row computed alone on one device without padding: the mean log-probability and the mean
  probability over the 10 real problems (float32 sums, 1e-5)."""
  from rlscale.tasks.base import turn_end_id
  ev = Evaluator(task, policy[0], mesh8, rules, max_new_tokens=MAX_NEW, generation_batch=8,
                 sampled=False, greedy=False, reference=True, logprob_chunk=8)
  got = ev(policy[1], jax.random.key(0))
  model = nnx.merge(*policy)
  tok = task.tokenizer
  want = []
  for p in task.eval_problems():
    prompt = task.prompt_ids(p)
    answer = tok.encode(task.reference_response(p)) + [turn_end_id(tok)]
    ids = np.asarray([prompt + answer], np.int32)
    lp = model.token_logprobs(ids, np.ones_like(ids, bool), len(prompt))
    want.append(float(np.sum(np.asarray(lp))))
  assert got["eval/reference_logprob"] == pytest.approx(np.mean(want), rel=1e-5)
  assert got["eval/reference_prob"] == pytest.approx(np.mean(np.exp(want)), rel=1e-5)
  ev(policy[1], jax.random.key(1))  # another evaluation compiles nothing new
  assert ev.reference[2]._cache_size() == 1

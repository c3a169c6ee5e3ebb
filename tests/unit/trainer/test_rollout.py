"""From problems to a training batch: prompts, scoring, reward metrics, the sequence batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlscale import models, tasks
from rlscale.config import sections as config_common
from rlscale.trainer import rollout
from rlscale.parallel import sharding
from rlscale.sampling import Rollout, Sampler, SamplingParams, generate
from rlscale.tasks import Problem

PAD, BOS, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def task():
  return tasks.make(config_common.task("arithmetic"))


def _ids(task, text):
  return task.tokenizer.encode(text)


def test_prompts_repeat_each_problem_in_a_row_and_left_pad(task):
  problems = [Problem("1+2=", "3"), Problem("123*4=", "492"), Problem("50-7=", "43")]
  toks, mask = rollout.prompts(task, problems, group_size=3)
  assert toks.shape == mask.shape == (9, task.max_prompt_len) and task.max_prompt_len == 9
  assert toks.dtype == np.int32 and mask.dtype == bool
  for i, p in enumerate(problems):
    ids = [BOS] + _ids(task, p.question)
    want = [PAD] * (task.max_prompt_len - len(ids)) + ids
    for r in range(3 * i, 3 * i + 3):  # copies of one problem are neighbours
      assert toks[r].tolist() == want
      assert mask[r].tolist() == [t != PAD for t in want]
  assert mask.sum(axis=1).tolist() == [5] * 3 + [7] * 3 + [6] * 3
  # group_size defaults to 1: one row per problem
  one, one_mask = rollout.prompts(task, problems)
  np.testing.assert_array_equal(one, toks[::3])
  np.testing.assert_array_equal(one_mask, mask[::3])


def _responses(task, rows, width=6):
  """Right-padded tokens and mask from (ids, junk) pairs; junk lies past the mask."""
  toks = np.full((len(rows), width), PAD, np.int32)
  mask = np.zeros((len(rows), width), bool)
  for i, (ids, junk) in enumerate(rows):
    toks[i, :len(ids)] = ids
    mask[i, :len(ids)] = True
    toks[i, len(ids):len(ids) + len(junk)] = junk  # after the mask: must be ignored
  return toks, mask


def test_score_needs_an_eos_last_and_scores_through_the_task(task):
  p = Problem("1+2=", "3")
  d = lambda s: _ids(task, s)  # noqa: E731
  rows = [
      (d("3") + [EOS], []),  # right, finished
      (d("4") + [EOS], []),  # wrong, finished
      (d("3"), []),  # right text, ran out of tokens
      (d("3") + [EOS], d("99")),  # tokens after the mask do not count
      ([], []),  # empty
      ([EOS], []),  # finished, empty answer
      (d("03") + [EOS], []),
  ]
  toks, mask = _responses(task, rows)
  rewards, correct, finished = rollout.score(task, [p] * len(rows), toks, mask, (EOS,))
  assert rewards.dtype == np.float32 and correct.dtype == bool and finished.dtype == bool
  assert finished.tolist() == [True, True, False, True, False, True, True]
  assert correct.tolist() == [True, False, False, True, False, False, task.verify("03", p).correct]
  np.testing.assert_array_equal(rewards, correct.astype(np.float32))


def test_score_passes_the_response_without_its_eos(task, monkeypatch):
  seen = []
  monkeypatch.setattr(task, "score", lambda ids, fin, prob: seen.append((list(ids), fin)) or
                      tasks.Score(0.25, False))
  toks, mask = _responses(task, [([5, 6, EOS], [7]), ([5, 6], [])])
  rewards, correct, _ = rollout.score(task, [Problem("1+2=", "3")] * 2, toks, mask, (EOS,))
  assert seen == [([5, 6], True), ([5, 6], False)]
  np.testing.assert_array_equal(rewards, [0.25, 0.25])
  assert not correct.any()


def test_score_with_another_eos_set(task):
  """`finished` follows the eos_ids given, not the tokenizer's."""
  toks, mask = _responses(task, [(_ids(task, "3") + [EOS], []), (_ids(task, "3") + [16], [])])
  _, _, finished = rollout.score(task, [Problem("1+2=", "3")] * 2, toks, mask, (16,))
  assert finished.tolist() == [False, True]


def test_score_partial_credit_comes_from_the_task():
  cfg = config_common.task("arithmetic")
  cfg.partial_credit = True
  task = tasks.make(cfg)
  p = Problem("100+23=", "123")
  toks, mask = _responses(task, [(_ids(task, s) + [EOS], []) for s in ("123", "124", "999")])
  rewards, correct, _ = rollout.score(task, [p] * 3, toks, mask, (EOS,))
  assert correct.tolist() == [True, False, False]
  assert rewards[0] == 1.0 and 0.0 < rewards[1] <= 0.5 and rewards[2] == 0.0
  assert rewards[1] == pytest.approx(task.verify("124", p).reward)


def test_garbage_tokens_score_zero_and_never_raise(task):
  """A model's vocabulary is larger than the tokenizer's: spare ids, specials, negatives."""
  p = Problem("1+2=", "3")
  rows = [([30, 31, 100, EOS], []), ([BOS, PAD, 16, 13, EOS], []), ([2**20, EOS], []),
          ([30, 31, 30, 31, 30, 31], []), ([PAD, EOS], []), ([-1, 5, EOS], [])]
  toks, mask = _responses(task, rows)
  rewards, correct, finished = rollout.score(task, [p] * len(rows), toks, mask, (EOS,))
  assert finished.tolist() == [True, True, True, False, True, True]
  np.testing.assert_array_equal(rewards, np.zeros(len(rows)))
  assert not correct.any()


def test_reward_metrics_on_a_hand_made_batch():
  # 3 groups of 2: all right, all wrong, mixed.
  rewards = np.array([1, 1, 0, 0, 1, 0], np.float32)
  correct = rewards > 0
  finished = np.array([1, 1, 1, 0, 1, 1], bool)
  lengths = [2, 3, 1, 4, 0, 2]
  resp_mask = np.arange(5)[None, :] < np.array(lengths)[:, None]
  m = rollout.reward_metrics(rewards, correct, finished, resp_mask, group_size=2)
  assert m["reward/mean"] == pytest.approx(0.5)
  assert m["reward/std"] == pytest.approx(0.5)
  assert m["reward/accuracy"] == pytest.approx(0.5)
  assert m["reward/finished"] == pytest.approx(5 / 6)
  assert m["reward/solved_groups"] == pytest.approx(1 / 3)
  assert m["reward/unsolved_groups"] == pytest.approx(1 / 3)
  assert m["response/length_mean"] == pytest.approx(2.0)
  assert m["response/length_max"] == 4 and isinstance(m["response/length_max"], int)
  assert m["response_tokens"] == 12 and isinstance(m["response_tokens"], int)
  # The same rows as groups of 3: (1, 1, 0) and (0, 1, 0) are neither solved nor unsolved.
  m3 = rollout.reward_metrics(rewards, correct, finished, resp_mask, group_size=3)
  assert m3["reward/solved_groups"] == 0.0 and m3["reward/unsolved_groups"] == 0.0
  assert m3["reward/mean"] == m["reward/mean"]


def test_reward_metrics_groups_are_consecutive_rows():
  """Rows 0..G-1 are one problem's group (rollout.prompts' order), not rows 0, P, 2P, ..."""
  rewards = np.array([1, 1, 1, 0, 0, 0], np.float32)
  mask = np.ones((6, 2), bool)
  m = rollout.reward_metrics(rewards, rewards > 0, np.ones(6, bool), mask, group_size=3)
  assert m["reward/solved_groups"] == 0.5 and m["reward/unsolved_groups"] == 0.5


@pytest.fixture(scope="module")
def mesh8():
  return sharding.make_mesh((-1, 1, 1))


def _hand_rollout(mesh, rules, b, n, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(0, n + 1, b)
  mask = np.arange(n)[None, :] < lengths[:, None]
  toks = np.where(mask, rng.integers(3, 17, (b, n)), PAD).astype(np.int32)
  lp = np.where(mask, -rng.random((b, n)), 0.0).astype(np.float32)
  put = lambda x: sharding.put_batch(x, mesh, rules)  # noqa: E731
  return Rollout(put(toks), put(lp), put(lp), put(mask), put(lengths.astype(np.int32)),
                 jnp.int32(n)), toks, mask


def test_sequence_batch_puts_prompt_and_response_side_by_side_on_the_mesh(task, mesh8, rules):
  assert mesh8.shape["data"] == 8
  problems = task.problems(0, 4)
  ptoks, pmask = rollout.prompts(task, problems, group_size=4)  # 16 rows, 2 per device
  out, rtoks, rmask = _hand_rollout(mesh8, rules, 16, 5)
  seq = rollout.sequence_batch(ptoks, pmask, out, mesh8, rules)
  p = task.max_prompt_len
  assert seq.tokens.shape == (16, p + 5) and seq.mask.shape == (16, p + 5)
  assert seq.resp_mask.shape == (16, 5) and seq.extras == {}
  assert seq.tokens.dtype == jnp.int32 and seq.mask.dtype == jnp.bool_
  np.testing.assert_array_equal(np.asarray(seq.tokens), np.concatenate([ptoks, rtoks], 1))
  np.testing.assert_array_equal(np.asarray(seq.mask), np.concatenate([pmask, rmask], 1))
  np.testing.assert_array_equal(np.asarray(seq.resp_mask), rmask)
  # The prompt's last real token sits right before the response's first.
  np.testing.assert_array_equal(np.asarray(seq.mask)[:, p - 1], True)
  want = sharding.batch_sharding(mesh8, 2, rules)
  for x in (seq.tokens, seq.mask, seq.resp_mask):
    assert x.sharding.is_equivalent_to(want, 2), x.sharding
    assert {s.data.shape[0] for s in x.addressable_shards} == {2}
    assert len({s.device for s in x.addressable_shards}) == 8
  toks, mask = rollout.host_rollout(out)
  assert isinstance(toks, np.ndarray) and isinstance(mask, np.ndarray)
  np.testing.assert_array_equal(toks, rtoks)
  np.testing.assert_array_equal(mask, rmask)


def test_sequence_batch_of_sampled_responses_scores_end_to_end(task, mesh8, rules):
  """The tiny model's sampler on 8 devices: a Rollout the batch and the scorer both accept."""
  cfg = models.named("tiny", vocab_size=32, d_model=64, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=32, mlp_dim=128)
  policy = models.create_sharded(models.CausalLM, cfg, mesh8, rules, jax.random.key(0))
  graphdef, state = nnx.split(policy)
  tok = task.tokenizer
  sampler = Sampler(graphdef, SamplingParams(max_new_tokens=4, temperature=1.0, eos_ids=tok.eos_ids,
                                             pad_id=tok.pad_id), mesh8, rules)
  ptoks, pmask = rollout.prompts(task, task.problems(0, 2), group_size=4)
  out = generate(sampler, state, ptoks, pmask, jax.random.key(1))
  seq = rollout.sequence_batch(ptoks, pmask, out, mesh8, rules)
  rtoks, rmask = rollout.host_rollout(out)
  assert seq.tokens.shape == (8, task.max_prompt_len + 4)
  np.testing.assert_array_equal(np.asarray(seq.tokens)[:, task.max_prompt_len:], rtoks)
  np.testing.assert_array_equal(np.asarray(seq.mask)[:, task.max_prompt_len:], rmask)
  np.testing.assert_array_equal(rmask.sum(1), np.asarray(out.lengths))
  problems = [p for p in task.problems(0, 2) for _ in range(4)]
  rewards, correct, finished = rollout.score(task, problems, rtoks, rmask, tok.eos_ids)
  ends = rtoks[np.arange(8), np.maximum(rmask.sum(1) - 1, 0)]
  np.testing.assert_array_equal(finished, (rmask.sum(1) > 0) & (ends == EOS))
  assert set(rewards.tolist()) <= {0.0, 1.0} and (rewards == correct).all()


def test_solved_groups_count_correct_responses_not_partial_credit():
  """With task.partial_credit a response can earn reward without being correct."""
  rewards = np.array([0.5, 0.5, 1.0, 1.0], np.float32)
  correct = np.array([False, False, True, True])
  m = rollout.reward_metrics(rewards, correct, np.ones(4, bool), np.ones((4, 3), bool), 2)
  assert m["reward/solved_groups"] == 0.5 and m["reward/unsolved_groups"] == 0.5
  assert m["reward/std"] == pytest.approx(np.std(rewards))

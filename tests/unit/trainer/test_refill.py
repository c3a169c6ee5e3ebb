"""Dynamic sampling: which groups carry signal, which fill the step, and the rounds that find
them (hand-made rewards through a stub sampler and task)."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlscale.config.errors import ConfigError
from rlscale.parallel import sharding
from rlscale.sampling import Rollout
from rlscale.tasks import Problem
from rlscale.tasks.base import Score
from rlscale.trainer import group_filter as gf
from rlscale.trainer.refill import Refill

EOS = 2


def test_group_signal_names_why_a_group_carries_none():
  rewards = [[1, 1, 1], [0, 0, 0], [0.5, 0.5, 0.5], [1, 0, 1], [0.5, 0.6, 0.5]]
  correct = [[1, 1, 1], [0, 0, 0], [0, 1, 0], [1, 0, 1], [0, 0, 0]]
  codes = gf.group_signal(rewards, correct)
  assert codes.tolist() == [gf.SOLVED, gf.UNSOLVED, gf.EQUAL, gf.INFORMATIVE, gf.INFORMATIVE]
  # The std (ddof=1) of [0.5, 0.6, 0.5] is 0.0577: at or under the bound, filtered.
  codes = gf.group_signal(rewards, correct, min_std=0.06)
  assert codes.tolist() == [gf.SOLVED, gf.UNSOLVED, gf.EQUAL, gf.INFORMATIVE, gf.LOW_STD]
  f = gf.reason_fractions(codes)
  assert f == {"rollout/uninformative_groups": 0.8, "rollout/uninformative_solved": 0.2,
               "rollout/uninformative_unsolved": 0.2, "rollout/uninformative_equal": 0.2,
               "rollout/uninformative_low_std": 0.2}


def test_slots_hold_the_first_p_informative_groups_of_the_stream():
  I, S, U = gf.INFORMATIVE, gf.SOLVED, gf.UNSOLVED
  slots = gf.Slots(4)
  assert slots.offer(np.array([I, S, I])) == {0: 0, 1: 1, 2: 2}
  assert slots.missing == 2
  # group 3 (unsolved) takes the last slot; group 4 fills the first hole (slot 1); group 5
  # the next (slot 3): a slot written twice in one offer is written once, by its last group.
  assert slots.offer(np.array([U, I, I, I])) == {1: 4, 3: 5}
  assert slots.owner.tolist() == [0, 4, 2, 5] and slots.informative.all()
  assert slots.missing == 0 and slots.dropped_informative == 1  # group 6 found no hole


def test_prompts_to_send_follows_the_filtered_fraction_within_its_bound():
  assert gf.prompts_to_send(8, 0.0, "auto") == 8
  assert gf.prompts_to_send(8, 0.5, "auto") == 16
  assert gf.prompts_to_send(8, 0.99, "auto") == 8 * gf.MAX_OVERSAMPLE
  assert gf.prompts_to_send(3, 0.9, 1) == 3 and gf.prompts_to_send(3, 0.0, 1.5) == 5


# --- the rounds, through a stub sampler whose response names its row ---

class _Task:
  """Problem i of the stream; row r's response is the token r + 10 and scores REWARDS[r]."""
  max_prompt_len = 2
  tokenizer = types.SimpleNamespace(eos_ids=(EOS,), pad_id=0)

  def __init__(self, rewards_by_row):
    self.rewards = rewards_by_row

  def problems(self, start, n):
    return [Problem(f"q{i}", "", meta=i) for i in range(start, start + n)]

  def prompt_ids(self, p):
    return [1, 3 + p.meta % 5]

  def score(self, ids, finished, p):
    r = self.rewards[int(ids[0]) - 10]
    return Score(float(r), r == 1.0)


class _Sampler:
  def __init__(self, mesh, rules, n=3):
    self.mesh, self.rules, self.n, self.calls = mesh, rules, n, []

  def __call__(self, params, tokens, mask, key, ids, group):
    self.calls.append(np.asarray(ids))
    b = len(ids)
    toks = np.zeros((b, self.n), np.int32)
    toks[:, 0], toks[:, 1] = np.asarray(ids) + 10, EOS
    m = np.zeros((b, self.n), bool)
    m[:, :2] = True
    put = lambda x: sharding.put_batch(x, self.mesh, self.rules)  # noqa: E731
    lp = put(-np.asarray(ids, np.float32)[:, None] * m)
    return Rollout(put(toks), lp, lp, put(m), put(m.sum(1).astype(np.int32)),
                   jnp.int32(self.n))


def _refill(rewards, mesh, rules, P=4, G=2, gb=4, **ro):
  ro = types.SimpleNamespace(**{"filter_min_std": 0.0, "max_rounds": 4, "oversample": 1, **ro})
  sampler = _Sampler(mesh, rules)
  return Refill(sampler, _Task(rewards), P, G, gb, ro, rules), sampler


@pytest.fixture(scope="module")
def mesh2():
  return sharding.make_mesh((2, 1, 1), devices=jax.devices()[:2])


def _run(refill, stream_first=0):
  key = jax.random.key(0)
  calls = refill.first_round(None, key, stream_first)
  return refill.run(None, key, stream_first, calls, 0.0)


def test_a_step_trains_on_exactly_the_first_p_informative_groups(mesh2, rules):
  # Groups of G=2 (rows 2g, 2g+1), 2 prompts per call; informative: 0, 2, 4, 5, 6.
  groups = [(1, 0), (1, 1), (0, 1), (0, 0), (0, 1), (1, 0), (1, 0), (0, 0)]
  refill, sampler = _refill([r for g in groups for r in g], mesh2, rules)
  f = _run(refill)
  # Round 1: calls of groups 0-1 and 2-3 (P=4 prompts, oversample 1): holes at 1 and 3.
  # Round 2 asks for 2 more groups: one call (4, 5) fills both; no round 3.
  assert [c.tolist() for c in sampler.calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
  assert f.rounds == 2 and f.calls == 3 and f.dropped_informative == 0
  assert f.trained.tolist() == [True] * 4
  want_groups = [0, 4, 2, 5]  # slot -> group
  rows = [2 * g + k for g in want_groups for k in range(2)]
  np.testing.assert_array_equal(np.asarray(f.tokens)[:, 0], np.array(rows) + 10)
  np.testing.assert_array_equal(np.asarray(f.logprobs)[:, 0], -np.array(rows, np.float32))
  assert np.asarray(f.mask)[:, :2].all() and not np.asarray(f.mask)[:, 2].any()
  assert [p.meta for p in f.problems] == want_groups  # the prompts follow their groups
  np.testing.assert_array_equal(f.rewards, [groups[g][k] for g in want_groups for k in range(2)])
  assert refill.traces == 1  # one compiled scatter for every call


def test_when_the_rounds_run_out_the_holes_carry_no_loss(mesh2, rules):
  groups = [(1, 0), (1, 1), (0, 0), (1, 1)] + [(0, 0)] * 20
  refill, sampler = _refill([r for g in groups for r in g], mesh2, rules, max_rounds=2)
  f = _run(refill)
  assert f.rounds == 2 and f.calls == 2 + 2  # round 2 asks for the 3 missing: 2 calls
  assert f.trained.tolist() == [True, False, False, False]
  mask = np.asarray(f.mask)
  assert mask[:2, :2].all() and not mask[2:].any()  # holes keep their group, without loss
  np.testing.assert_array_equal(np.asarray(f.tokens)[:, 0], np.arange(8) + 10)
  assert [p.meta for p in f.problems] == [0, 1, 2, 3]


def test_the_stream_position_and_the_filtered_fraction_carry_over(mesh2, rules):
  groups = [(1, 0), (1, 1), (0, 1), (0, 0)] * 10
  refill, sampler = _refill([r for g in groups for r in g], mesh2, rules, oversample="auto")
  assert refill.estimate() == 0.0
  f = _run(refill)
  assert refill.estimate() == pytest.approx(np.mean([c != 0 for c in
                                                     f.groups.cat("codes")]))
  # Half the groups are filtered: round 1 of the next step sends 2P prompts (4 calls).
  sampler.calls.clear()
  state = refill.state()
  again, _ = _refill([r for g in groups for r in g], mesh2, rules, oversample="auto")
  again.load(state)
  assert again.calls_for(4, again.estimate()) == 4
  first = refill.first_round(None, jax.random.key(0), 8)
  assert first.planned == 4 and len(first.calls) == 2  # two in flight; the rest as they end
  assert sampler.calls[0].tolist() == [0, 1, 2, 3]  # rows of the step
  assert [p.meta for p in first.calls[0].problems] == [8, 9]  # from the stream position


def test_a_round_stops_sending_calls_once_nothing_is_missing(mesh2, rules):
  groups = [(1, 0)] * 40  # every group informative
  refill, sampler = _refill([r for g in groups for r in g], mesh2, rules, oversample=4)
  f = _run(refill)
  # Round 1 plans 8 calls (4 x P prompts); the first two (in flight together) fill the step.
  assert f.rounds == 1 and f.calls == 2 and len(sampler.calls) == 2
  assert f.dropped_informative == 0 and f.trained.all()


def test_a_call_must_hold_whole_groups(mesh2, rules):
  with pytest.raises(ConfigError, match=r"rollout.generation_batch=6 must be a multiple of "
                                        r"rl.group_size x processes \(4 x 1\)"):
    _refill([0] * 8, mesh2, rules, G=4, gb=6)

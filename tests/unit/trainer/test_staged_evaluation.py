"""Evaluation in stages (eval.adaptive): what it scores, when it stops, and what it does to the
study's crossings.

A row's sample depends only on the evaluation's key and the row's index, so the stages score
exactly the rows a whole-set evaluation scores; the stop rule only chooses how many. Its cost
is paid in precision away from the target (where the crossing does not need it), and the
simulation below bounds what that does to a study's crossings: less than the band's
equivalent (the responses over which the curve climbs the band of 0.05), in the median and in
95% of runs.
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from rlscale import models, tasks
from rlscale.config import sections as config_common
from rlscale.metrics import crossing
from rlscale.parallel import lanes as lanes_lib
from rlscale.parallel import sharding
from rlscale.trainer.evaluation import Evaluator, Stop, is_settled

NUM_EVAL, GB = 40, 8  # stages of 8, 16, 32 and 40 rows


@pytest.fixture(scope="module")
def setup(rules):
  cfg = config_common.task("arithmetic")
  cfg.digits, cfg.num_eval = 2, NUM_EVAL
  task = tasks.make(cfg)
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  model_cfg = models.named("tiny", vocab_size=32, d_model=64, num_layers=2, num_heads=2,
                           num_kv_heads=1, head_dim=32, mlp_dim=128)
  graphdef, params = nnx.split(models.create_sharded(models.CausalLM, model_cfg, mesh, rules,
                                                     jax.random.key(0)))
  ev = Evaluator(task, graphdef, mesh, rules, max_new_tokens=4, generation_batch=GB,
                 sampled=True, greedy=True)
  return task, mesh, graphdef, params, ev


def test_stages_double_to_the_whole_set(setup):
  assert setup[4].stages() == [8, 16, 32, 40]


def test_the_whole_set_in_stages_is_the_whole_set_at_once(setup):
  """A target no stage can settle (z huge): every stage runs, and the metrics are exactly the
  whole-set evaluation's, greedy and sampled."""
  *_, params, ev = setup
  key = jax.random.key(3)
  whole = ev(params, key)
  staged = ev(params, key, Stop("eval/accuracy_sampled", 0.5, z=1e9))
  assert staged.pop("eval/rows") == NUM_EVAL
  assert staged == whole


def test_a_stage_scores_the_rows_the_whole_set_scores_there(setup, monkeypatch):
  """first_only: the first 8 rows, each scored as in the whole-set evaluation."""
  task, *_, params, ev = setup
  seen = []
  score = task.score
  monkeypatch.setattr(task, "score", lambda ids, fin, p: seen.append((p.question, tuple(ids)))
                      or score(ids, fin, p))
  key = jax.random.key(4)
  ev(params, key)
  whole = seen[:]
  seen.clear()
  out = ev(params, key, Stop("eval/accuracy_sampled", 0.5, first_only=True))
  assert out["eval/rows"] == GB
  per_sampler = len(whole) // 2  # greedy rows then sampled rows, each of the padded set
  for name, offset in (("greedy", 0), ("sampled", per_sampler)):
    assert seen[offset // per_sampler * GB:][:GB] == whole[offset:offset + GB], name


def test_the_stop_rule():
  # 0.5 +- 2 standard errors of 0.41 on 250 rows (0.031): settled; 0.44 is not.
  assert is_settled(125, 250, 0.41, 2.0) and not is_settled(110, 250, 0.41, 2.0)
  assert is_settled(50, 250, 0.41, 2.0)  # far below
  assert not is_settled(820, 2000, 0.41, 2.0)


def _side_by_side(task, mesh, graphdef):
  """Two lanes' evaluator, the same evaluator alone, the lanes' keys and their stacked form."""
  lanes = lanes_lib.Lanes(2)
  kw = dict(max_new_tokens=4, generation_batch=GB, sampled=True, greedy=False)
  rules = sharding.rules_from_config(None)
  side = Evaluator(task, graphdef, mesh, rules, lanes=lanes, **kw)
  alone = Evaluator(task, graphdef, mesh, rules, **kw)
  keys = [jax.random.key(5), jax.random.key(6)]
  stacked = lanes.map(jax.random.wrap_key_data, (True,))(
      lanes.stack([jax.random.key_data(k) for k in keys]))
  return lanes, side, alone, keys, stacked


def test_runs_side_by_side_stop_each_lane_where_it_would_alone(setup):
  task, mesh, graphdef, params, ev = setup
  lanes, side, alone, keys, stacked = _side_by_side(task, mesh, graphdef)
  for stop in (Stop("eval/accuracy_sampled", 0.0, z=2.0),  # settles at once
               Stop("eval/accuracy_sampled", 0.5, z=1e9)):  # never: the whole set
    got = side(lanes.broadcast(params), stacked, stop)
    assert got == [alone(params, k, stop) for k in keys]


def test_side_by_side_each_lane_has_its_own_first_only(setup):
  """A lane past its target scores the first stage alone; one beside it that has not reached
  it is scored in stages as it would be alone (lanes no longer share lane 0's state)."""
  task, mesh, graphdef, params, ev = setup
  lanes, side, alone, keys, stacked = _side_by_side(task, mesh, graphdef)
  never = Stop("eval/accuracy_sampled", 0.5, z=1e9)
  got = side(lanes.broadcast(params), stacked,
             dataclasses.replace(never, first_only=(True, False)))
  assert got[0]["eval/rows"] == GB and got[1]["eval/rows"] == NUM_EVAL
  assert got[0] == alone(params, keys[0], dataclasses.replace(never, first_only=True))
  assert got[1] == alone(params, keys[1], never)
  with pytest.raises(ValueError, match="first_only for 3"):
    side(lanes.broadcast(params), stacked, dataclasses.replace(never, first_only=(1, 0, 0)))


def test_an_evaluation_in_stages_needs_the_targets_metric(setup):
  *_, params, ev = setup
  with pytest.raises(ValueError, match="eval/accuracy_greedy among"):
    Evaluator(setup[0], setup[2], setup[1], sharding.rules_from_config(None),
              max_new_tokens=4, generation_batch=GB, sampled=True, greedy=False)(
                  params, jax.random.key(0), Stop("eval/accuracy_greedy", 0.5))


# --- what stages do to a study's crossings (simulation) ---

def _curve(x, base, plateau, c_mid):
  return base + (plateau - base) / (1 + (c_mid / np.maximum(x, 1e-9)) ** 1.5)


def _crossings(rng, c_mid, spacing, target, n=2000, first=250, z=2.0):
  """(crossing of whole-set evaluations, crossing of staged ones) of one simulated run: each
  mark's held-out outcomes are one draw of n problems; the stages read prefixes of it."""
  x = np.arange(0, 3 * c_mid, spacing, dtype=float)
  p = _curve(x, 0.15, 0.55, c_mid)
  outcomes = rng.random((x.size, n)) < p[:, None]
  whole = outcomes.mean(axis=1)
  staged, reached = [], False
  stages = [first * 2 ** k for k in range(10) if first * 2 ** k < n] + [n]
  for row in outcomes:
    for rows in (stages[:1] if reached else stages):
      hits = row[:rows].sum()
      if rows == n or reached or is_settled(hits, rows, target, z):
        break
    staged.append(hits / rows)
    reached |= staged[-1] >= target
  return (crossing.first_crossing(x, whole, target),
          crossing.first_crossing(x, np.array(staged), target), x)


@pytest.mark.parametrize("c_mid, spacing", [(600, 128), (1200, 128), (2400, 256)])
def test_stages_move_the_study_crossings_by_less_than_the_bands_equivalent(c_mid, spacing):
  """The study's regime: curves from 0.15 to 0.55 crossing the target 0.41 after 6-15
  evaluations, 2,000 problems, stages of 250, 500, 1,000, 2,000 rows at z = 2. Over 300 runs,
  the staged crossing differs from the whole-set one by less than 10% of the band's equivalent
  in the median and by less than the band's equivalent in 95% of runs."""
  target = 0.41
  rng = np.random.default_rng(c_mid)
  x0 = np.linspace(1, 3 * c_mid, 100000)
  y0 = _curve(x0, 0.15, 0.55, c_mid)
  i = np.argmax(y0 >= target)
  band = 0.05 / np.gradient(y0, x0)[i]  # responses over which the curve climbs 0.05 there
  diffs = []
  for _ in range(300):
    whole, staged, _ = _crossings(rng, c_mid, spacing, target)
    diffs.append(staged - whole)
  diffs = np.abs(np.array(diffs))
  assert np.median(diffs) < 0.1 * band, (np.median(diffs), band)
  assert np.quantile(diffs, 0.95) < band, (np.quantile(diffs, 0.95), band)

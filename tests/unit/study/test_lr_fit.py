"""The joint fit of E(B, lr) (rlscale/study/lr_fit.py) on synthetic scans of known answer."""

import math

import numpy as np
import pytest

from rlscale.study import lr_fit
from rlscale.study import study

SIGMA = 0.28  # the CPU study's measured seed-to-seed spread of log responses to target
BATCHES = (8, 16, 32, 64, 128, 256)
B0, LR0 = 16, 1e-4


def _grid(b):
  """5 rates sqrt(2) apart centred on LR0 (B/B0)^(1/4) (configs/grpo_chain_sum.lr_grid)."""
  centre = math.floor(math.log2(b / B0) / 2 + 0.5)
  return [LR0 * 2 ** ((centre + d) / 2) for d in range(-2, 3)]


def _surface(rng):
  """A random true surface: E(B) = E_min (1 + B / B_crit); curvature a in log lr; the optimum
  lr*(B) = l0 (B/B0)^beta, l0 off the grid by up to half a step, beta 0.2-0.6."""
  b_crit = rng.uniform(30, 200)
  a = rng.uniform(0.8, 2.0)
  beta = rng.uniform(0.2, 0.6)
  l0 = math.log(LR0) + rng.uniform(-0.5, 0.5) * math.log(2) / 2

  def log_e(b, lr):
    opt = l0 + beta * math.log(b / B0)
    return math.log(1000 * (1 + b / b_crit)) + a * (math.log(lr) - opt) ** 2

  def best(b):
    return l0 + beta * math.log(b / B0)
  return log_e, best, b_crit


def _scan(rng, log_e, seeds=3):
  return {(float(b), lr): np.exp(log_e(b, lr) + SIGMA * rng.standard_normal(seeds))
          for b in BATCHES for lr in _grid(b)}


def _fitted(rng):
  """A random surface, its scan, the joint fit and its choice per batch."""
  log_e, best, b_crit = _surface(rng)
  values = _scan(rng, log_e)
  f, why = lr_fit.fit(values, set(values))
  assert f is not None, why
  return log_e, best, b_crit, values, lr_fit.choose(f, {float(b): _grid(b) for b in BATCHES})


def _nearest(b, x):
  return min(_grid(b), key=lambda lr: abs(math.log(lr) - x))


def test_the_fit_recovers_a_noiseless_surface():
  log_e, best, _ = _surface(np.random.default_rng(3))
  values = {(float(b), lr): np.full(3, math.exp(log_e(b, lr))) for b in BATCHES
            for lr in _grid(b)}
  f, why = lr_fit.fit(values, set(values), sigma=SIGMA)
  assert f is not None, why
  for b in BATCHES:
    assert f.vertex(b) == pytest.approx(best(b), abs=1e-6)
  assert f.resid_sd < 1e-6


def test_the_fit_picks_the_rate_nearest_the_optimum_in_most_draws():
  """400 random surfaces, 3 seeds a rate: the joint fit picks the scan's rate nearest the true
  optimum at >= 80% of batches, and more often than choosing batch by batch (study.choose)."""
  rng = np.random.default_rng(0)
  joint = per_batch = total = 0
  for _ in range(400):
    _, best, _, values, chosen = _fitted(rng)
    for b in BATCHES:
      truth = _nearest(b, best(b))
      joint += chosen[float(b)] == truth
      runs = [{"overrides": {"lr": lr}, "responses_to_target": float(e), "final": 0.5}
              for (bb, lr), v in values.items() if bb == b for e in v]
      per_batch += study.choose(runs, "lr")[0] == truth
      total += 1
  print(f"nearest rate picked: joint fit {joint / total:.3f}, batch by batch "
        f"{per_batch / total:.3f}")
  assert joint / total >= 0.8
  assert joint > per_batch


def test_the_corrected_ratio_covers_the_ratio_at_the_optimum():
  """The verdict at the chosen rate (10 seeds a batch), corrected by the fit to the optimum,
  its one-sided 95% bounds widened by the spread of the corrections' difference: the true
  E*(B)/E*(B0) lies below the upper bound in >= 93% and above the lower in >= 93% of the 400
  (draw, batch) pairs (nominal 95%; the share's standard error at 95% is 1.1%)."""
  from analysis import bracket
  rng = np.random.default_rng(1)
  below = above = total = 0
  for _ in range(80):
    log_e, _, b_crit, values, chosen = _fitted(rng)
    point, draws, failed = lr_fit.corrections(values, set(values), chosen, reps=100,
                                              seed=int(rng.integers(1 << 30)))
    assert failed <= 10
    verdict = {b: np.exp(log_e(b, chosen[float(b)]) + SIGMA * rng.standard_normal(10))
               for b in BATCHES}
    i0 = sorted(chosen).index(float(B0))
    for j, b in enumerate(sorted(chosen)):
      if b == B0:
        continue
      shift = point[b] - point[float(B0)]
      var = float(np.var(draws[:, j] - draws[:, i0], ddof=1))
      lo, hi = bracket.log_bounds(verdict[int(b)], verdict[B0], shift=shift, extra_var=var)
      truth = (1 + b / b_crit) / (1 + B0 / b_crit)
      below += truth <= hi
      above += truth >= lo
      total += 1
  print(f"one-sided coverage: upper {below / total:.3f}, lower {above / total:.3f}")
  assert below / total >= 0.93 and above / total >= 0.93


def test_the_fit_says_when_it_does_not_hold():
  rng = np.random.default_rng(2)
  log_e, _, _ = _surface(rng)
  values = _scan(rng, log_e)
  # Flat in lr: no curvature.
  flat = {k: np.full(3, 1000.0) * np.exp(0.01 * rng.standard_normal(3)) for k in values}
  f, why = lr_fit.fit(flat, set(flat), sigma=SIGMA)
  assert f is None and "curvature" in why
  # Batches whose optima do not move as a power of B: residuals far beyond the seeds'.
  zigzag = {(b, lr): np.full(3, math.exp(log_e(b, lr) + 3.0 * (-1) ** BATCHES.index(int(b))
                                        * math.log(lr / LR0)))
            for (b, lr) in values}
  f, why = lr_fit.fit(zigzag, set(zigzag), sigma=SIGMA)
  assert f is None and "lack of fit" in why
  # Too few cells reached the target.
  sparse = {k: (v if k[1] == _grid(int(k[0]))[2] else np.full(3, math.inf))
            for k, v in values.items()}
  f, why = lr_fit.fit(sparse, set(sparse), sigma=SIGMA)
  assert f is None and "needs" in why


def test_the_study_chooses_every_batch_at_once_and_records_the_correction():
  """study.joint_choice on a scan's runs as stage_results gives them: every group gets the
  rate nearest the fitted optimum, its correction and the corrections' covariance; a scan
  whose runs do not say their batch is not identified, naming why."""
  rng = np.random.default_rng(4)
  log_e, best, _ = _surface(rng)
  values = _scan(rng, log_e)
  groups = {}
  for (b, lr), v in values.items():
    groups.setdefault(f"p={int(b) // 8}", []).extend(
        {"overrides": {"p": int(b) // 8, "lr": lr}, "batch": int(b),
         "responses_to_target": float(e), "final": 0.5} for e in v)
  tables = {g: study.choose(runs, "lr")[1] for g, runs in groups.items()}
  joint = study.joint_choice(groups, tables, "lr", reps=100)
  assert joint["identified"], joint["why"]
  f, _ = lr_fit.fit(values, set(values))
  want = lr_fit.choose(f, {float(b): _grid(b) for b in BATCHES})
  assert joint["values"] == {f"p={b // 8}": want[float(b)] for b in BATCHES}
  assert joint["order"] == [f"p={b // 8}" for b in BATCHES]
  cov = np.asarray(joint["covariance"])
  assert cov.shape == (6, 6) and np.all(np.diag(cov) >= 0)
  assert all(c >= 0 for c in joint["correction"].values())
  json_ok = __import__("json").dumps(joint)  # recorded in study.json as it is
  assert "NaN" not in json_ok
  for runs in groups.values():
    for r in runs:
      r["batch"] = None
  lost = study.joint_choice(groups, tables, "lr")
  assert not lost["identified"] and "batch size" in lost["why"]


def test_the_verdict_runs_a_batch_own_choice_beside_the_joint_one_where_they_differ():
  alone = {"p=1": 1e-4, "p=2": 2e-4, "p=4": 2e-4}
  joint = {"p=1": 1e-4, "p=2": 1.41e-4, "p=4": 2e-4}
  values, second = study.with_joint(alone, joint)
  assert values == joint
  assert second == {"p=1": 1e-4, "p=2": 2e-4, "p=4": 2e-4}  # a second point at p=2 only

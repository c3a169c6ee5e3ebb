"""rlscale/study/power.py: the seeds a verdict needs, against simulated bootstrap verdicts."""

import numpy as np
import pytest

from analysis import stats
from rlscale.study import power


def test_seeds_needed_inverts_the_power():
  n = power.seeds_needed(0.28, 1.5, 0.2)
  assert power.p_broken(1.5, 0.28, n, tolerance=0.2) >= 0.8
  assert power.p_broken(1.5, 0.28, n - 1, tolerance=0.2) < 0.8
  n = power.seeds_needed(0.28, 1.0, 0.2, invariant=True)
  assert power.p_invariant(1.0, 0.28, n, tolerance=0.2) >= 0.8
  with pytest.raises(ValueError, match="cannot settle"):
    power.seeds_needed(0.28, 1.0, 0.2)


def test_the_formula_agrees_with_bootstrap_verdicts():
  """The report's verdict: the bootstrap interval of the ratio of medians (90% two-sided, so
  each bound one-sided 95%). At 10 seeds a side, spread 0.28, a true ratio 1.5 settles as
  broken (lower bound > 1.2) in the share the formula says, within 0.1 over 300 draws."""
  rng = np.random.default_rng(0)
  hits, draws = 0, 300
  for i in range(draws):
    a = 1.5 * np.exp(0.28 * rng.standard_normal(10))
    r = np.exp(0.28 * rng.standard_normal(10))
    hits += stats.ratio_interval(a, r, level=0.9, reps=400, seed=i).lo > 1.2
  predicted = power.p_broken(1.5, 0.28, 10, tolerance=0.2)
  assert abs(hits / draws - predicted) < 0.1, (hits / draws, predicted)


def test_pooled_spread_leaves_out_what_never_crossed():
  sigma, dof = power.pooled_spread([[1.0, np.e], [np.inf, 2.0, 2.0 * np.e], [5.0]])
  assert dof == 2 and sigma == pytest.approx(np.sqrt(0.5))

"""analysis/stats.py: IQM, median and bootstrap intervals on hand-computed numbers."""

import math
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "analysis"))
import stats  # noqa: E402

INF = float("inf")


def test_iqm_and_median_by_hand():
  # n=8: int(0.25*8)=2 cut from each end -> mean(3, 4, 5, 6).
  assert stats.iqm(range(1, 9)) == 4.5
  # n=10: 2 cut from each end -> mean(3..8); the outlier 1000 does not count.
  assert stats.iqm([1, 2, 3, 4, 5, 6, 7, 8, 9, 1000]) == 5.5
  # n=6: 1 cut from each end -> mean(0, 1, 2, 3).
  assert stats.iqm([0, 0, 1, 2, 3, 100]) == 1.5
  assert stats.median([5, 1, 3]) == 3
  assert stats.median([1, 2, 3, 10]) == 2.5
  assert stats.STATS["iqm"] is stats.iqm and stats.STATS["median"] is stats.median


def test_inf_is_a_run_that_never_got_there():
  assert stats.iqm([1, 2, 3, INF]) == 2.5          # the inf is trimmed
  assert stats.iqm([1, 2, INF, INF]) == INF        # the middle includes an inf
  assert stats.median([1, 2, INF]) == 2
  assert stats.median([1, INF, INF]) == INF
  point, lo, hi = stats.bootstrap_interval([1, 2, 3, 4, 5, INF], reps=300)
  assert point == 3.5 and math.isfinite(lo) and hi == INF


def test_nan_and_empty_are_refused():
  with pytest.raises(ValueError, match="NaN"):
    stats.iqm([1.0, float("nan"), 2.0])
  with pytest.raises(ValueError, match="empty"):
    stats.median([])
  with pytest.raises(ValueError, match="stat='mean'"):
    stats.bootstrap_interval([1, 2, 3], stat="mean")


def test_bootstrap_one_seed_is_unknown_and_seeded_is_deterministic():
  p, lo, hi = stats.bootstrap_interval([0.7], reps=300)
  assert p == 0.7 and math.isnan(lo) and math.isnan(hi)
  x = np.random.default_rng(1).normal(size=12)
  a = stats.bootstrap_interval(x, reps=300, seed=3)
  assert a == stats.bootstrap_interval(x, reps=300, seed=3)
  assert a[1] <= a[0] <= a[2] and a[1] < a[2]


def test_bootstrap_interval_covers_the_true_median():
  # Exponential(1) has median ln 2. Over 100 data sets of 25 seeds, a 95% interval should cover
  # it about 95 times; the percentile bootstrap of a median runs a little low at this n, so we
  # accept 85..100 (a broken interval, e.g. one around the mean 1.0, covers it far less often).
  rng = np.random.default_rng(0)
  covered = 0
  for i in range(100):
    _, lo, hi = stats.bootstrap_interval(rng.exponential(size=25), "median", reps=300, seed=i)
    covered += lo <= math.log(2) <= hi
  assert 85 <= covered <= 100


def test_stratified_bootstrap_keeps_strata_apart():
  groups = {"b16": [1.0, 1.1, 0.9, 1.05], "b64": [10.0, 11.0, 9.0, 10.5], "b256": [3.0]}
  out = stats.stratified_bootstrap(groups, reps=300, seed=0)
  assert list(out) == list(groups)
  # Resampled within itself, a stratum's interval stays inside its own values.
  for key in ("b16", "b64"):
    p, lo, hi = out[key]
    assert min(groups[key]) <= lo <= p <= hi <= max(groups[key])
  assert out["b256"][0] == 3.0 and math.isnan(out["b256"][1])
  # Appending a configuration does not move the intervals of the earlier ones.
  more = stats.stratified_bootstrap({**groups, "b1024": [5.0, 6.0]}, reps=300, seed=0)
  for k in groups:
    np.testing.assert_equal(more[k], out[k])   # nan == nan here


def test_ratio_interval():
  # iqm([2,4,6,8]) = mean(4, 6) = 5; iqm([1,2,3,4]) = 2.5.
  p, lo, hi = stats.ratio_interval([2, 4, 6, 8], [1, 2, 3, 4], reps=300)
  assert p == 2.0 and lo < 2.0 < hi
  # Known ratio of medians: 2.0 (log-normal with the same spread, median 2 vs 1).
  rng = np.random.default_rng(5)
  x, r = 2 * rng.lognormal(0, 0.1, 20), rng.lognormal(0, 0.1, 20)
  p, lo, hi = stats.ratio_interval(x, r, "median", reps=300)
  assert lo <= 2.0 <= hi and hi - lo < 0.3
  assert stats.ratio_interval([INF, INF, INF], [1, 2, 3], reps=300)[0] == INF
  assert math.isnan(stats.ratio_interval([1, 2], [3], reps=300)[1])


def test_overlaps():
  assert stats.overlaps((0, 1), (0.5, 2))
  assert stats.overlaps((0, 1), (1, 2))                # touching counts
  assert not stats.overlaps((0, 1), (1.5, 2))
  assert not stats.overlaps((5.0, 4.0, 6.0), (1.0, 0.5, 1.5))   # (point, lo, hi)
  assert stats.overlaps((5.0, float("nan"), float("nan")), (1.0, 0.5, 1.5))

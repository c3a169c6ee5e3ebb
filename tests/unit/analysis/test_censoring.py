"""analysis/stats.py on runs that never reached the target: right-censored at their budget, the
Kaplan-Meier median, ratio intervals that keep every resample (none dropped, none silently 0),
the coverage they have at the study's seed counts and censored shares, and no interval at n = 1.
Answers are hand-computed or binomial probabilities; tolerances were set before the first run."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from analysis import stats

INF = math.inf


def test_km_median_is_the_median_without_censoring():
  """No censoring, or censored runs with no budget (inf: beyond every value): the ordinary
  median, ties and even counts included (the midpoint where the survival sits at 1/2)."""
  rng = np.random.default_rng(0)
  for _ in range(2000):
    n = int(rng.integers(1, 10))
    x = np.round(rng.uniform(0, 10, n))                         # ties
    x[rng.random(n) < 0.3] = INF
    assert stats.km_median(x) == stats.median(x), x
  # The vectorized fast path (np.median) agrees with the product-limit rows it replaces.
  t = np.round(rng.uniform(0, 10, (3000, 6)))
  c = rng.random(t.shape) < 0.3
  t = np.where(c, 11.0, t)                                    # one budget beyond every value
  np.testing.assert_array_equal(stats._km_rows(t, c), stats._medians(t, c))
  np.testing.assert_array_equal(stats._km_rows(t, c), np.median(np.where(c, INF, t), -1))


def test_km_median_by_hand_with_budgets():
  # 3, [4], 5, [6], 7, 8 ([.]: censored at that budget). At risk 6, 4, 2 at the events 3, 5, 7:
  # S = 5/6, 5/6 x 3/4 = 0.625, 0.625 x 1/2 = 0.3125 <= 1/2 at 7.
  assert stats.km_median([3, INF, 5, INF, 7, 8], budget=[0, 4, 0, 6, 0, 0]) == 7
  # The same runs with no budgets (censored beyond 8): S = 5/6, 4/6, 1/2 exactly at 7, so the
  # midpoint to the next event, 7.5 = the ordinary median of [3, 5, 7, 8, inf, inf].
  assert stats.km_median([3, INF, 5, INF, 7, 8]) == 7.5 == stats.median([3, INF, 5, INF, 7, 8])
  # A run that ended at 0.5, before anyone reached the target, only leaves the risk set:
  # S = 3/4, 3/4 x 2/3 = 1/2 exactly at 2 (a product that rounds), midpoint 2.5.
  assert stats.km_median([INF, 1, 2, 3, 4], budget=0.5) == 2.5
  # A censoring tied with an event comes after it: at 2, 4 at risk (S = 3/4); at 3, 2 (3/8).
  assert stats.km_median([2, INF, 3, 5], budget=2) == 3
  # Undefined ("beyond the budget"): S = 3/4 after the one event and never lower; or 1/2 at
  # the last event with only censored runs after it.
  assert stats.km_median([2, INF, INF, INF], budget=[0, 3, 4, 5]) == INF
  assert stats.km_median([1, 2, INF, INF], budget=10) == INF
  with pytest.raises(ValueError, match="budget"):
    stats.km_median([1, INF], budget=[0, math.nan])


def test_median_interval_with_budgets():
  # Budgets beyond every value: the exact order statistics, as without them.
  same = stats.median_interval([3, 1, 2, 5, INF], budget=9)
  assert same == stats.median_interval([3, 1, 2, 5, INF]) and same.hi == INF
  # A run that ended (at 1.5) before others reached the target: the KM median (S = 5/6 at 1,
  # 5/6 x 3/4 = 0.625 at 2, 0.625 x 2/3 = 0.417 at 3) and a bootstrap of it.
  iv = stats.median_interval([1, INF, 2, 3, 4, 5], budget=1.5, reps=500)
  assert iv.point == 3 and iv.method == "bootstrap" and iv.lo <= 3 <= iv.hi
  assert math.isnan(iv.coverage) and 0 <= iv.censored < 0.01


def test_no_interval_at_one_seed():
  for iv in (stats.median_interval([7.0]), stats.median_interval([INF], budget=3.0),
             stats.ratio_interval([1.0], [2.0]), stats.ratio_interval([1.0, 2.0, 3.0], [2.0]),
             stats.ratio_interval([INF], [2.0], budget=5.0), stats.pooled_ratio([1.0], [2.0])):
    assert not iv.has_bounds and iv.n == 1 and math.isnan(iv.coverage), iv


X5 = [2.0, 2.1, 1.9, 2.2, 1.8]                     # median 2
R5 = [1.0, 1.1, 0.9, 1.05, INF]                    # median 1.05 (4 reached, 1 censored)


def test_one_censored_reference_seed_is_counted_not_hidden():
  """The review's case: 5 seeds, one reference seed never reached the target. A resampled
  reference median is undefined when 3 or more of 5 draws are that seed, P(Bin(5, 1/5) >= 3) =
  5.8% > 2.5%: with its budget beyond every other seed's value the data do not bound the ratio
  from below, so the interval starts at 0, and now says in what share of resamples."""
  iv = stats.ratio_interval(X5, R5, reps=4000)
  p = float(sps.binom.sf(2, 5, 0.2))
  assert iv.lo == 0 and iv.hi < 2.5 and abs(iv.censored - p) < 0.015 and iv.undetermined == 0
  # The same with the budget stated (beyond every value): the same interval.
  assert stats.ratio_interval(X5, R5, reps=4000, ref_budget=3.0).as_tuple() == iv.as_tuple()
  # Where the data support a bound: that seed ended at 0.5 responses, before any other reached
  # the target. It leaves the risk set, its median stays defined, the interval is above 1.
  early = stats.ratio_interval(X5, R5, reps=4000, ref_budget=0.5)
  assert 1.5 < early.lo <= early.point <= early.hi < 2.5 and early.censored < 0.001
  # 10 seeds, 2 of them ended early: the old reading (inf) starts at 0 (P(Bin(10, .2) >= 5) =
  # 3.3% > 2.5%); with their budgets the ratio is clearly above 1.
  x10, r10 = np.linspace(1.8, 2.2, 10), np.r_[np.linspace(0.9, 1.1, 8), INF, INF]
  assert stats.ratio_interval(x10, r10, reps=4000).lo == 0
  assert stats.ratio_interval(x10, r10, reps=4000, ref_budget=0.6).lo > 1.5


def test_undetermined_resamples_are_not_dropped():
  """inf / inf resamples (both medians undefined) widen both bounds instead of vanishing."""
  samples = np.r_[np.arange(1.0, 98.0), [math.nan] * 3]        # 3% undetermined
  assert stats.percentile_bounds(samples, 0.95) == (-INF, INF)
  assert stats.percentile_bounds(samples[:97], 0.95) == (3.0, 95.0)
  assert stats.percentile_bounds(np.r_[np.arange(1.0, 99.0), [math.nan]], 0.95,
                                 linear=True)[0] > -INF            # 1%: bounds stay finite
  # 2 of 5 censored on each side: each median undefined with P(Bin(5, .4) >= 3) = 0.317,
  # both with 0.317^2 = 0.101; one or the other with 1 - 0.683^2 = 0.534.
  x, r = [2.0, 2.1, INF, INF, 1.8], [1.0, INF, 0.9, 1.05, INF]
  iv = stats.ratio_interval(x, r, reps=4000)
  p = float(sps.binom.sf(2, 5, 0.4))
  assert abs(iv.undetermined - p ** 2) < 0.015 and abs(iv.censored - (1 - (1 - p) ** 2)) < 0.02
  assert (iv.lo, iv.hi) == (0, INF) and iv.point == 2.1 / 1.05
  assert math.isnan(stats.ratio_interval([1, INF, INF], [1, INF, INF], reps=300).point)


@pytest.mark.parametrize("n", [5, 10])
def test_ratio_coverage_with_censoring_is_near_nominal(n):
  """Simulated coverage of the ratio interval at n = m seeds with 0, 10% and 20% of each
  side's runs censored (the slowest ones, at one budget): within [0.93, 0.99] of the nominal
  95% (measured: 0.9725 at every one of these; 400 data sets, +-0.01), deterministic."""
  for p in (0.0, 0.1, 0.2, (0.0, 0.2), (0.2, 0.0)):
    c = stats.ratio_coverage(n, n, censor=p)
    assert 0.93 <= c <= 0.99 and c == stats.ratio_coverage(n, n, censor=p), (n, p, c)


@pytest.mark.slow(seconds=30)  # heavy for the default run (README); .ci/run runs it
def test_the_coverage_label_is_simulated_with_the_datas_censoring():
  assert stats.ratio_interval(X5, R5, reps=300).coverage == stats.ratio_coverage(
      5, 5, censor=(0.0, 0.2))
  assert stats.ratio_interval(X5, X5, reps=300).coverage == stats.ratio_coverage(5, 5)
  # The label says what the intervals do on censored data: 300 studies of 5 vs 5 log-normal
  # seeds (spread 0.3, true ratio 2), each side's slowest 20% censored at a budget.
  rng, hits, labels = np.random.default_rng(5), 0, []
  cut_x, cut_r = 2 * math.exp(0.3 * sps.norm.isf(0.2)), math.exp(0.3 * sps.norm.isf(0.2))
  for i in range(300):
    x, r = 2 * np.exp(0.3 * rng.standard_normal(5)), np.exp(0.3 * rng.standard_normal(5))
    iv = stats.ratio_interval(np.where(x > cut_x, INF, x), np.where(r > cut_r, INF, r),
                              reps=500, seed=i, budget=cut_x, ref_budget=cut_r)
    hits += iv.lo <= 2.0 <= iv.hi
    labels.append(iv.coverage)
  assert hits / 300 >= 0.9 and abs(hits / 300 - np.mean(labels)) < 0.05, (hits, np.mean(labels))

"""Statistics over seeds: the median, its interval, and intervals of ratios, each with the
number of seeds behind it and the coverage it actually has.

A study runs few seeds per configuration (5 for what a verdict names, 2 in a learning-rate
scan), and a "95%" interval is only as good as its coverage at that n:

- The median of n seeds gets the distribution-free order-statistic interval [x(k), x(n+1-k)],
  whose coverage of the true median is exactly 1 - 2 P(Binomial(n, 1/2) <= k - 1) for any
  continuous distribution: the widest (k = 1) covers 93.8% at n = 5, 75% at n = 3, 50% at
  n = 2. The narrowest interval reaching the level is used, else the widest with its coverage;
  below 3 seeds only the range is shown, labelled as such.
- A ratio of two configurations' medians gets a percentile bootstrap (each side resampled
  within itself, rliable's stratified bootstrap), whose coverage at the two seed counts is
  measured by simulation (`ratio_coverage`) and printed beside it.

A never-reached target is +inf (a median with it in the middle is inf, a ratio over it inf);
NaN is refused: it means a bug upstream.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
MIN_SEEDS = 3  # fewer: only a labelled range is shown


@dataclasses.dataclass(frozen=True)
class Interval:
  """A statistic with its interval, the seeds behind it and the coverage the interval has."""
  point: float
  lo: float = math.nan
  hi: float = math.nan
  n: int = 1  # seeds (for a ratio: of the side with fewer)
  coverage: float = math.nan  # of the true value, exact or by simulation; nan: no interval
  method: str = "single"  # order statistics | bootstrap | range | single

  @property
  def has_bounds(self) -> bool:
    return not (math.isnan(self.lo) or math.isnan(self.hi))

  def as_tuple(self) -> tuple[float, float, float]:
    return self.point, self.lo, self.hi


def _values(values) -> np.ndarray:
  x = np.asarray(values, dtype=float).ravel()
  if x.size == 0:
    raise ValueError("no values to aggregate (empty array)")
  if np.isnan(x).any():
    raise ValueError(f"NaN among the values ({int(np.isnan(x).sum())} of {x.size}); "
                     "use inf for a run that never reached its target")
  return x


def median(values) -> float:
  with np.errstate(invalid="ignore"):
    return float(np.median(_values(values)))


def _median_rows(x: np.ndarray) -> np.ndarray:
  with np.errstate(invalid="ignore"):
    return np.median(x, axis=-1)


def order_statistic_coverage(n: int, k: int) -> float:
  """Coverage of [x(k), x(n+1-k)] for the median of n i.i.d. continuous values."""
  if not 1 <= k <= (n + 1) // 2:
    raise ValueError(f"k={k}: must lie in [1, {(n + 1) // 2}] for n={n}")
  return float(1 - 2 * sps.binom.cdf(k - 1, n, 0.5))


def median_interval(values, level: float = LEVEL) -> Interval:
  """The median with its order-statistic interval (module docstring); NaN bounds for 1 seed."""
  x = np.sort(_values(values))
  n, point = x.size, median(x)
  if n == 1:
    return Interval(point, n=1)
  k = 1
  while k + 1 <= (n + 1) // 2 and order_statistic_coverage(n, k + 1) >= level:
    k += 1
  method = "range" if n < MIN_SEEDS else "order statistics"
  return Interval(point, float(x[k - 1]), float(x[n - k]), n, order_statistic_coverage(n, k),
                  method)


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
  # 'lower'/'higher' pick order statistics instead of interpolating: between an inf and a finite
  # value linear interpolation would give inf or nan; the interval is at worst one rank wider.
  if not 0 < level < 1:
    raise ValueError(f"level={level}: must lie in (0, 1)")
  s = samples[~np.isnan(samples)]
  if s.size == 0:
    return math.nan, math.nan
  alpha = (1 - level) / 2
  return (float(np.quantile(s, alpha, method="lower")),
          float(np.quantile(s, 1 - alpha, method="higher")))


def _ratio(num, den) -> np.ndarray:
  # inf / finite = inf (a run that never got there is infinitely slower); x / 0 = inf.
  num, den = np.asarray(num, float), np.asarray(den, float)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(den == 0, np.where(num == 0, np.nan, np.inf), num / den)


def _bootstrap_ratios(x, r, reps: int, rng: np.random.Generator) -> np.ndarray:
  bx = _median_rows(x[rng.integers(0, x.size, (reps, x.size))])
  br = _median_rows(r[rng.integers(0, r.size, (reps, r.size))])
  return _ratio(bx, br)


def ratio_interval(values, ref_values, level: float = LEVEL, reps: int = 2000,
                   seed: int = 0) -> Interval:
  """median(values) / median(ref_values) with a percentile-bootstrap interval (each side
  resampled within itself) and its simulated coverage at these seed counts."""
  x, r = _values(values), _values(ref_values)
  point = float(_ratio(median(x), median(r)))
  n = min(x.size, r.size)
  if n < 2:
    return Interval(point, n=n)
  lo, hi = _percentiles(_bootstrap_ratios(x, r, reps, np.random.default_rng(seed)), level)
  return Interval(point, lo, hi, n, ratio_coverage(x.size, r.size, level),
                  "range" if n < MIN_SEEDS else "bootstrap")


@functools.lru_cache(maxsize=None)
def ratio_coverage(n: int, m: int, level: float = LEVEL, spread: float = 0.3,
                   datasets: int = 400, reps: int = 1000, seed: int = 0) -> float:
  """Share of simulated studies whose `ratio_interval` covers the true ratio of medians.

  Each study draws n and m log-normal values of spread `spread` (the seed-to-seed spread of
  responses to target is 5-30%) with true medians 2 and 1. Deterministic (seeded) and cached:
  the report prints it beside every ratio interval of these seed counts.
  """
  rng = np.random.default_rng(seed)
  covered = 0
  for _ in range(datasets):
    x = 2 * np.exp(spread * rng.standard_normal(n))
    r = np.exp(spread * rng.standard_normal(m))
    lo, hi = _percentiles(_bootstrap_ratios(x, r, reps, rng), level)
    covered += lo <= 2.0 <= hi
  return covered / datasets


def overlaps(a, b) -> bool:
  """Whether two intervals (Interval, (lo, hi) or (point, lo, hi)) share a point. An unknown
  bound counts as overlapping: without an interval we cannot call a difference."""
  def bounds(v):
    if isinstance(v, Interval):
      return v.lo, v.hi
    return tuple(float(u) for u in tuple(v)[-2:])
  (a_lo, a_hi), (b_lo, b_hi) = bounds(a), bounds(b)
  if any(math.isnan(v) for v in (a_lo, a_hi, b_lo, b_hi)):
    return True
  return a_lo <= b_hi and b_lo <= a_hi


def pooled_ratio(num, den, scale: float = 1.0, reps: int = 2000, level: float = LEVEL,
                 seed: int = 0) -> Interval:
  """sum(num) / sum(den) x scale over runs (a ratio of means, as B_simple = tr(Sigma) / |G|^2
  pools noisy estimates), with a percentile bootstrap over runs; inf when the pooled
  denominator is not positive. Its coverage is measured by simulation in tests/unit/analysis/test_stats.py
  (not per call): the Interval's coverage is nan and its method 'bootstrap'."""
  n_, d_ = (np.asarray(v, float).ravel() for v in (num, den))
  keep = ~(np.isnan(n_) | np.isnan(d_))
  n_, d_ = n_[keep], d_[keep]
  if n_.size == 0:
    return Interval(math.nan, n=0)
  def ratio(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.where(b > 0, a / b * scale, np.inf)
  point = float(ratio(n_.sum(), d_.sum()))
  if n_.size < 2:
    return Interval(point, n=1)
  idx = np.random.default_rng(seed).integers(0, n_.size, (reps, n_.size))
  lo, hi = _percentiles(ratio(n_[idx].sum(1), d_[idx].sum(1)), level)
  return Interval(point, lo, hi, int(n_.size), math.nan,
                  "range" if n_.size < MIN_SEEDS else "bootstrap")

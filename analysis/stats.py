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
  within itself, rliable's stratified bootstrap), whose coverage at the two seed counts and
  censored shares is measured by simulation (`ratio_coverage`) and printed beside it.

A run that never reached its target is right-censored: it would have needed more responses
than it had seen when it ended (its budget). It is given as +inf, with its budget in `budget`
(one number, or one per value; only the inf values' entries are read); without a budget it is
censored beyond every value observed, which is what a plain inf always meant. The median of
censored values is the Kaplan-Meier median (`km_median`); it is undefined (returned as inf,
"beyond the budget") when the survival curve never falls to one half, i.e. when too many runs
ended before reaching the target to say where the median lies. NaN is refused: it means a bug
upstream.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy import stats as sps

LEVEL = 0.95
MIN_SEEDS = 3  # fewer: only a labelled range is shown
_EPS = 1e-9    # survival products that should be exactly 1/2 (3/4 x 2/3) are off by rounding


@dataclasses.dataclass(frozen=True)
class Interval:
  """A statistic with its interval, the seeds behind it and the coverage the interval has.

  `censored`: the share of bootstrap resamples in which a median was undefined (more than half
  of the resampled runs ended before the target); `undetermined`: the share in which both
  medians of a ratio were, which the bounds count on whichever side makes the interval wider.
  """
  point: float
  lo: float = math.nan
  hi: float = math.nan
  n: int = 1  # seeds (for a ratio: of the side with fewer)
  coverage: float = math.nan  # of the true value, exact or by simulation; nan: no interval
  method: str = "single"  # order statistics | bootstrap | range | single
  censored: float = 0.0
  undetermined: float = 0.0

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


def _censored(values, budget=None) -> tuple[np.ndarray, np.ndarray]:
  """(times, censored): an inf value is censored at its budget (inf: beyond every value)."""
  x = _values(values)
  c = np.isinf(x)
  if budget is None:
    return x, c
  b = np.broadcast_to(np.asarray(budget, dtype=float), x.shape)
  if np.isnan(b[c]).any() or (b[c] < 0).any():
    raise ValueError("a censored run's budget must be a number >= 0 (inf: unknown)")
  return np.where(c, b, x), c


def median(values) -> float:
  with np.errstate(invalid="ignore"):
    return float(np.median(_values(values)))


def _km_rows(t: np.ndarray, c: np.ndarray) -> np.ndarray:
  """The Kaplan-Meier median of each row of times `t` with censoring flags `c` (same shape).

  Runs in time order, events before censorings at equal times. Each event multiplies the
  survival by 1 - 1/(runs still at risk); a censored run only leaves the risk set. The median
  is the first event time where the survival is <= 1/2; where it is exactly 1/2 (a flat
  stretch, as with an even number of uncensored values) it is the midpoint to the next event
  time (R's survival package does the same), so that without censoring it is the ordinary
  median. inf where it is undefined: the survival stays above 1/2, or sits at 1/2 with no event
  after it.
  """
  n = t.shape[-1]
  t2, c2 = t.reshape(-1, n), c.reshape(-1, n)
  order = np.lexsort((c2, t2), axis=-1)
  ts, cs = np.take_along_axis(t2, order, -1), np.take_along_axis(c2, order, -1)
  s = np.cumprod(np.where(cs, 1.0, 1.0 - 1.0 / (n - np.arange(n))), axis=-1)
  hit = ~cs & (s <= 0.5 + _EPS)
  at = ts[np.arange(ts.shape[0]), np.argmax(hit, -1)][:, None]
  s_at = np.where(ts == at, s, np.inf).min(-1)            # the survival just after `at`
  after = np.where(~cs & (ts > at), ts, np.inf).min(-1)   # the next event time
  with np.errstate(invalid="ignore"):
    m = np.where(np.abs(s_at - 0.5) <= _EPS, (at[:, 0] + after) / 2, at[:, 0])
  return np.where(hit.any(-1), m, np.inf).reshape(t.shape[:-1])


def _medians(t: np.ndarray, c: np.ndarray) -> np.ndarray:
  """`_km_rows`, by np.median where it is the same: no censoring, or every censored run
  beyond every event (the censored then count as inf)."""
  if not c.any():
    return np.median(t, axis=-1)
  if not (~c).any() or t[c].min() >= t[~c].max():
    return np.median(np.where(c, np.inf, t), axis=-1)
  return _km_rows(t, c)


def km_median(values, budget=None) -> float:
  """The Kaplan-Meier median (`_km_rows`) of `values` (inf: never reached, censored at its
  `budget`); inf when undefined. Without budgets it equals `median`."""
  t, c = _censored(values, budget)
  return float(_km_rows(t[None], c[None])[0])


def order_statistic_coverage(n: int, k: int) -> float:
  """Coverage of [x(k), x(n+1-k)] for the median of n i.i.d. continuous values."""
  if not 1 <= k <= (n + 1) // 2:
    raise ValueError(f"k={k}: must lie in [1, {(n + 1) // 2}] for n={n}")
  return float(1 - 2 * sps.binom.cdf(k - 1, n, 0.5))


def median_interval(values, level: float = LEVEL, budget=None, reps: int = 2000,
                    seed: int = 0) -> Interval:
  """The median with its order-statistic interval (module docstring); NaN bounds for 1 seed.

  The order statistics stay exact while every censored run lies beyond every observed value
  (always so without `budget`): a censored one then counts as inf. When a run was censored
  before others reached the target, the point is the Kaplan-Meier median and the interval a
  percentile bootstrap of it (an undefined median counts as +inf), whose coverage is not
  measured (nan).
  """
  t, c = _censored(values, budget)
  n = t.size
  if c.any() and (~c).any() and t[c].min() < t[~c].max():
    point = km_median(values, budget)
    if n == 1:
      return Interval(point, n=1)
    idx = np.random.default_rng(seed).integers(0, n, (reps, n))
    m = _km_rows(t[idx], c[idx])
    lo, hi = percentile_bounds(m, level)
    return Interval(point, lo, hi, n, math.nan, "range" if n < MIN_SEEDS else "bootstrap",
                    float(np.isinf(m).mean()))
  x = np.sort(np.where(c, np.inf, t))
  point = median(x)
  if n == 1:
    return Interval(point, n=1)
  k = 1
  while k + 1 <= (n + 1) // 2 and order_statistic_coverage(n, k + 1) >= level:
    k += 1
  method = "range" if n < MIN_SEEDS else "order statistics"
  return Interval(point, float(x[k - 1]), float(x[n - k]), n, order_statistic_coverage(n, k),
                  method)


def percentile_bounds(samples, level: float, linear: bool = False) -> tuple[float, float]:
  """The (1 - level)/2 and (1 + level)/2 quantiles of bootstrap `samples`, where a NaN sample
  (undetermined) counts as -inf for the lower bound and +inf for the upper: never dropped, it
  can only widen the interval, and a bound that falls among them is -inf or +inf.

  By default the quantiles are order statistics ('lower'/'higher'), not interpolated: between
  an inf and a finite value interpolation gives inf or nan; the interval is at worst one rank
  wider. `linear` interpolates, and a bound interpolated against an infinite sample is infinite.
  """
  if not 0 < level < 1:
    raise ValueError(f"level={level}: must lie in (0, 1)")
  s = np.asarray(samples, float).ravel()
  if s.size == 0:
    return math.nan, math.nan
  alpha, und = (1 - level) / 2, np.isnan(s)
  with np.errstate(invalid="ignore"):
    lo = np.quantile(np.where(und, -np.inf, s), alpha, method="linear" if linear else "lower")
    hi = np.quantile(np.where(und, np.inf, s), 1 - alpha,
                     method="linear" if linear else "higher")
  return (-math.inf if np.isnan(lo) else float(lo)), (math.inf if np.isnan(hi) else float(hi))


def _ratio(num, den) -> np.ndarray:
  # inf / finite = inf (a median beyond its budget: infinitely slower); finite / inf = 0;
  # x / 0 = inf; inf / inf and 0 / 0: nan, undetermined.
  num, den = np.asarray(num, float), np.asarray(den, float)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(den == 0, np.where(num == 0, np.nan, np.inf), num / den)


def _ratio_bounds(x, cx, r, cr, level: float, reps: int, rng: np.random.Generator,
                  log_shift: tuple[float, float] | None = None
                  ) -> tuple[float, float, float, float]:
  """Percentile bootstrap of median(x) / median(r), each side's runs resampled within it.
  A resample whose reference median is undefined gives 0 (the ratio lies below anything), one
  whose numerator median is undefined inf, one where both are undefined is undetermined and
  counts on the widening side (`percentile_bounds`). Returns lo, hi and the shares of resamples
  with a median undefined and with the ratio undetermined."""
  ix = rng.integers(0, x.size, (reps, x.size))
  ir = rng.integers(0, r.size, (reps, r.size))
  bx, br = _medians(x[ix], cx[ix]), _medians(r[ir], cr[ir])
  q = _ratio(bx, br)
  if log_shift is not None:  # each resample divided by a draw of the correction
    q = q * np.exp(-(log_shift[0] + math.sqrt(log_shift[1]) * rng.standard_normal(reps)))
  lo, hi = percentile_bounds(q, level)
  return (max(lo, 0.0), hi, float((np.isinf(bx) | np.isinf(br)).mean()),
          float(np.isnan(q).mean()))


def ratio_interval(values, ref_values, level: float = LEVEL, reps: int = 2000,
                   seed: int = 0, budget=None, ref_budget=None,
                   log_shift: tuple[float, float] | None = None) -> Interval:
  """median(values) / median(ref_values) with a percentile-bootstrap interval (each side
  resampled within itself, `_ratio_bounds`) and its coverage simulated at these seed counts
  and each side's share of censored runs (`ratio_coverage`). The medians are Kaplan-Meier
  medians when runs were censored (inf values, with `budget` / `ref_budget`). `log_shift`
  (mean, variance): the ratio divided by exp of a correction so distributed (the joint rate
  fit's reading at the optimum, rlscale/study/lr_fit.py), in the point and in every
  resample."""
  x, cx = _censored(values, budget)
  r, cr = _censored(ref_values, ref_budget)
  point = float(_ratio(_medians(x[None], cx[None])[0], _medians(r[None], cr[None])[0]))
  if log_shift is not None:
    point *= math.exp(-log_shift[0])
  n = min(x.size, r.size)
  if n < 2:
    return Interval(point, n=n)
  lo, hi, cens, und = _ratio_bounds(x, cx, r, cr, level, reps, np.random.default_rng(seed),
                                    log_shift)
  share = (round(float(cx.mean()), 3), round(float(cr.mean()), 3))
  cover = (ratio_coverage(x.size, r.size, level) if share == (0.0, 0.0) else
           ratio_coverage(x.size, r.size, level, censor=share))
  return Interval(point, lo, hi, n, cover, "range" if n < MIN_SEEDS else "bootstrap", cens, und)


@functools.lru_cache(maxsize=None)
def ratio_coverage(n: int, m: int, level: float = LEVEL, spread: float = 0.3,
                   datasets: int = 400, reps: int = 1000, seed: int = 0,
                   censor: float | tuple[float, float] = 0.0) -> float:
  """Share of simulated studies whose `ratio_interval` covers the true ratio of medians.

  Each study draws n and m log-normal values of spread `spread` (the seed-to-seed spread of
  responses to target is 5-30%) with true medians 2 and 1. `censor` (one share for both sides,
  or (numerator's, reference's)): each side's runs beyond that share's upper quantile of its
  distribution are censored at it, as runs that hit one budget before the target: the slowest
  runs, those that move a median. Deterministic (seeded) and cached: the report prints it
  beside every ratio interval of these seed counts and censored shares.
  """
  px, pr = (censor, censor) if np.isscalar(censor) else censor
  cut_x, cut_r = (s * math.exp(spread * sps.norm.isf(p)) if p > 0 else math.inf
                  for s, p in ((2.0, px), (1.0, pr)))
  rng = np.random.default_rng(seed)
  covered = 0
  for _ in range(datasets):
    x = 2 * np.exp(spread * rng.standard_normal(n))
    r = np.exp(spread * rng.standard_normal(m))
    cx, cr = x > cut_x, r > cut_r
    lo, hi, _, _ = _ratio_bounds(np.where(cx, cut_x, x), cx, np.where(cr, cut_r, r), cr, level,
                                 reps, rng)
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
  lo, hi = percentile_bounds(ratio(n_[idx].sum(1), d_[idx].sum(1)), level)
  return Interval(point, lo, hi, int(n_.size), math.nan,
                  "range" if n_.size < MIN_SEEDS else "bootstrap")

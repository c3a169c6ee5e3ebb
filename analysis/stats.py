"""Aggregation over seeds: IQM, median and percentile-bootstrap intervals.

Follows Agarwal et al. 2021 ("Deep RL at the edge of the statistical precipice", rliable): report
the interquartile mean or the median of the seeds of a configuration with a 95% bootstrap
interval, the configurations being the strata that are resampled separately. A point whose
interval overlaps the reference's is not called different (DESIGN.md, "Seeds").

Values may be +inf: a run that never reached a target has responses-to-target = inf, and a
statistic whose middle includes it is inf. NaN is refused: it means a bug upstream, not a run
that failed.
"""

from __future__ import annotations

from typing import Callable, Hashable

import numpy as np
from scipy import stats as sps


def _values(values) -> np.ndarray:
  x = np.asarray(values, dtype=float).ravel()
  if x.size == 0:
    raise ValueError("no values to aggregate (empty array)")
  if np.isnan(x).any():
    raise ValueError(f"NaN among the values ({int(np.isnan(x).sum())} of {x.size}); "
                     "use inf for a run that never reached its target")
  return x


def _iqm_rows(x: np.ndarray) -> np.ndarray:
  # rliable's convention: scipy's trim_mean cuts int(0.25 * n) values from each end.
  with np.errstate(invalid="ignore"):
    return np.asarray(sps.trim_mean(x, 0.25, axis=-1), dtype=float)


def _median_rows(x: np.ndarray) -> np.ndarray:
  with np.errstate(invalid="ignore"):
    return np.asarray(np.median(x, axis=-1), dtype=float)


def iqm(values) -> float:
  """Interquartile mean: the mean of the middle 50% (scipy.stats.trim_mean(x, 0.25))."""
  return float(_iqm_rows(_values(values)))


def median(values) -> float:
  return float(_median_rows(_values(values)))


STATS: dict[str, Callable] = {"iqm": iqm, "median": median}
# Row-wise versions, so that a bootstrap evaluates all its resamples in one call.
_ROWS: dict[str, Callable] = {"iqm": _iqm_rows, "median": _median_rows}


def _rows_fn(stat: str) -> Callable:
  if stat not in _ROWS:
    raise ValueError(f"stat={stat!r}: allowed {sorted(_ROWS)}")
  return _ROWS[stat]


def _resampled(x: np.ndarray, stat: str, reps: int, rng: np.random.Generator) -> np.ndarray:
  """`reps` values of the statistic on resamples (with replacement) of x."""
  idx = rng.integers(0, x.size, size=(reps, x.size))
  return _rows_fn(stat)(x[idx])


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
  # 'lower'/'higher' pick order statistics instead of interpolating: between an inf and a finite
  # value linear interpolation would give inf or nan; the interval is at worst one rank wider.
  if not 0 < level < 1:
    raise ValueError(f"level={level}: must lie in (0, 1)")
  s = samples[~np.isnan(samples)]
  if s.size == 0:
    return float("nan"), float("nan")
  alpha = (1 - level) / 2
  lo = np.quantile(s, alpha, method="lower")
  hi = np.quantile(s, 1 - alpha, method="higher")
  return float(lo), float(hi)


def bootstrap_interval(values, stat: str = "iqm", reps: int = 2000, level: float = 0.95,
                       seed: int = 0) -> tuple[float, float, float]:
  """(point, lo, hi): the statistic over the seeds and its percentile-bootstrap interval.

  With one seed the spread is unknown, so the bounds are nan (not the point: a zero-width
  interval would claim a certainty one run cannot give).
  """
  x = _values(values)
  point = float(_rows_fn(stat)(x))
  if x.size < 2:
    return point, float("nan"), float("nan")
  lo, hi = _percentiles(_resampled(x, stat, reps, np.random.default_rng(seed)), level)
  return point, lo, hi


def stratified_bootstrap(groups: dict[Hashable, object], stat: str = "iqm", reps: int = 2000,
                         level: float = 0.95, seed: int = 0
                         ) -> dict[Hashable, tuple[float, float, float]]:
  """{key: (point, lo, hi)}: each configuration's seeds resampled within that configuration.

  Each key gets its own random stream (spawned from `seed` in the dict's order), so adding a
  configuration at the end does not change the intervals of the others.
  """
  children = np.random.SeedSequence(seed).spawn(len(groups))
  out = {}
  for (key, values), child in zip(groups.items(), children):
    x = _values(values)
    point = float(_rows_fn(stat)(x))
    if x.size < 2:
      out[key] = (point, float("nan"), float("nan"))
      continue
    lo, hi = _percentiles(_resampled(x, stat, reps, np.random.default_rng(child)), level)
    out[key] = (point, lo, hi)
  return out


def _ratio(num, den) -> np.ndarray:
  # inf / finite = inf (a run that never got there is infinitely slower); x / 0 = inf.
  num, den = np.asarray(num, float), np.asarray(den, float)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(den == 0, np.where(num == 0, np.nan, np.inf), num / den)


def ratio_interval(values, ref_values, stat: str = "iqm", reps: int = 2000, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float, float]:
  """(point, lo, hi) of stat(values) / stat(ref_values), the two resampled independently.

  Bounds are nan when either side has a single seed.
  """
  x, r = _values(values), _values(ref_values)
  f = _rows_fn(stat)
  point = float(_ratio(f(x), f(r)))
  if x.size < 2 or r.size < 2:
    return point, float("nan"), float("nan")
  rx, rr = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
  lo, hi = _percentiles(_ratio(_resampled(x, stat, reps, rx), _resampled(r, stat, reps, rr)),
                        level)
  return point, lo, hi


def overlaps(a_interval, b_interval) -> bool:
  """Whether two intervals share a point; accepts (lo, hi) or (point, lo, hi).

  An unknown (nan) bound counts as overlapping: without an interval we cannot call a
  difference.
  """
  a_lo, a_hi = (float(v) for v in tuple(a_interval)[-2:])
  b_lo, b_hi = (float(v) for v in tuple(b_interval)[-2:])
  if any(np.isnan(v) for v in (a_lo, a_hi, b_lo, b_hi)):
    return True
  return a_lo <= b_hi and b_lo <= a_hi

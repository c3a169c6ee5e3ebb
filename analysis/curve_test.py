"""Does a configuration's learning curve fall below the reference's? A seed-permutation test.

A batch-size study compares, per batch size, the held-out accuracy curve (accuracy against
responses seen) of a configuration with the reference batch's. Reading "the median curves
differ by more than a band" as a break is not calibrated: with 5 seeds a side, the
seed-to-seed spread of the curves (log time-to-target varies by ~0.28 between seeds) makes
IDENTICAL configurations differ by more than 0.05 somewhere in 9-21% of draws; and a fixed grid
of 16 responses misses the largest gap when it sits at an evaluation between grid points.

`curve_test` instead:
- evaluates both sides at the union of their evaluation points, only where every seed of both
  sides has been evaluated (each seed interpolated linearly between its own evaluations; no
  extrapolation), so the largest gap at an evaluation is seen;
- takes the statistic shortfall = max over those points of (median reference curve - median
  configuration curve): how far the configuration falls below the reference, negative when it is
  above everywhere;
- calibrates it against a seed-permutation null: the seeds of both sides are pooled and
  relabelled (every split when there are at most `exact_limit`, e.g. 252 for 5 vs 5; else
  `permutations` random ones, seeded), and the statistic is recomputed for each split. Under
  "identical configurations" the seeds are exchangeable, so the observed shortfall is an
  ordinary draw from that null;
- calls it a break (`rejected`) when the shortfall exceeds the null's (1 - alpha) quantile
  (equivalently p <= alpha) AND exceeds `band`: a gap the seeds cannot explain that is also too
  large to ignore. A real but small gap (under the band) is not a break, and a gap over the band
  that the seed spread explains is not one either.

The false-break rate on identical configurations is at most alpha by construction (the test
is exact up to the random permutations, and the band only removes rejections);
tests/unit/analysis/test_curve_test.py measures it and the power against a configuration 1.5x
slower in responses, on simulated curves with the study's seed spread, evaluation noise and
spacings.

Curves are given per seed, as a list of (x, y) pairs (responses seen at each evaluation, the
metric there), or as a long DataFrame with columns `run` (or `seed`), `responses` and `value`
(or `metric`). `seed_curves(study, config)` reads a study's verdict seeds in that form (the
per-seed curves behind `study_table.config_curve`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pandas as pd

BAND = 0.05
ALPHA = 0.05
PERMUTATIONS = 2000
EXACT_LIMIT = 5000  # enumerate every split when there are at most this many (5 v 5: 252)
_CHUNK = 256  # splits per vectorized batch (bounds memory: chunk x seeds x points floats)


@dataclasses.dataclass(frozen=True)
class CurveTest:
  """The result of `curve_test`.

  shortfall: the observed max over evaluation points of (median ref - median config); NaN when
    the two sides share no span of responses.
  at: responses at which it occurs.
  p_value: fraction of the permutation null (the observed split included) >= shortfall.
  threshold: the null's (1 - alpha) quantile (the order statistic at or above it).
  rejected: a break: shortfall > threshold and shortfall > band.
  n, n_ref: seeds of the configuration and of the reference.
  band, alpha: as given.
  permutations: splits in the null (observed included); exact: whether they were all of them.
  points: evaluation points the maximum was taken over.
  """
  shortfall: float
  at: float
  p_value: float
  threshold: float
  rejected: bool
  n: int
  n_ref: int
  band: float
  alpha: float
  permutations: int
  exact: bool
  points: int


def _as_curves(curves) -> list[tuple[np.ndarray, np.ndarray]]:
  """Per-seed (x increasing, y) arrays, non-finite evaluations dropped, a repeated x's last kept;
  seeds with no evaluation dropped."""
  if isinstance(curves, pd.DataFrame):
    key = "run" if "run" in curves else "seed"
    val = "value" if "value" in curves else "metric"
    missing = {key, "responses", val} - set(curves.columns)
    if missing:
      raise ValueError(f"curve_test: a curve DataFrame needs columns run (or seed), responses, "
                       f"value (or metric); missing {sorted(missing)}")
    curves = [(g.responses.to_numpy(), g[val].to_numpy())
              for _, g in curves.groupby(key, sort=True)]
  out = []
  for c in curves:
    x, y = (np.asarray(v, dtype=float).ravel() for v in c)
    if x.size != y.size:
      raise ValueError(f"curve_test: a seed has {x.size} x values but {y.size} y values")
    ok = np.isfinite(x) & np.isfinite(y)
    pts = dict(zip(x[ok].tolist(), y[ok].tolist()))
    if pts:
      xs = np.array(sorted(pts))
      out.append((xs, np.array([pts[v] for v in xs])))
  return out


def common_points(curves, ref) -> np.ndarray:
  """The union of every seed's evaluation points (both sides) within the span every seed covers."""
  seeds = _as_curves(curves) + _as_curves(ref)
  if not seeds:
    return np.zeros(0)
  lo = max(x[0] for x, _ in seeds)
  hi = min(x[-1] for x, _ in seeds)
  x = np.unique(np.concatenate([s[0] for s in seeds]))
  return x[(x >= lo) & (x <= hi)]


def _on(points: np.ndarray, seeds) -> np.ndarray:
  return np.array([np.interp(points, x, y) for x, y in seeds]).reshape(len(seeds), points.size)


def median_gap(curves, ref) -> tuple[np.ndarray, np.ndarray]:
  """(points, median ref - median config) at `common_points`: the curve of the shortfall."""
  cfg, rf = _as_curves(curves), _as_curves(ref)
  x = common_points(cfg, rf)
  if not cfg or not rf or not x.size:
    return x, np.zeros(0)
  return x, _medians(_on(x, rf).T) - _medians(_on(x, cfg).T)


def _splits(n: int, m: int, exact_limit: int, permutations: int,
            rng: np.random.Generator) -> tuple[np.ndarray, bool]:
  """Index sets (rows) of the pooled seeds labelled "configuration"; the observed split (0..n-1)
  first."""
  total = math.comb(n + m, n)
  if total <= exact_limit:
    return np.array(list(itertools.combinations(range(n + m), n)), dtype=int), True
  draws = np.argsort(rng.random((permutations, n + m)), axis=1)[:, :n]
  return np.vstack([np.arange(n)[None], np.sort(draws, axis=1)]), False


def _medians(values: np.ndarray) -> np.ndarray:
  """Medians along the last axis (sorting a handful of seeds beats np.median's partition)."""
  s = np.sort(values, axis=-1)
  k = s.shape[-1]
  return s[..., k // 2] if k % 2 else 0.5 * (s[..., k // 2 - 1] + s[..., k // 2])


def _null(pooled: np.ndarray, splits: np.ndarray) -> np.ndarray:
  """The statistic (max over points of median of the rest - median of the split) per split."""
  k, n = pooled.shape[0], splits.shape[1]
  by_point = np.ascontiguousarray(pooled.T)  # (points, seeds)
  out = np.empty(len(splits))
  for s in range(0, len(splits), _CHUNK):
    idx = splits[s:s + _CHUNK]
    mask = np.zeros((len(idx), k), dtype=bool)
    mask[np.arange(len(idx))[:, None], idx] = True
    rest = np.argsort(mask, axis=1, kind="stable")[:, :k - n]  # the False (unlabelled) first
    gap = _medians(by_point[:, rest]) - _medians(by_point[:, idx])  # (points, splits)
    out[s:s + _CHUNK] = np.max(gap, axis=0)
  return out


def curve_test(curves, ref, band: float = BAND, alpha: float = ALPHA,
               permutations: int = PERMUTATIONS, exact_limit: int = EXACT_LIMIT,
               seed: int = 0) -> CurveTest:
  """Whether the configuration's per-seed `curves` fall below the reference's per-seed `ref` by
  more than the seeds explain and more than `band` (see the module's docstring).

  curves, ref: per-seed curves, each a list of (x, y) pairs or a long DataFrame (run/seed,
    responses, value/metric).
  band: the tolerance: a shortfall at most this large is never a break.
  alpha: the permutation test's level.
  permutations: random splits when there are more than `exact_limit` (drawn with `seed`).
  """
  cfg, rf = _as_curves(curves), _as_curves(ref)
  n, m = len(cfg), len(rf)
  x = common_points(cfg, rf)
  if not n or not m or not x.size:
    return CurveTest(math.nan, math.nan, math.nan, math.nan, False, n, m, band, alpha, 0, False,
                     int(x.size))
  pooled = _on(x, cfg + rf)
  gap = _medians(pooled[n:].T) - _medians(pooled[:n].T)
  i = int(np.argmax(gap))
  observed = float(gap[i])
  splits, exact = _splits(n, m, exact_limit, permutations, np.random.default_rng(seed))
  null = _null(pooled, splits)
  null[0] = observed  # the observed split (computed identically; exact against rounding)
  p = float(np.mean(null >= observed))
  threshold = float(np.quantile(null, 1 - alpha, method="higher"))
  return CurveTest(observed, float(x[i]), p, threshold,
                   bool(observed > threshold and observed > band), n, m, band, alpha,
                   len(null), exact, int(x.size))


def seed_curves(study, config: str, runs=None) -> list[tuple[np.ndarray, np.ndarray]]:
  """A study configuration's verdict seeds as (responses on the study's axis, metric) per seed:
  the curves `study_table.config_curve` takes the median of."""
  from analysis import study_table  # here: study_table may import this module
  runs = study.verdict_runs() if runs is None else runs
  ids = list(runs[runs.config == config].run)
  curves = [study_table.eval_curve(study.records[i], study.metric, study.opts.x) for i in ids]
  return [c for c in curves if c[0].size]


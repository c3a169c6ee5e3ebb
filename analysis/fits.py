"""Every fit a study report makes (DESIGN.md, "Analysis: what a study reports").

Pure numerics on arrays: crossing a target, the steps-samples trade-off and B_crit (McCandlish et
al. 2018), the compute-performance sigmoid (ScaleRL, Khatri et al. 2025), signal and noise of the
gradient, generation time, and straight lines in linear or log-log axes. Each returns a dict of
plain floats so that a report can write it beside its figure.
"""

from __future__ import annotations

from typing import Hashable

import numpy as np
from scipy import optimize
from scipy import stats as sps


def _arrays(*cols, min_points: int = 1, what: str = "fit"):
  out = [np.asarray(c, dtype=float).ravel() for c in cols]
  n = out[0].size
  if any(c.size != n for c in out):
    raise ValueError(f"{what}: arrays of different lengths {[c.size for c in out]}")
  if n < min_points:
    raise ValueError(f"{what}: needs at least {min_points} points, got {n}")
  if not all(np.isfinite(c).all() for c in out):
    raise ValueError(f"{what}: non-finite values (drop runs that never reached the target)")
  return out


# --- 1. Crossing a target -------------------------------------------------------------------

def smooth(y, window: int = 3) -> np.ndarray:
  """Trailing moving average over `window` evaluations; the first points average what exists.

  Trailing, not centred: a centred window would let a later evaluation pull the curve over the
  target before the run got there.
  """
  if window < 1:
    raise ValueError(f"window={window}: must be >= 1")
  y = np.asarray(y, dtype=float)
  c = np.concatenate([[0.0], np.cumsum(y)])
  i = np.arange(1, y.size + 1)
  start = np.maximum(i - window, 0)
  return (c[i] - c[start]) / (i - start)


def first_crossing(x, y, target: float, window: int = 3) -> float | None:
  """First x where smooth(y) >= target, linearly interpolated between the evaluations around it.

  None when never reached; x[0] when the first evaluation already meets it.
  """
  x, = _arrays(x, what="first_crossing")
  s = smooth(y, window)
  if s.size != x.size:
    raise ValueError(f"first_crossing: {x.size} x values but {s.size} y values")
  hit = np.flatnonzero(s >= target)
  if hit.size == 0:
    return None
  i = int(hit[0])
  if i == 0:
    return float(x[0])
  x0, x1, s0, s1 = x[i - 1], x[i], s[i - 1], s[i]
  return float(x0 + (target - s0) / (s1 - s0) * (x1 - x0))


# --- 2. Steps-samples trade-off --------------------------------------------------------------

def _tradeoff_model(e, s_min, e_min):
  return s_min * e / (e - e_min)


def fit_tradeoff(steps, examples) -> dict:
  """S_min, E_min, B_crit = E_min/S_min from (S/S_min - 1)(E/E_min - 1) = 1.

  Fitted as S = S_min E / (E - E_min) by curve_fit with relative residuals (S spans orders of
  magnitude across batches), E_min in (0, min E) and S_min in (0, min S]. The start comes from
  the same law written linearly: 1 = S_min/S + E_min/E. `residual` is the rms relative error
  of S; `at_bound` flags a parameter stuck at its bound (the data do not pin it down).
  """
  s, e = _arrays(steps, examples, min_points=3, what="fit_tradeoff")
  if (s <= 0).any() or (e <= 0).any():
    raise ValueError("fit_tradeoff: steps and examples must be positive")
  s_hi, e_hi = s.min(), e.min()
  # Parameters scaled by their upper bounds, so both live in (0, 1].
  (p_s, p_e), *_ = np.linalg.lstsq(np.stack([s_hi / s, e_hi / e], 1), np.ones_like(s), rcond=None)
  p0 = np.clip([p_s, p_e], 0.05, 0.95)
  eps = 1e-9
  popt, _ = optimize.curve_fit(
      lambda ee, a, b: _tradeoff_model(ee, a * s_hi, b * e_hi), e, s, p0=p0, sigma=s,
      bounds=([eps, eps], [1.0, 1.0 - 1e-6]), max_nfev=2000)
  s_min, e_min = popt[0] * s_hi, popt[1] * e_hi
  rel = _tradeoff_model(e, s_min, e_min) / s - 1
  at_bound = bool(popt[0] < 1e-6 or popt[0] > 1 - 1e-6 or popt[1] < 1e-6 or popt[1] > 1 - 1e-5)
  return dict(s_min=float(s_min), e_min=float(e_min), b_crit=float(e_min / s_min),
              residual=float(np.sqrt(np.mean(rel ** 2))), at_bound=at_bound)


def _medians(points_by_config, rng=None):
  """Per-configuration median (S, E), seeds resampled with replacement when rng is given."""
  s_med, e_med = [], []
  for pts in points_by_config.values():
    p = np.asarray(pts, dtype=float).reshape(-1, 2)
    if rng is not None:
      p = p[rng.integers(0, len(p), len(p))]
    s_med.append(np.median(p[:, 0]))
    e_med.append(np.median(p[:, 1]))
  s_med, e_med = np.array(s_med), np.array(e_med)
  keep = np.isfinite(s_med) & np.isfinite(e_med)  # a config whose median never got there
  return s_med[keep], e_med[keep]


def tradeoff_interval(points_by_config: dict[Hashable, list], reps: int = 1000,
                      level: float = 0.95, seed: int = 0) -> dict:
  """Bootstrap intervals of b_crit, s_min, e_min: {name: (point, lo, hi)}, plus `failed`.

  `points_by_config` maps a configuration (a batch) to its seeds' (S, E) pairs. Each rep
  resamples the seeds within every configuration, takes the per-configuration median of S and
  of E, and refits. Reps whose fit fails (or keep fewer than 3 finite configurations) are
  skipped and counted in `failed`; the point estimate is the fit on the medians of all seeds.
  """
  point = fit_tradeoff(*_medians(points_by_config))
  rng = np.random.default_rng(seed)
  draws, failed = {k: [] for k in ("b_crit", "s_min", "e_min")}, 0
  for _ in range(reps):
    try:
      f = fit_tradeoff(*_medians(points_by_config, rng))
    except (ValueError, RuntimeError):
      failed += 1
      continue
    for k in draws:
      draws[k].append(f[k])
  alpha = (1 - level) / 2
  out = {}
  for k, v in draws.items():
    lo, hi = np.quantile(v, [alpha, 1 - alpha]) if v else (np.nan, np.nan)
    out[k] = (point[k], float(lo), float(hi))
  out.update(failed=failed, reps=reps)
  return out


def tolerance_batch(b_crit: float, tolerance: float = 0.2) -> float:
  """The largest batch whose responses-to-target E is within `tolerance` of E_min.

  From (S/S_min - 1)(E/E_min - 1) = 1 and S = E/B: expanding gives S E = S E_min + E S_min,
  i.e. 1 = E_min/E + S_min B/E, so E = E_min + B S_min = E_min (1 + B/B_crit). Then
  E <= (1 + tolerance) E_min  <=>  B <= tolerance * B_crit: about B_crit/5 at 20%, so the
  invariant range ends well before B_crit.
  """
  if tolerance < 0:
    raise ValueError(f"tolerance={tolerance}: must be >= 0")
  return float(tolerance * b_crit)


# --- 3. Compute-performance sigmoid ----------------------------------------------------------

def sigmoid(C, r0, A, B, c_mid):
  """R(C) = r0 + (A - r0) / (1 + (c_mid / C)^B); R(0) = r0."""
  C = np.asarray(C, dtype=float)
  with np.errstate(divide="ignore", over="ignore"):
    return r0 + (A - r0) / (1 + (c_mid / C) ** B)


_B_BOUNDS = (0.05, 10.0)


def _sse(C, y, A_minus_r0, B, c_mid) -> float:
  return float(np.sum((y - A_minus_r0 / (1 + (c_mid / C) ** B)) ** 2))


def _grid_search(C, y, a_grid, c_grid, r0):
  """Best (A, c_mid, B) on the grid; B first on a coarse grid, then by bounded least squares.

  With g = 1/(1 + (c_mid/C)^B) the residual y - (A - r0) g is linear in A, so the SSE of every A
  comes from two sums per (B, c_mid): the whole grid costs one (nB, nC, nPoints) array.
  """
  b_grid = np.geomspace(*_B_BOUNDS, 60)
  with np.errstate(over="ignore"):
    g = 1 / (1 + np.exp(b_grid[:, None, None] *
                        (np.log(c_grid)[None, :, None] - np.log(C)[None, None, :])))
  syg, sgg = (g * y).sum(-1), (g * g).sum(-1)           # (nB, nC)
  d = a_grid - r0                                       # (nA,)
  sse = (y @ y) - 2 * d[:, None, None] * syg + d[:, None, None] ** 2 * sgg
  ia, ib, ic = np.unravel_index(np.argmin(sse), sse.shape)
  A, c_mid = float(a_grid[ia]), float(c_grid[ic])
  # Refine B between its coarse neighbours by 1-D bounded least squares.
  lo, hi = b_grid[max(ib - 1, 0)], b_grid[min(ib + 1, b_grid.size - 1)]
  res = optimize.minimize_scalar(lambda b: _sse(C, y, A - r0, b, c_mid), bounds=(lo, hi),
                                 method="bounded")
  return A, float(res.x), c_mid


def fit_sigmoid(C, R, r0=None, a_grid=None, c_grid=None, polish: bool = True) -> dict:
  """ScaleRL's fit of R(C): a grid over A and c_mid, B by least squares, then a curve_fit polish.

  r0 defaults to R at C == 0 (their mean), else to R at the smallest C; points with C == 0 only
  set r0. A's grid runs from max(R) - 0.05 to min(1, max(R) + 0.3) by 0.005 (accuracy is at
  most 1). It starts below max(R) because on a plateau the largest of many noisy evaluations
  lies above the asymptote: a grid starting at max(R) biased A upward (+0.009 on average at
  0.01 noise in tests/test_fits.py); 0.05 is about three standard errors of an accuracy
  measured on 1000 prompts. c_mid's grid is log-spaced from a tenth of the smallest C to 30x
  the largest (the half-gain point may lie beyond the data). The polish keeps A and c_mid
  inside their grids' ranges.
  """
  C, R = _arrays(C, R, what="fit_sigmoid")
  if (C < 0).any():
    raise ValueError("fit_sigmoid: compute C must be >= 0")
  pos = C > 0
  if r0 is None:
    r0 = float(R[~pos].mean()) if (~pos).any() else float(R[np.argmin(C)])
  c, r = C[pos], R[pos]
  if c.size < 3:
    raise ValueError(f"fit_sigmoid: needs at least 3 points with C > 0, got {c.size}")
  if a_grid is None:
    top = float(r.max())
    start = max(top - 0.05, min(r0 + 0.005, top))   # A = r0 would be a flat line
    a_grid = np.arange(start, max(min(1.0, top + 0.3), top) + 1e-9, 0.005)
  if c_grid is None:
    c_grid = np.geomspace(c.min() / 10, c.max() * 30, 60)
  a_grid, c_grid = np.asarray(a_grid, float), np.asarray(c_grid, float)
  y = r - r0
  A, B, c_mid = _grid_search(c, y, a_grid, c_grid, r0)
  if polish:
    A, B, c_mid = _polish(c, y, r0, (A, B, c_mid), a_grid, c_grid)
  rmse = np.sqrt(np.mean((sigmoid(c, r0, A, B, c_mid) - r) ** 2))
  return dict(r0=float(r0), A=float(A), B=float(B), c_mid=float(c_mid), rmse=float(rmse))


def _polish(c, y, r0, start, a_grid, c_grid):
  """curve_fit from the grid's best point (c_mid in log space); keeps the grid's if not better."""
  A, B, c_mid = start
  lo = [a_grid.min(), _B_BOUNDS[0], np.log(c_grid.min())]
  hi = [max(a_grid.max(), a_grid.min() + 1e-9), _B_BOUNDS[1], np.log(c_grid.max())]
  p0 = np.clip([A, B, np.log(c_mid)], lo, hi)
  model = lambda cc, a, b, lc: (a - r0) / (1 + np.exp(b * (lc - np.log(cc))))  # noqa: E731
  try:
    with np.errstate(over="ignore"):
      p, _ = optimize.curve_fit(model, c, y, p0=p0, bounds=(lo, hi), max_nfev=500)
  except (RuntimeError, ValueError):
    return start
  if _sse(c, y, p[0] - r0, p[1], np.exp(p[2])) < _sse(c, y, A - r0, B, c_mid):
    return float(p[0]), float(p[1]), float(np.exp(p[2]))
  return start


def fit_sigmoid_interval(curves: list, reps: int = 500, seed: int = 0, level: float = 0.95,
                         **fit_kw) -> dict:
  """Bootstrap over the seeds of one configuration: {A, B, c_mid: (point, lo, hi)}, `failed`.

  `curves` holds one (C, R) per seed. Each rep resamples whole curves, averages R at the C
  values all curves share, and refits; the point is the fit on the mean of all curves.
  """
  maps = [dict(zip(np.asarray(c, float).tolist(), np.asarray(r, float).tolist()))
          for c, r in curves]
  if not maps:
    raise ValueError("fit_sigmoid_interval: no curves")
  common = sorted(set.intersection(*(set(m) for m in maps)))
  Rs = np.array([[m[x] for x in common] for m in maps])   # (seeds, points)
  point = fit_sigmoid(common, Rs.mean(0), **fit_kw)
  rng = np.random.default_rng(seed)
  draws, failed = {k: [] for k in ("A", "B", "c_mid")}, 0
  for _ in range(reps):
    pick = rng.integers(0, len(maps), len(maps))
    try:
      f = fit_sigmoid(common, Rs[pick].mean(0), **fit_kw)
    except (ValueError, RuntimeError):
      failed += 1
      continue
    for k in draws:
      draws[k].append(f[k])
  alpha = (1 - level) / 2
  out = {k: (point[k], *(float(q) for q in np.quantile(v, [alpha, 1 - alpha])))
         if v else (point[k], float("nan"), float("nan")) for k, v in draws.items()}
  out.update(failed=failed, reps=reps, fit=point)
  return out


def extrapolation_check(C, R, frac: float = 0.5, **fit_kw) -> dict:
  """Fit on C <= frac * max(C), predict R at the largest C and compare with the measurement.

  ScaleRL's test of a fit: a curve fitted on the first half of compute should predict the rest.
  `error` is predicted - measured.
  """
  C, R = _arrays(C, R, what="extrapolation_check")
  last = int(np.argmax(C))
  early = C <= frac * C[last]
  fit = fit_sigmoid(C[early], R[early], **fit_kw)
  predicted = float(sigmoid(C[last], fit["r0"], fit["A"], fit["B"], fit["c_mid"]))
  measured = float(R[last])
  return dict(fit=fit, c_final=float(C[last]), predicted=predicted, measured=measured,
              error=predicted - measured, n_fit=int(early.sum()))


# --- 4-6. Straight lines: signal and noise, generation time, trends --------------------------

def _ols(x, y) -> dict:
  """y = intercept + slope x by least squares, with R^2 and the coefficients' standard errors."""
  X = np.stack([np.ones_like(x), x], axis=1)
  (b0, b1), *_ = np.linalg.lstsq(X, y, rcond=None)
  resid = y - (b0 + b1 * x)
  ss_res, ss_tot = float(resid @ resid), float(((y - y.mean()) ** 2).sum())
  r2 = 1 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else float("nan"))
  dof = x.size - 2
  se0 = se1 = float("nan")
  if dof > 0:
    cov = ss_res / dof * np.linalg.inv(X.T @ X)
    se0, se1 = float(np.sqrt(cov[0, 0])), float(np.sqrt(cov[1, 1]))
  return dict(intercept=float(b0), slope=float(b1), r2=float(r2), se_intercept=se0,
              se_slope=se1, dof=dof)


def _distinct(x, k: int, what: str):
  if np.unique(x).size < k:
    raise ValueError(f"{what}: needs at least {k} distinct x values, got {np.unique(x).size}")


def fit_signal_noise(batches, grad_sq, level: float = 0.95) -> dict:
  """|G|^2 and tr(Sigma) from E|g_B|^2 = |G|^2 + tr(Sigma)/B: least squares of grad_sq on 1/B.

  b_simple = tr(Sigma)/|G|^2 (McCandlish et al. 2018). Intervals use the OLS standard errors
  with a t distribution; they are nan with fewer than 3 distinct B (two batch sizes determine
  the line exactly and say nothing about its error).
  """
  b, g = _arrays(batches, grad_sq, min_points=2, what="fit_signal_noise")
  if (b <= 0).any():
    raise ValueError("fit_signal_noise: batches must be positive")
  _distinct(b, 2, "fit_signal_noise")
  f = _ols(1 / b, g)
  nan2 = (float("nan"), float("nan"))
  g_iv, t_iv = nan2, nan2
  if np.unique(b).size >= 3 and f["dof"] > 0:
    t = sps.t.ppf(0.5 + level / 2, f["dof"])
    g_iv = (f["intercept"] - t * f["se_intercept"], f["intercept"] + t * f["se_intercept"])
    t_iv = (f["slope"] - t * f["se_slope"], f["slope"] + t * f["se_slope"])
  b_simple = f["slope"] / f["intercept"] if f["intercept"] > 0 else float("inf")
  return dict(grad_sq_true=f["intercept"], trace=f["slope"], b_simple=float(b_simple),
              r2=f["r2"], grad_sq_true_interval=tuple(map(float, g_iv)),
              trace_interval=tuple(map(float, t_iv)))


def fit_generation_time(n, t) -> dict:
  """t = t0 + n / theta_max by least squares; n_gen = t0 * theta_max.

  Below n_gen a generation batch is latency-bound (t ~ t0), above it throughput-bound
  (t ~ n / theta_max): n_gen is where the two asymptotes meet.
  """
  n, t = _arrays(n, t, min_points=2, what="fit_generation_time")
  _distinct(n, 2, "fit_generation_time")
  f = _ols(n, t)
  theta = 1 / f["slope"] if f["slope"] > 0 else float("inf")
  return dict(t0=f["intercept"], theta_max=float(theta), n_gen=float(f["intercept"] * theta),
              r2=f["r2"])


def critical_generation_batch(n, throughput, within: float = 0.1) -> float:
  """The smallest generation batch whose throughput is within `within` of the plateau (max)."""
  n, th = _arrays(n, throughput, min_points=1, what="critical_generation_batch")
  order = np.argsort(n, kind="stable")
  n, th = n[order], th[order]
  ok = th >= (1 - within) * th.max()
  return float(n[np.argmax(ok)])


def fit_linear(x, y) -> dict:
  """y = slope x + intercept by least squares."""
  x, y = _arrays(x, y, min_points=2, what="fit_linear")
  _distinct(x, 2, "fit_linear")
  f = _ols(x, y)
  return dict(slope=f["slope"], intercept=f["intercept"], r2=f["r2"])


def fit_power(x, y) -> dict:
  """y = coef x^exponent by least squares in log-log axes (R^2 of the log-log line).

  E.g. grad norm against B next to the 1/sqrt(B) reference (exponent -0.5), or time against
  batch: an exponent below 1 means time grows sublinearly.
  """
  x, y = _arrays(x, y, min_points=2, what="fit_power")
  if (x <= 0).any() or (y <= 0).any():
    raise ValueError("fit_power: x and y must be positive for a log-log fit")
  _distinct(x, 2, "fit_power")
  f = _ols(np.log(x), np.log(y))
  return dict(exponent=f["slope"], coef=float(np.exp(f["intercept"])), r2=f["r2"])

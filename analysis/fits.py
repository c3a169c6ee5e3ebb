"""Every fit a study report makes.

Pure numerics on arrays: crossing a target, the critical batch of E(B) = E_min (1 + B/B_crit)
(McCandlish et al. 2018), the compute-performance sigmoid (ScaleRL, Khatri et al. 2025), signal
and noise of the gradient, generation time, straight lines in linear or log-log axes and the
best learning rate of a scan. Each returns a dict of plain floats so that a report can write it
beside its figure, and each fit says in `reasons` why its data do not identify it (empty when
they do): a report prints "not identified (reasons)" instead of the number.
"""

from __future__ import annotations


import numpy as np
from scipy import optimize
from scipy import stats as sps

from analysis import stats
from rlscale.metrics import crossing


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


# --- 1. Crossing a target: rlscale/metrics/crossing.py (the study runner chooses with it too) ----------

first_crossing = crossing.first_crossing


# --- 2. The critical training batch -----------------------------------------------------------

# B_crit is searched between the smallest batch / _SPAN and the largest x _SPAN; an estimate
# beyond the batches tried by more than _BEYOND says only that it lies out there.
_SPAN, _BEYOND = 1000.0, 4.0


def _profile(log_b, log_e, bc):
  """For each B_crit in `bc` (G,) and each data set (R, K): E_min by least squares in log space
  and the sum of squared log residuals. Returns (log_e_min (R, G), sse (R, G))."""
  shape = np.log1p(np.exp(log_b)[None, None, :] / bc[None, :, None])     # (1, G, K)
  resid = log_e[:, None, :] - shape                                        # (R, G, K)
  a = resid.mean(-1)
  return a, ((resid - a[..., None]) ** 2).sum(-1)


def fit_critical_batch(batches, responses) -> dict:
  """E(B) = E_min (1 + B/B_crit) by least squares of log E (multiplicative errors).

  McCandlish's (S/S_min - 1)(E/E_min - 1) = 1 with S = E/B exactly (steps are responses over
  the batch) is the same law, so E is the one measured quantity and S_min = E_min/B_crit.
  `batches` and `responses`: one E per batch (the median over its seeds). Returns e_min,
  b_crit, s_min, the rms log residual, and `at_bound` when the best B_crit is at the edge of
  the search (the data do not pin it down).
  """
  b, e = _arrays(batches, responses, min_points=3, what="fit_critical_batch")
  if (b <= 0).any() or (e <= 0).any():
    raise ValueError("fit_critical_batch: batches and responses must be positive")
  _distinct(b, 3, "fit_critical_batch")
  grid = np.geomspace(b.min() / _SPAN, b.max() * _SPAN, 601)
  fit = _fit_many(np.log(b), np.log(e)[None, :], grid)
  return {k: float(v[0]) if k != "at_bound" else bool(v[0]) for k, v in fit.items()}


def _fit_many(log_b, log_e, grid) -> dict:
  """fit_critical_batch on R data sets at once: log_e (R, K)."""
  a, sse = _profile(log_b, log_e, grid)
  i = np.argmin(sse, axis=1)
  rows = np.arange(sse.shape[0])
  j = np.clip(i, 1, grid.size - 2)
  y0, y1, y2 = sse[rows, j - 1], sse[rows, j], sse[rows, j + 1]
  den = y0 - 2 * y1 + y2
  with np.errstate(divide="ignore", invalid="ignore"):
    shift = np.where(den > 0, 0.5 * (y0 - y2) / den, 0.0)
  step = np.log(grid[1]) - np.log(grid[0])
  at_bound = (i == 0) | (i == grid.size - 1)
  log_bc = np.where(at_bound, np.log(grid[i]), np.log(grid[j]) + np.clip(shift, -1, 1) * step)
  bc = np.exp(log_bc)
  shape = np.log1p(np.exp(log_b)[None, :] / bc[:, None])                  # (R, K)
  resid = log_e - shape
  log_e_min = resid.mean(-1)
  rms = np.sqrt(((resid - log_e_min[:, None]) ** 2).mean(-1))
  e_min = np.exp(log_e_min)
  return dict(b_crit=bc, e_min=e_min, s_min=e_min / bc, residual=rms, at_bound=at_bound)


def critical_batch(points_by_batch: dict, reps: int = 1000, level: float = 0.95,
                   seed: int = 0, min_seeds: int = 3) -> dict:
  """B_crit with its interval from resampling seeds, and the diagnostics that decide whether
  the data identify it.

  `points_by_batch` maps each batch B to its seeds' responses to target (inf: never reached).
  The fit uses the median per batch; each bootstrap rep resamples the seeds within every batch
  and refits (its coverage is tested by simulation at 5 seeds, tests/unit/analysis/test_fits.py). Reasons
  for "not identified":
  - fewer than 3 batches, a batch whose median never reached the target, or one with fewer
    than `min_seeds` seeds;
  - `monotone`: E does not fall with B (a fall larger than the two medians' intervals is a
    law the data break: E_min (1 + B/B_crit) only grows);
  - `residual`: the log residuals are within what the seeds' spread allows (the chi-square of
    the medians' residuals, with the spread pooled over batches, below its 99% quantile; an
    rms below 0.05 when no spread is known);
  - `inside`: B_crit lies within [smallest B / 4, largest B x 4] in at least `level` of the
    reps; beyond it the data give only a bound (`bound` = the reps' 5% or 95% quantile).

  A rep in which a batch's resampled median never reached the target (more than half its
  resampled seeds were censored) has no fit. It is not dropped, which would condition the
  interval on the reps that reached it: it counts on whichever side widens each bound (a bound
  that falls among such reps is 0 or inf) and as outside for `inside`; `failed_reps` and
  `failed_share` say how many there were. The `*_draws` hold the fitted reps only.
  """
  batches = sorted(points_by_batch)
  seeds = [np.asarray(points_by_batch[b], float) for b in batches]
  b = np.asarray(batches, float)
  med = np.array([np.median(s) for s in seeds])
  out = dict(batches=list(map(float, b)), medians=list(map(float, med)), n=[len(s) for s in seeds],
             reasons=[])
  if len(b) < 3:
    out["reasons"].append(f"{len(b)} batches (3 are needed)")
  never = [f"{x:g}" for x, m in zip(batches, med) if not np.isfinite(m)]
  if never:
    out["reasons"].append(f"the median of B = {', '.join(never)} never reached the target")
  few = [f"{x:g}" for x, v in zip(batches, seeds) if v.size < min_seeds]
  if few:
    out["reasons"].append(f"fewer than {min_seeds} seeds at B = {', '.join(few)} (a bootstrap "
                          "over so few gives an interval far narrower than its level)")
  if out["reasons"]:
    return dict(out, identified=False)
  fit = fit_critical_batch(b, med)
  out.update(fit)
  rng = np.random.default_rng(seed)
  boot = np.stack([np.median(s[rng.integers(0, s.size, (reps, s.size))], axis=1)
                   for s in seeds], axis=1)                               # (reps, K)
  ok = np.isfinite(boot).all(axis=1)
  grid = np.geomspace(b.min() / _SPAN, b.max() * _SPAN, 601)
  many = _fit_many(np.log(b), np.log(boot[ok]), grid) if ok.any() else None
  draws = {}
  for k in ("b_crit", "e_min", "s_min"):
    draws[k] = np.full(reps, np.nan)           # nan: a rep with no fit (stats.percentile_bounds)
    if many is not None:
      draws[k][ok] = many[k]
    lo, hi = stats.percentile_bounds(draws[k], level, linear=True)
    out[f"{k}_lo"], out[f"{k}_hi"] = max(lo, 0.0), hi
  if many is not None:
    out["b_crit_draws"], out["e_min_draws"] = many["b_crit"], many["e_min"]
  out["reps"], out["failed_reps"] = reps, int((~ok).sum())
  out["failed_share"] = float((~ok).mean())
  # Diagnostics.
  spread = _log_median_se(seeds)
  with np.errstate(invalid="ignore"):   # a quantile against an inf seed: nan, never a fall
    lo_i = [np.quantile(s, 0.1) for s in seeds]
    hi_i = [np.quantile(s, 0.9) for s in seeds]
  falls = [f"{batches[i]:g} -> {batches[i + 1]:g}" for i in range(len(b) - 1)
           if lo_i[i] > hi_i[i + 1]]
  if falls:
    out["reasons"].append("E falls with B (" + ", ".join(falls) + "), which the law forbids")
  resid = np.log(med) - (np.log(fit["e_min"]) + np.log1p(b / fit["b_crit"]))
  dof = len(b) - 2
  if np.isfinite(spread).all() and (spread > 0).all():
    chi2 = float(np.sum((resid / spread) ** 2))
    out["chi2"], out["dof"] = chi2, dof
    if chi2 > sps.chi2.ppf(0.99, dof):
      out["reasons"].append(f"residuals beyond the seeds' spread (chi-square {chi2:.1f} on "
                            f"{dof} dof)")
  elif fit["residual"] > 0.05:
    out["reasons"].append(f"rms log residual {fit['residual']:.3f} > 0.05")
  out["law_reasons"] = list(out["reasons"])  # the law's own failures, before the range's
  out["grid_top"] = float(grid[-1])
  lo_b, hi_b = b.min() / _BEYOND, b.max() * _BEYOND
  bc = draws["b_crit"]
  with np.errstate(invalid="ignore"):
    inside, above, below = (float(np.mean(v)) for v in ((bc >= lo_b) & (bc <= hi_b), bc > hi_b,
                                                         bc < lo_b))
  out["inside"] = inside
  if inside < level:
    q05, q95 = stats.percentile_bounds(bc, 0.9, linear=True)
    if out["failed_share"] > max(above, below):
      out["reasons"].append(f"{out['failed_share']:.0%} of the bootstrap reps had a batch whose "
                            "median never reached the target: these seeds do not bound B_crit")
    elif above >= below:
      out["bound"] = ("lower", max(q05, 0.0))
      out["reasons"].append(f"B_crit beyond {hi_b:g} in {above:.0%} of the reps: E barely "
                            "grows over the batches tried (a lower bound only)")
    else:
      out["bound"] = ("upper", q95)
      out["reasons"].append("B_crit below the batches tried: E grows in proportion to B "
                            "throughout (an upper bound only)")
  return dict(out, identified=not out["reasons"])


def _log_median_se(seeds: list) -> np.ndarray:
  """Standard error of log(median) per batch: 1.253 sd/sqrt(n) (the median's efficiency under
  normal errors), with sd the spread of log E pooled over the batches (the seeds' spread is one
  property of the runs; five seeds alone would estimate it too noisily); nan for batches with
  fewer than 2 finite seeds, and everywhere when fewer than 3 seeds are pooled."""
  logs = [np.log(s[np.isfinite(s)]) for s in seeds]
  dev = [v - v.mean() for v in logs if v.size >= 2]
  dof = sum(v.size - 1 for v in logs if v.size >= 2)
  if dof < 3:
    return np.full(len(seeds), np.nan)
  sd = np.sqrt(sum(float((d ** 2).sum()) for d in dev) / dof)
  return np.array([1.2533 * sd / np.sqrt(v.size) if v.size >= 2 else np.nan for v in logs])


def tolerance_batch(b_crit: float, tolerance: float = 0.2) -> float:
  """The largest batch whose responses-to-target E is within `tolerance` of E_min.

  E = E_min (1 + B/B_crit), so E <= (1 + tolerance) E_min  <=>  B <= tolerance * B_crit:
  about B_crit/5 at 20%, so the invariant range ends well before B_crit.
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
  0.01 noise in tests/unit/analysis/test_fits.py); 0.05 is about three standard errors of an accuracy
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
  return dict(r0=float(r0), A=float(A), B=float(B), c_mid=float(c_mid), rmse=float(rmse),
              reasons=_sigmoid_reasons(A, B, c_mid, a_grid, c_grid, c))


def _sigmoid_reasons(A, B, c_mid, a_grid, c_grid, c) -> list[str]:
  """Why a sigmoid fit does not identify its parameters (empty: it does).

  A parameter at the edge of its search is not determined by the data (the fit would go
  further); a half-gain point past the last evaluation makes A an extrapolation.
  """
  out = []
  step = 1e-6 + 1e-3 * (_B_BOUNDS[1] - _B_BOUNDS[0])
  if B <= _B_BOUNDS[0] + step or B >= _B_BOUNDS[1] - step:
    out.append(f"B at its bound ({B:.3g})")
  if A >= a_grid.max() - 1e-9 and a_grid.size > 1:
    out.append(f"A at its grid's top ({A:.3g})")
  if c_mid <= c_grid.min() * 1.001 or c_mid >= c_grid.max() / 1.001:
    out.append(f"C_mid at its grid's edge ({c_mid:.3g})")
  if c_mid > c.max():
    out.append(f"C_mid {c_mid:.3g} past the last evaluation {c.max():.3g}: A is an "
               "extrapolation")
  return out


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
  out.update(failed=failed, reps=reps, fit=point, reasons=list(point["reasons"]))
  if len(maps) < 3:
    out["reasons"].append(f"{len(maps)} seed(s): too few to resample")
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
  the line exactly and say nothing about its error). `reasons` says why B_simple is not
  identified: too few batches, or an interval of |G|^2 or tr(Sigma) that reaches zero (no
  1/B trend above the noise, or no signal left).
  """
  b, g = _arrays(batches, grad_sq, min_points=2, what="fit_signal_noise")
  if (b <= 0).any():
    raise ValueError("fit_signal_noise: batches must be positive")
  _distinct(b, 2, "fit_signal_noise")
  f = _ols(1 / b, g)
  nan2 = (float("nan"), float("nan"))
  g_iv, t_iv = nan2, nan2
  reasons = []
  if np.unique(b).size >= 3 and f["dof"] > 0:
    t = sps.t.ppf(0.5 + level / 2, f["dof"])
    g_iv = (f["intercept"] - t * f["se_intercept"], f["intercept"] + t * f["se_intercept"])
    t_iv = (f["slope"] - t * f["se_slope"], f["slope"] + t * f["se_slope"])
    if g_iv[0] <= 0:
      reasons.append("the interval of |G|^2 reaches zero")
    if t_iv[0] <= 0:
      reasons.append("the interval of tr(Sigma) reaches zero (no 1/B trend above the noise)")
  else:
    reasons.append(f"{np.unique(b).size} distinct batches (3 are needed for an interval)")
  b_simple = f["slope"] / f["intercept"] if f["intercept"] > 0 else float("inf")
  return dict(grad_sq_true=f["intercept"], trace=f["slope"], b_simple=float(b_simple),
              r2=f["r2"], grad_sq_true_interval=tuple(map(float, g_iv)),
              trace_interval=tuple(map(float, t_iv)), reasons=reasons)


def fit_generation_time(n, t) -> dict:
  """t = t0 + n / theta_max by least squares; n_gen = t0 * theta_max.

  Below n_gen a generation batch is latency-bound (t ~ t0), above it throughput-bound
  (t ~ n / theta_max): n_gen is where the two asymptotes meet. `reasons`: a non-positive t0 or
  slope (no latency floor or no growth: the law does not describe the data), R^2 below 0.9,
  or the crossing N_gen outside the batches measured (an extrapolation).
  """
  n, t = _arrays(n, t, min_points=2, what="fit_generation_time")
  _distinct(n, 2, "fit_generation_time")
  f = _ols(n, t)
  theta = 1 / f["slope"] if f["slope"] > 0 else float("inf")
  n_gen = f["intercept"] * theta
  reasons = []
  if f["intercept"] <= 0:
    reasons.append(f"t0 = {f['intercept']:.3g} s is not positive")
  if f["slope"] <= 0:
    reasons.append("time does not grow with the batch")
  if not f["r2"] >= 0.9:
    reasons.append(f"R^2 {f['r2']:.2f} < 0.9")
  if not reasons and not n.min() <= n_gen <= n.max():
    reasons.append(f"N_gen = {n_gen:.3g} outside the batches measured "
                   f"[{n.min():g}, {n.max():g}]")
  return dict(t0=f["intercept"], theta_max=float(theta), n_gen=float(n_gen), r2=f["r2"],
              reasons=reasons)


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


def fit_power(x, y, level: float = 0.95) -> dict:
  """y = coef x^exponent by least squares in log-log axes, with the exponent's interval (t
  distribution; nan with fewer than 3 points) and R^2 of the log-log line.

  E.g. grad norm against B next to the 1/sqrt(B) reference (exponent -0.5), or time against
  batch: an exponent below 1 means time grows sublinearly.
  """
  x, y = _arrays(x, y, min_points=2, what="fit_power")
  if (x <= 0).any() or (y <= 0).any():
    raise ValueError("fit_power: x and y must be positive for a log-log fit")
  _distinct(x, 2, "fit_power")
  f = _ols(np.log(x), np.log(y))
  lo = hi = float("nan")
  if f["dof"] > 0:
    t = sps.t.ppf(0.5 + level / 2, f["dof"])
    lo, hi = f["slope"] - t * f["se_slope"], f["slope"] + t * f["se_slope"]
  return dict(exponent=f["slope"], exponent_lo=float(lo), exponent_hi=float(hi),
              coef=float(np.exp(f["intercept"])), r2=f["r2"])


# --- 7. The learning rate per batch ----------------------------------------------------------

def lr_optimum(lrs, responses) -> dict:
  """The best learning rate of a scan, refined between grid points.

  `responses`: responses to target at each lr (the median over seeds; inf: never reached).
  The best grid value is refined by a parabola through log E at it and its two neighbours in
  log lr (a minimum of the parabola within half a grid step either side), when both neighbours
  reached the target. `at_edge` when the best value is the smallest or largest lr tried: the
  optimum may lie outside the scan.
  """
  lr, e = (np.asarray(v, float).ravel() for v in (lrs, responses))
  if lr.size != e.size or lr.size == 0:
    raise ValueError(f"lr_optimum: {lr.size} learning rates but {e.size} values")
  order = np.argsort(lr)
  lr, e = lr[order], e[order]
  if not np.isfinite(e).any():
    return dict(lr=float("nan"), grid_lr=float("nan"), at_edge=False, reached=False)
  i = int(np.argmin(e))
  out = dict(grid_lr=float(lr[i]), lr=float(lr[i]), reached=True,
             at_edge=bool(lr.size == 1 or i in (0, lr.size - 1)))
  if 0 < i < lr.size - 1 and np.isfinite(e[i - 1]) and np.isfinite(e[i + 1]):
    x = np.log(lr[i - 1:i + 2])
    a, b, _ = np.polyfit(x, np.log(e[i - 1:i + 2]), 2)
    if a > 0:
      half = 0.5 * min(x[1] - x[0], x[2] - x[1])
      out["lr"] = float(np.exp(np.clip(-b / (2 * a), x[1] - half, x[1] + half)))
  return out


def _optimum_rows(lrs: np.ndarray, e: np.ndarray) -> np.ndarray:
  """lr_optimum over many rows at once: `e` (R, K) medians at the sorted rates `lrs` (K,);
  the best grid rate refined by the parabola through its neighbours in log-log (nan when a row
  never reached the target)."""
  x = np.log(lrs)
  y = np.log(np.where(np.isfinite(e), e, np.inf))
  i = np.argmin(y, axis=1)
  rows = np.arange(e.shape[0])
  best = x[i]
  out = best.copy()
  if lrs.size >= 3:
    j = np.clip(i, 1, lrs.size - 2)
    y0, y1, y2 = y[rows, j - 1], y[rows, j], y[rows, j + 1]
    x0, x1, x2 = x[j - 1], x[j], x[j + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
      # The vertex of the parabola through three points (x need not be evenly spaced).
      d1, d2 = (y1 - y0) / (x1 - x0), (y2 - y1) / (x2 - x1)
      a = (d2 - d1) / (x2 - x0)
      vertex = 0.5 * (x0 + x1) - d1 / (2 * a)
      half = 0.5 * np.minimum(x1 - x0, x2 - x1)
      refined = np.clip(vertex, x1 - half, x1 + half)
    ok = (i > 0) & (i < lrs.size - 1) & np.isfinite(y0) & np.isfinite(y2) & (a > 0)
    out = np.where(ok, refined, best)
  return np.where(np.isfinite(y[rows, i]), np.exp(out), np.nan)


def lr_exponent(cells: dict, reps: int = 1000, level: float = 0.95, seed: int = 0) -> dict:
  """The exponent a of lr*(B) ∝ B^a from a scan: `cells` maps (B, lr) to its seeds' responses
  to target (inf: never reached). Per B the best rate of the medians (lr_optimum, refined),
  then a least-squares line of log lr* on log B; the interval resamples the seeds within every
  cell and refits. Returns exponent, lo, hi, the per-B optima and the smallest seed count."""
  by_b: dict[float, list] = {}
  for (b, lr), v in sorted(cells.items()):
    by_b.setdefault(float(b), []).append((float(lr), np.asarray(v, float)))
  batches = sorted(by_b)
  rng = np.random.default_rng(seed)
  point, draws = [], []
  for b in batches:
    lrs = np.array([lr for lr, _ in by_b[b]])
    med = np.array([[np.median(v) for _, v in by_b[b]]])
    point.append(_optimum_rows(lrs, med)[0])
    boot = np.stack([np.median(v[rng.integers(0, v.size, (reps, v.size))], axis=1)
                     for _, v in by_b[b]], axis=1)
    draws.append(_optimum_rows(lrs, boot))
  logb = np.log(np.asarray(batches))
  def slope(lr_star):  # (R, nB) -> (R,), nan where a batch never reached the target
    y = np.log(lr_star)
    xc = logb - logb.mean()
    return ((y - y.mean(axis=-1, keepdims=True)) * xc).sum(-1) / (xc ** 2).sum()
  out = dict(batches=batches, optima=list(map(float, point)),
             seeds=int(min(v.size for vs in by_b.values() for _, v in vs)) if by_b else 0)
  if len(batches) < 2 or not np.isfinite(point).all():
    return dict(out, exponent=float("nan"), lo=float("nan"), hi=float("nan"))
  if out["seeds"] < 2:  # one seed per rate: a bootstrap would give a zero-width interval
    return dict(out, exponent=float(slope(np.asarray(point)[None])[0]), lo=float("nan"),
                hi=float("nan"))
  s = slope(np.stack(draws, axis=1))
  s = s[np.isfinite(s)]
  alpha = (1 - level) / 2
  lo, hi = np.quantile(s, [alpha, 1 - alpha]) if s.size else (np.nan, np.nan)
  return dict(out, exponent=float(slope(np.asarray(point)[None])[0]), lo=float(lo),
              hi=float(hi))


def lr_exponent_coverage(design: dict, exponent: float, spread: float, curvature: float,
                         datasets: int = 200, reps: int = 200, level: float = 0.95,
                         seed: int = 0) -> float:
  """How often `lr_exponent`'s interval covers the truth on simulated scans of this `design`
  ({(B, lr): seeds}): E = (1 + curvature log2(lr/lr*(B))^2) x log-normal(spread), with
  lr*(B) = the design's middle rate x (B/B_mid)^exponent."""
  rng = np.random.default_rng(seed)
  keys = sorted(design)
  b = np.array([k[0] for k in keys], float)
  lr = np.array([k[1] for k in keys], float)
  b_mid = float(np.exp(np.mean(np.log(np.unique(b)))))
  lr_mid = float(np.exp(np.mean(np.log(lr))))
  star = lr_mid * (b / b_mid) ** exponent
  base = 1 + curvature * np.log2(lr / star) ** 2
  covered = 0
  for i in range(datasets):
    cells = {k: base[j] * np.exp(spread * rng.standard_normal(design[k]))
             for j, k in enumerate(keys)}
    f = lr_exponent(cells, reps=reps, level=level, seed=i)
    covered += f["lo"] <= exponent <= f["hi"]
  return covered / datasets

"""How many seeds a batch-size verdict needs: a power calculation on the log scale.

A configuration's responses to target vary from seed to seed roughly log-normally: log E has
a seed-to-seed spread `sigma` (0.28 pooled over the chain-sum study's cells). A verdict
compares the median of n seeds at a batch B with the median of m at the reference B0 and
calls B

- *settled broken* when the one-sided 95% lower bound of E(B)/E(B0) lies above 1 + tolerance;
- *settled invariant* when the one-sided 95% upper bound lies below 1 + tolerance.

The median of n normal values has variance (pi/2) sigma^2 / n (its asymptotic efficiency is
2/pi of the mean's), so log of the ratio of medians has the standard error
se = sigma sqrt(pi/2 (1/n + 1/m)), and a true ratio r settles as broken with probability
Phi((log r - log(1 + tol)) / se - z_0.95), as invariant with Phi((log(1 + tol) - log r) / se -
z_0.95). `seeds_needed` inverts the first for equal n = m. The normal approximation is checked
against simulated bootstrap verdicts in tests/unit/study/test_power.py.
"""

from __future__ import annotations

import math
from statistics import NormalDist

_N = NormalDist()
MEDIAN_VARIANCE = math.pi / 2  # var(median) / var(mean) for normal values, n large


def standard_error(sigma: float, n: int, m: int) -> float:
  """Standard error of log(median of n / median of m) for log-normal values of spread sigma."""
  if n < 1 or m < 1:
    raise ValueError(f"n={n}, m={m}: need at least one seed on each side")
  return sigma * math.sqrt(MEDIAN_VARIANCE * (1 / n + 1 / m))


def p_broken(ratio: float, sigma: float, n: int, m: int | None = None,
             tolerance: float = 0.2, level: float = 0.95) -> float:
  """Probability that a batch whose true ratio is `ratio` settles as broken."""
  se = standard_error(sigma, n, n if m is None else m)
  return _N.cdf((math.log(ratio) - math.log1p(tolerance)) / se - _N.inv_cdf(level))


def p_invariant(ratio: float, sigma: float, n: int, m: int | None = None,
                tolerance: float = 0.2, level: float = 0.95) -> float:
  """Probability that a batch whose true ratio is `ratio` settles as invariant."""
  se = standard_error(sigma, n, n if m is None else m)
  return _N.cdf((math.log1p(tolerance) - math.log(ratio)) / se - _N.inv_cdf(level))


def seeds_needed(sigma: float, ratio: float = 1.5, tolerance: float = 0.2,
                 power: float = 0.8, level: float = 0.95, invariant: bool = False) -> int:
  """Seeds per side (n = m) for a true `ratio` to settle (as broken, or with `invariant` as
  invariant) with probability `power`."""
  gap = abs(math.log(ratio) - math.log1p(tolerance))
  if gap == 0:
    raise ValueError(f"ratio {ratio} equals 1 + tolerance: no number of seeds settles it")
  if invariant != (ratio < 1 + tolerance):
    raise ValueError(f"ratio {ratio} cannot settle as {'invariant' if invariant else 'broken'}"
                     f" at tolerance {tolerance}")
  z = _N.inv_cdf(level) + _N.inv_cdf(power)
  return max(2, math.ceil(2 * MEDIAN_VARIANCE * (sigma * z / gap) ** 2))


def pooled_spread(groups) -> tuple[float, int]:
  """(pooled standard deviation of log values within groups, degrees of freedom) over groups
  of positive finite values (a group's runs that never reached the target are left out: they
  say nothing of the spread of those that did, and the report says how many there were)."""
  ss, dof = 0.0, 0
  for g in groups:
    logs = [math.log(v) for v in g if v is not None and math.isfinite(v) and v > 0]
    if len(logs) < 2:
      continue
    mean = sum(logs) / len(logs)
    ss += sum((v - mean) ** 2 for v in logs)
    dof += len(logs) - 1
  if dof == 0:
    return math.nan, 0
  return math.sqrt(ss / dof), dof

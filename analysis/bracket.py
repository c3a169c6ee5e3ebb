"""Where invariance breaks, as a bracket: invariant up to X, broken from Y.

Each batch B of a series is compared with the series' reference B0 by the ratio of median
responses to target, E(B) / E(B0), over their verdict seeds, and by the curve test
(analysis/curve_test.py). A batch is

- *settled invariant* when the one-sided 95% upper bound of its ratio lies at or below
  1 + tolerance and the curve test does not find its curve below the reference's;
- *settled broken* when the one-sided 95% lower bound lies above 1 + tolerance, or the curve
  test rejects;
- *not settled* otherwise: more seeds would decide it (the power calculation says how many).

X is the largest B such that every B from the reference up to it is settled invariant (the
reference itself when the next batch is not); Y is the smallest B such that it and every
larger B run are settled broken (none when the largest batch is not). Batches between them are
not settled. Unlike a walk that stops at the first point estimate above the tolerance, the
bracket says nothing its intervals do not: a batch whose ratio interval straddles 1 +
tolerance is neither.

`resampled` recomputes the bracket on seed resamples (each configuration's seeds drawn with
replacement, its intervals from the log-normal approximation of rlscale/study/power.py), and
the report prints how often each answer comes back. `false_break_rate` simulates the whole
procedure on batches that are all truly invariant, at the study's seed counts and spread.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from statistics import NormalDist

import numpy as np

from rlscale.study import power

Z95 = NormalDist().inv_cdf(0.95)
# The curve test's level inside the bracket: a falsely rejected largest batch alone makes a Y,
# so at 5% per batch the bracket's false-break rate would exceed 5% (5.2% simulated); at 2.5%
# it is 2.5% (tests/unit/analysis/test_bracket.py).
CURVE_LEVEL = 0.025


@dataclasses.dataclass(frozen=True)
class Batch:
  B: int
  lo: float  # one-sided 95% lower bound of E(B) / E(B0) (nan: none)
  hi: float  # one-sided 95% upper bound
  curve_rejects: bool = False  # the curve test finds the curve below the reference's
  is_reference: bool = False


def settled_invariant(b: Batch, tolerance: float) -> bool:
  return b.is_reference or (not b.curve_rejects and b.hi <= 1 + tolerance)


def settled_broken(b: Batch, tolerance: float) -> bool:
  return not b.is_reference and (b.curve_rejects or b.lo > 1 + tolerance)


def bracket(batches: list[Batch], tolerance: float) -> tuple[int, int | None]:
  """(X, Y): invariant up to X, broken from Y (None: no batch is, with every larger one)."""
  return walk([(b.B, settled_invariant(b, tolerance), settled_broken(b, tolerance),
                b.is_reference) for b in batches])


def walk(flags: list[tuple[int, bool, bool, bool]]) -> tuple[int, int | None]:
  """(X, Y) from per-batch decisions (B, settled invariant, settled broken, is the reference):
  X the last B of the unbroken run of invariant batches above the reference, Y the first of
  the run of broken batches that ends at the largest B."""
  order = sorted(flags)
  ref = next(i for i, f in enumerate(order) if f[3])
  up = ref
  while up + 1 < len(order) and order[up + 1][1]:
    up += 1
  y = None
  for b, _, broken, _ in reversed(order[ref + 1:]):
    if not broken:
      break
    y = b
  return order[up][0], y


def describe(x: int, y: int | None, batches: list[int], broken=()) -> str:
  """The bracket in words, over the series' batches `batches` (`broken`: those settled broken,
  to tell them apart from the unsettled ones between X and Y)."""
  bs = sorted(batches)
  text = f"invariant up to B = {x}"
  if y is None:
    text += f"; no batch up to B = {bs[-1]} settled broken with every larger one"
    between = [b for b in bs if b > x]
  else:
    text += f", broken from B = {y}"
    between = [b for b in bs if x < b < y]
  gone = [b for b in between if b in set(broken)]
  open_ = [b for b in between if b not in set(broken)]
  if gone:
    text += f"; settled broken also at B = {', '.join(map(str, gone))}"
  if open_:
    text += f"; not settled at B = {', '.join(map(str, open_))}"
  return text


def log_bounds(values: np.ndarray, ref: np.ndarray, shift: float = 0.0,
               extra_var: float = 0.0) -> tuple[float, float]:
  """One-sided 95% bounds of median(values) / median(ref) from the log-normal approximation:
  each side's spread of log values, the median's variance pi/2 x sigma^2 / n. A side more than
  half of whose seeds never reached the target is censored: its median is beyond its budget,
  and the bound on that side is unbounded. `shift` is subtracted from the log ratio and
  `extra_var` added to its variance: a correction of each side to its best rate and the
  correction's own uncertainty (rlscale/study/lr_fit.py)."""
  a, r = np.asarray(values, float), np.asarray(ref, float)
  if np.median(r) == np.inf:
    return 0.0, math.inf
  if np.median(a) == np.inf:
    return math.inf, math.inf
  la, lr = np.log(a[np.isfinite(a)]), np.log(r[np.isfinite(r)])
  s2 = [v.var(ddof=1) if v.size > 1 else math.nan for v in (la, lr)]
  if any(math.isnan(v) for v in s2):
    return math.nan, math.nan
  se = math.sqrt(power.MEDIAN_VARIANCE * (s2[0] / a.size + s2[1] / r.size) + extra_var)
  centre = math.log(np.median(a)) - math.log(np.median(r)) - shift
  return math.exp(centre - Z95 * se), math.exp(centre + Z95 * se)


def resampled(values: dict[int, np.ndarray], b0: int, tolerance: float,
              curve_rejects: dict[int, bool] | None = None, reps: int = 1000,
              seed: int = 0, shifts: dict | None = None) -> collections.Counter:
  """How often each bracket (X, Y) comes back when every configuration's seeds are drawn again
  with replacement (the curve test's result held at the data's: a permutation test inside
  every resample would cost more than it tells). `shifts`: B -> (shift, extra variance) of
  its log ratio (`log_bounds`)."""
  rng = np.random.default_rng(seed)
  rejects, shifts = curve_rejects or {}, shifts or {}
  out: collections.Counter = collections.Counter()
  for _ in range(reps):
    draw = {b: v[rng.integers(0, v.size, v.size)] for b, v in values.items()}
    batches = []
    for b, v in draw.items():
      lo, hi = (1.0, 1.0) if b == b0 else log_bounds(v, draw[b0], *shifts.get(b, (0.0, 0.0)))
      batches.append(Batch(b, lo, hi, rejects.get(b, False), b == b0))
    out[bracket(batches, tolerance)] += 1
  return out


def false_break_rate(batches: list[int], b0: int, n: int, sigma: float,
                     tolerance: float = 0.2, curve_false_rate: float = CURVE_LEVEL,
                     draws: int = 2000, seed: int = 0) -> float:
  """Share of simulated studies, every batch truly invariant (the same E at every B), seed
  spread `sigma`, n seeds per batch, whose bracket has a Y; the curve test rejects each batch
  falsely with probability `curve_false_rate` (its calibrated level, analysis/curve_test.py,
run at CURVE_LEVEL in the report)."""
  rng = np.random.default_rng(seed)
  hits = 0
  for _ in range(draws):
    vals = {b: np.exp(sigma * rng.standard_normal(n)) for b in batches}
    bs = []
    for b, v in vals.items():
      lo, hi = (1.0, 1.0) if b == b0 else log_bounds(v, vals[b0])
      bs.append(Batch(b, lo, hi, b != b0 and rng.random() < curve_false_rate, b == b0))
    hits += bracket(bs, tolerance)[1] is not None
  return hits / draws


def power_lines(sigma: float, n: int, m: int, tolerance: float) -> dict[str, float]:
  """The power calculation the report prints for a series: at its seeds and spread, how often
  a true ratio of 1.5 settles broken and one of 1.0 settles invariant, and the seeds per side
  each would need for 80%."""
  return {"p_broken_1.5": power.p_broken(1.5, sigma, n, m, tolerance),
          "p_invariant_1.0": power.p_invariant(1.0, sigma, n, m, tolerance),
          "seeds_broken_1.5": power.seeds_needed(sigma, 1.5, tolerance),
          "seeds_invariant_1.0": power.seeds_needed(sigma, 1.0, tolerance, invariant=True)}

"""One fit of E(B, lr) over every batch of a rate scan: the rate per batch, and what choosing it
costs the verdict.

A scan runs a few rates a factor sqrt(2) apart at each batch B, 3 seeds each. Read batch by
batch, each rate's median responses to target rests on 3 seeds, so the batch's best rate is
uncertain by about a grid step. Read together, the batches share what varies smoothly: near its
optimum, log E is a parabola in x = log lr of one curvature, whose vertex moves as a power of B,

    log E(B, lr) = nu_B + a x^2 + (c1 + c2 log B) x,    x*(B) = -(c1 + c2 log B) / (2 a),

one intercept per batch and three shared numbers, fitted by least squares to the log medians of
every (B, lr) whose median reached the target and whose rate is eligible (the study's band rule:
rlscale/study/study.choose). The rate of a batch is the scan's rate nearest its vertex.

The verdict then runs that rate alone, and reads E at the optimum as

    log E*(B) = log E(B, lr_c) - a (log lr_c - x*(B))^2,

the correction's uncertainty (the fit's, from the scan seeds) added to the verdict seeds' own:
`corrections` redraws the scan's seeds, refits and returns the correction per draw, so that a
ratio E*(B) / E*(B0) carries the spread of the difference of two corrections, which share the
fit. The fit is *not identified* (None, with the reason) when it has no positive curvature, too
few points for its parameters plus 2, or residuals beyond what the seeds' spread explains
(`lack_of_fit`); the study then chooses batch by batch and runs the runner-up beside the choice.
tests/unit/study/test_lr_fit.py: on synthetic surfaces at the study's shape (5 rates, 3 seeds,
seed spread 0.28, optimum off the grid), the fit picks the rate nearest the true optimum more
often than the batch-by-batch rule, and the corrected ratio's one-sided 95% bounds cover the
true ratio at the optimum.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rlscale.study import power

# Residuals of the log medians beyond this multiple of what the seed spread explains: the
# parabola with one curvature and a power-law vertex does not describe the scan.
LACK_OF_FIT = 2.0


@dataclasses.dataclass(frozen=True)
class Fit:
  a: float  # curvature of log E in log lr (> 0)
  c1: float
  c2: float
  intercepts: dict  # {B: nu_B}
  resid_sd: float  # of the log medians about the fit
  expected_sd: float  # what the seeds' spread alone gives a median
  points: int

  def vertex(self, b: float) -> float:
    """log of the best rate at batch `b`."""
    return -(self.c1 + self.c2 * math.log(b)) / (2 * self.a)

  def log_e(self, b: float, lr: float) -> float:
    x = math.log(lr)
    return self.intercepts[b] + self.a * x * x + (self.c1 + self.c2 * math.log(b)) * x

  def penalty(self, b: float, lr: float, lo: float | None = None, hi: float | None = None
              ) -> float:
    """a (log lr - x*(B))^2: how much slower than the optimum `lr` is at `b`, in log E; the
    vertex held within [lo, hi] (the rates scanned there) when given."""
    v = self.vertex(b)
    if lo is not None:
      v = min(max(v, math.log(lo)), math.log(hi))
    return self.a * (math.log(lr) - v) ** 2


def cells(runs: list[dict]) -> dict[tuple[float, float], np.ndarray]:
  """{(B, lr): responses to target of its seeds (inf: never reached)} from runs given as dicts
  with B, lr and responses_to_target (None: never reached)."""
  out: dict = {}
  for r in runs:
    v = r["responses_to_target"]
    out.setdefault((float(r["B"]), float(r["lr"])), []).append(math.inf if v is None else v)
  return {k: np.asarray(v, float) for k, v in out.items()}


def _medians(values: dict, eligible: set) -> list[tuple[float, float, float, int]]:
  """(B, lr, log median, seeds) of the eligible cells whose median reached the target."""
  pts = []
  for (b, lr), v in values.items():
    m = float(np.median(v))
    if (b, lr) in eligible and math.isfinite(m) and m > 0:
      pts.append((b, lr, math.log(m), v.size))
  return pts


def fit(values: dict, eligible: set, sigma: float | None = None) -> tuple[Fit | None, str]:
  """The joint fit of `values` ({(B, lr): seeds' responses to target}) over the `eligible`
  cells; (None, why) when it is not identified. `sigma`: the seed-to-seed spread of log E
  (measured from the cells when None)."""
  pts = _medians(values, eligible)
  batches = sorted({p[0] for p in pts})
  n_par = len(batches) + 3
  if len(pts) < n_par + 2:
    return None, f"{len(pts)} cells reached the target, the fit needs {n_par + 2}"
  col = {b: i for i, b in enumerate(batches)}
  x = np.array([math.log(p[1]) for p in pts])
  lb = np.array([math.log(p[0]) for p in pts])
  y = np.array([p[2] for p in pts])
  design = np.zeros((len(pts), n_par))
  design[:, 0], design[:, 1], design[:, 2] = x * x, x, x * lb
  for i, p in enumerate(pts):
    design[i, 3 + col[p[0]]] = 1.0
  coef, *_ = np.linalg.lstsq(design, y, rcond=None)
  if not coef[0] > 0:
    return None, f"no positive curvature in log lr (a = {coef[0]:.3g})"
  resid = y - design @ coef
  resid_sd = float(math.sqrt(resid @ resid / (len(pts) - n_par)))
  if sigma is None:
    sigma = seed_spread(values)
  n = float(np.median([p[3] for p in pts]))
  expected = math.sqrt(power.MEDIAN_VARIANCE / n) * sigma if sigma and math.isfinite(sigma) else math.nan
  out = Fit(float(coef[0]), float(coef[1]), float(coef[2]),
            {b: float(coef[3 + col[b]]) for b in batches}, resid_sd, expected, len(pts))
  if math.isfinite(expected) and resid_sd > LACK_OF_FIT * expected:
    return None, (f"lack of fit: residual spread {resid_sd:.2f} of log E against "
                  f"{expected:.2f} from the seeds")
  return out, ""


def seed_spread(values: dict) -> float:
  """Pooled within-cell standard deviation of log responses to target over the cells wholly
  reached (power.pooled_spread); nan when there is none."""
  return power.pooled_spread(v for v in values.values() if np.all(np.isfinite(v)))[0]


def choose(f: Fit, grid: dict) -> dict:
  """{B: the rate of `grid[B]` (the rates scanned there) nearest the fit's vertex}."""
  return {b: min(rates, key=lambda lr: abs(math.log(lr) - f.vertex(b)))
          for b, rates in grid.items()}


def corrections(values: dict, eligible: set, chosen: dict, reps: int = 500, seed: int = 0
                ) -> tuple[dict, np.ndarray, int]:
  """({B: the point correction a (log lr_c - x*)^2}, draws: reps x len(batches) of it, the
  scan's seeds redrawn and the fit redone each time, in sorted-B order, failed draws). A draw
  whose fit is not identified is dropped and counted; the vertex is held within the rates
  scanned at each batch (the data say nothing beyond them)."""
  batches = sorted(chosen)
  span = {b: (min(lr for bb, lr in values if bb == b), max(lr for bb, lr in values if bb == b))
          for b in batches}
  f, why = fit(values, eligible)
  if f is None:
    raise ValueError(f"the joint fit is not identified: {why}")
  point = {b: f.penalty(b, chosen[b], *span[b]) for b in batches}
  sigma = seed_spread(values)
  rng = np.random.default_rng(seed)
  draws, failed = [], 0
  for _ in range(reps):
    redrawn = {k: v[rng.integers(0, v.size, v.size)] for k, v in values.items()}
    g, _ = fit(redrawn, eligible, sigma)
    if g is None or any(b not in g.intercepts for b in batches):
      failed += 1
      continue
    draws.append([g.penalty(b, chosen[b], *span[b]) for b in batches])
  return point, np.asarray(draws, float).reshape(-1, len(batches)), failed

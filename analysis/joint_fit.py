"""Invariance from one fit over every batch: where E(B) / E(B0) reaches 1 + tolerance.

A batch compared with the reference on its own seeds settles only when the seeds are many (a
true ratio of 1.0 needs ~85 seeds a side to settle invariant at the CPU study's spread). One
law fitted to every batch's seeds at once, E(B) = E_min (1 + B/B_crit) (analysis/fits.py),
uses them all: under it

    E(B) / E(B0) = (1 + B/B_crit) / (1 + B0/B_crit) <= 1 + tolerance
    <=>  B <= B_tol = tolerance x B_crit + (1 + tolerance) x B0,

and B_tol grows with B_crit, so one-sided 95% bounds of B_crit (the 5% and 95% quantiles of its
seed bootstrap, a rep without a fit widening both) bound B_tol. The series is

- invariant up to X: the largest batch tried at or below B_tol's lower bound (the reference
  itself when none is), every batch up to it with its own median ratio within 1 + tolerance;
- broken from Y: the smallest batch tried above B_tol's upper bound whose own seeds, and
  every larger batch's, are slower than the reference's (the one-sided 95% lower bound of its
  ratio above 1) with a median ratio beyond 1 + tolerance (none when B_crit's upper bound is
  unbounded: E may stay flat past every batch tried).

Each batch's own seeds only veto: the smooth law fitted to a hinge (E flat, then steep) calls
batches before the hinge broken, in 39% of simulated studies with a hinge at 4 B0 without the
veto.

Only where the law holds: when the fit's own diagnostics fail (E falls with B, residuals beyond
the seeds' spread, a batch's median never reached, too few seeds) there is no joint answer,
"not identified". B_crit beyond the batches tried is not a failure here: its lower bound still
bounds X. tests/unit/analysis/test_joint_fit.py simulates the procedure on studies of known
answer at the study's batches, seeds and spread and holds both false rates at or below 5%.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import bracket, fits, stats


def b_tol(b_crit: float, b0: float, tolerance: float) -> float:
  """The largest B with E(B)/E(B0) <= 1 + tolerance under E_min (1 + B/B_crit)."""
  return math.inf if math.isinf(b_crit) else tolerance * b_crit + (1 + tolerance) * b0


def true_ratio(b: float, b0: float, b_crit: float) -> float:
  return 1.0 if math.isinf(b_crit) else (1 + b / b_crit) / (1 + b0 / b_crit)


def invariance(points_by_batch: dict, b0: int, tolerance: float = 0.2, reps: int = 1000,
               seed: int = 0) -> dict:
  """The joint answer for one series: `points_by_batch` maps each batch to its seeds'
  responses to target (inf: never reached), B0 among them. Returns identified, reasons,
  b_crit (point, lo, hi: one-sided 95% each), b_tol (the same), invariant_up_to, broken_from
  (None: none settled broken), seeds (per batch)."""
  batches = sorted(points_by_batch)
  if b0 not in points_by_batch:
    raise ValueError(f"the reference B0 = {b0} is not among the batches {batches}")
  out = dict(batches=batches, b0=b0, tolerance=tolerance,
             seeds=[len(points_by_batch[b]) for b in batches])
  try:
    fit = fits.critical_batch(points_by_batch, reps=reps, level=0.9, seed=seed)
  except ValueError as e:  # a median of 0: a batch whose seeds start on target
    return dict(out, identified=False, reasons=[str(e)])
  law = fit.get("law_reasons")
  if law is None or law:
    return dict(out, identified=False, reasons=fit["reasons"] if law is None else law)
  draws = np.full(reps, np.nan)
  if "b_crit_draws" in fit:
    got = np.asarray(fit["b_crit_draws"], float)
    # a B_crit at the top of the fit's grid is "beyond": unbounded above
    got = np.where(got >= 0.999 * fit["grid_top"], np.inf, got)
    draws[:got.size] = got  # the reps without a fit stay nan: they widen both bounds
  # order statistics: interpolating against the first infinite draw would make a bound
  # infinite one rank early
  lo, hi = stats.percentile_bounds(draws, 0.9)
  point = fit["b_crit"] if fit["b_crit"] < 0.999 * fit["grid_top"] else math.inf
  lo, hi = max(lo, 0.0), (math.inf if hi >= 0.999 * fit["grid_top"] else hi)
  t_lo, t_hi = b_tol(lo, b0, tolerance), b_tol(hi, b0, tolerance)
  # The law's answer where each batch's own seeds do not point the other way: a batch whose
  # median ratio lies beyond 1 + tolerance ends X below it, and Y starts only at a batch
  # whose median ratio lies beyond it (E flat up to a hinge and then steep fits the smooth law
  # badly, and would otherwise be called broken before its hinge).
  ref = np.asarray(points_by_batch[b0], float)
  own = {b: float(np.median(points_by_batch[b])) / float(np.median(ref)) for b in batches}
  slower = {b: bracket.log_bounds(np.asarray(points_by_batch[b], float), ref)[0] > 1
            for b in batches}
  above = [b for b in batches if b >= b0]
  x = b0
  for b in above[1:]:
    if b > t_lo or own[b] > 1 + tolerance:
      break
    x = b
  y = min([b for b in above if b > t_hi and all(own[c] > 1 + tolerance and slower[c]
                                                 for c in above if c >= b)], default=None)
  return dict(out, identified=True, reasons=[], b_crit=(point, lo, hi),
              b_tol=(b_tol(point, b0, tolerance), t_lo, t_hi), invariant_up_to=x,
              broken_from=y)


def describe(r: dict, n_label: str = "") -> str:
  """One line for the report."""
  if not r["identified"]:
    return "not identified (" + "; ".join(r["reasons"]) + ")"
  point, lo, hi = r["b_tol"]
  fmt = (lambda v: "∞" if math.isinf(v) else f"{v:.3g}")
  text = (f"E(B)/E(B0) reaches 1 + {r['tolerance']:g} at B = {fmt(point)} (one-sided 95%: "
          f"above {fmt(lo)}, below {fmt(hi)}){n_label}: **invariant up to B = "
          f"{r['invariant_up_to']}")
  text += (f", broken from B = {r['broken_from']}**" if r["broken_from"] is not None
           else "**, broken nowhere settled")
  return text

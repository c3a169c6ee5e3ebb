"""When a run reaches a target: the first crossing of its monotone fit (DESIGN.md, "Responses
(and time) to target").

A run's held-out metric is evaluated at points spaced max(eval interval, B) responses apart.
Reading the crossing off a trailing mean over evaluations delays a run by a number of
*evaluations*, hence by more responses the larger its batch: it invents a batch-size effect.
Reading it off the raw evaluations has the opposite bias: every evaluation is one more chance
for noise to poke above the target early, and small batches evaluate more often.

Here the crossing is read off the least-squares non-decreasing fit of the evaluations
(isotonic regression, pool-adjacent-violators) and linearly interpolated between the two fitted
points around it. The fit needs no window and no spacing: noise that pokes above the target is
pooled with its neighbours, and the fit never crosses before the raw evaluations do. A run
that dips and recovers is fitted by a plateau through the dip; one that collapses for good after
touching the target may never cross (it did not stay there). The interpolation between fitted
points is exact when the curve is straight between them, so the one error left from the spacing
is the curvature over one bracket: `bracket` says how wide it was.
"""

from __future__ import annotations

import math

import numpy as np


def monotone(y) -> np.ndarray:
  """The non-decreasing sequence closest to `y` in least squares (pool adjacent violators)."""
  y = np.asarray(y, dtype=float).ravel()
  means, weights, sizes = [], [], []
  for v in y:
    means.append(float(v))
    weights.append(1.0)
    sizes.append(1)
    while len(means) > 1 and means[-2] > means[-1]:
      w = weights[-2] + weights[-1]
      m = (means[-2] * weights[-2] + means[-1] * weights[-1]) / w
      n = sizes[-2] + sizes[-1]
      del means[-1], weights[-1], sizes[-1]
      means[-1], weights[-1], sizes[-1] = m, w, n
  return np.repeat(means, sizes) if means else np.zeros(0)


def _checked(x, y):
  x = np.asarray(x, dtype=float).ravel()
  y = np.asarray(y, dtype=float).ravel()
  if x.size != y.size:
    raise ValueError(f"crossing: {x.size} x values but {y.size} y values")
  if not (np.isfinite(x).all() and np.isfinite(y).all()):
    raise ValueError("crossing: non-finite evaluations (drop them first)")
  if (np.diff(x) <= 0).any():
    raise ValueError("crossing: x must increase strictly (responses seen at each evaluation)")
  return x, y


def bracket(x, y, target: float) -> tuple[float, float] | None:
  """(x before, x at) the first fitted point >= target; None when the fit never reaches it and
  (x[0], x[0]) when the first evaluation already does."""
  x, y = _checked(x, y)
  if x.size == 0:
    return None
  fit = monotone(y)
  hit = np.flatnonzero(fit >= target)
  if hit.size == 0:
    return None
  i = int(hit[0])
  return (float(x[0]), float(x[0])) if i == 0 else (float(x[i - 1]), float(x[i]))


def first_crossing(x, y, target: float) -> float:
  """Responses (x) at which the monotone fit of the evaluations y first reaches `target`,
  linearly interpolated; +inf when it never does, x[0] when the first evaluation does."""
  x, y = _checked(x, y)
  if x.size == 0:
    return math.inf
  fit = monotone(y)
  hit = np.flatnonzero(fit >= target)
  if hit.size == 0:
    return math.inf
  i = int(hit[0])
  if i == 0:
    return float(x[0])
  x0, x1, f0, f1 = x[i - 1], x[i], fit[i - 1], fit[i]
  return float(x0 + (target - f0) / (f1 - f0) * (x1 - x0))


def run_crossing(rows: list[dict], metric: str, target: float, offset: float = 0.0) -> float:
  """first_crossing over a run's metrics.jsonl rows (the evaluations of `metric`, in order of
  responses_seen), minus `offset` responses (e.g. a critic warm-up the actor did not train in);
  +inf when never reached."""
  pts = {}
  for r in rows:
    v, x = r.get(metric), r.get("responses_seen")
    if isinstance(v, (int, float)) and isinstance(x, (int, float)) and math.isfinite(v):
      pts[float(x)] = float(v)  # a resumed run may log a step twice: the last wins
  if not pts:
    return math.inf
  xs = sorted(pts)
  return first_crossing(xs, [pts[k] for k in xs], target) - offset

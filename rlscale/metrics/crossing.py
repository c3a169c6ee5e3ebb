"""When a run reaches a target: the first crossing of its raw evaluations, interpolated.

A run's held-out metric is evaluated at points spaced max(eval interval, B) responses apart.
Two ways of reading the crossing invent a batch-size effect, because the spacing grows with B:
- smoothing across evaluations (a trailing mean) delays a run by a number of *evaluations*;
- letting *later* evaluations move an earlier crossing: a monotone (isotonic) fit pools a dip
  after the crossing back into it (+24% on one real curve: 0.40, 0.43, 0.36, 0.44 read 1,319
  responses instead of 1,067), and a late collapse erases the crossing altogether.
So the crossing is the first evaluation at or above the target, linearly interpolated with the
evaluation before it: nothing after it can move it. What it needs instead is a held-out set
large enough that early noise rarely pokes above the target: a standard error at most a
quarter of the band near the target (2,000 problems: 0.011; eval.adaptive evaluates in stages
and scores the whole set there). `bracket` says how wide the interpolated interval was.
"""

from __future__ import annotations

import math

import numpy as np


def monotone(y) -> np.ndarray:
  """The non-decreasing sequence closest to `y` in least squares (pool adjacent violators): a
  curve's shape for figures and fits, not its crossing (see the module's docstring)."""
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


def _first(x, y, target: float):
  x, y = _checked(x, y)
  hit = np.flatnonzero(y >= target)
  return x, y, (int(hit[0]) if hit.size else None)


def bracket(x, y, target: float) -> tuple[float, float] | None:
  """(x before, x at) the first evaluation >= target; None when none reaches it and
  (x[0], x[0]) when the first evaluation already does."""
  x, y, i = _first(x, y, target)
  if i is None:
    return None
  return (float(x[0]), float(x[0])) if i == 0 else (float(x[i - 1]), float(x[i]))


def first_crossing(x, y, target: float) -> float:
  """Responses (x) at which the evaluations y first reach `target`, linearly interpolated
  between that evaluation and the one before; +inf when none does, x[0] when the first does."""
  x, y, i = _first(x, y, target)
  if i is None:
    return math.inf
  if i == 0:
    return float(x[0])
  x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
  return float(x0 + (target - y0) / (y1 - y0) * (x1 - x0))


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


def drop_after(y, target: float, rows=None, z: float = 2.0) -> float | None:
  """How far a run fell below `target` after its first evaluation at or above it, beyond what
  the evaluations' own sampling noise explains: the largest target - (v + z x se) over the
  later evaluations, se = sqrt(v (1 - v) / rows) of an accuracy scored on `rows` problems
  (None: exact). Evaluation in stages scores only its first stage once a run has reached its
  target (125 problems: se 0.045), and the lowest of twenty such evaluations lies ~0.09 below
  the curve by chance alone; a collapse lies below it by far more. 0 when nothing falls below,
  None when the target was never reached."""
  y = np.asarray(y, dtype=float).ravel()
  hit = np.flatnonzero(y >= target)
  if not hit.size:
    return None
  after = y[hit[0]:]
  if rows is None:
    se = np.zeros_like(after)
  else:
    n = np.asarray(rows, dtype=float).ravel()[hit[0]:]
    se = np.sqrt(np.clip(after * (1 - after), 0, None) / np.where(n > 0, n, np.inf))
  return float(max(0.0, np.max(target - (after + z * se))))


def settled_final(y, rows=None) -> float | None:
  """The run's final level: the rows-weighted mean of its last evaluations, back until they
  score as many problems as its largest evaluation did (the last one alone when it scored the
  whole set); None without evaluations."""
  y = np.asarray(y, dtype=float).ravel()
  if not y.size:
    return None
  if rows is None:
    return float(y[-1])
  n = np.asarray(rows, dtype=float).ravel()
  full, total, acc = n.max(), 0.0, 0.0
  for v, k in zip(y[::-1], n[::-1]):
    total, acc = total + k, acc + v * k
    if total >= full:
      break
  return float(acc / total)

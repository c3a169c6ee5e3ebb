"""The gradient noise scale B_simple (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"), from gradients at two batch sizes.

For a mean gradient over B i.i.d. samples, E|G_B|^2 = |G|^2 + tr(Sigma) / B. With the squared
norm of the small-batch gradients (averaged over the small batches) and of the big-batch
gradient, the unbiased estimators are

    |G|^2_est    = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma)_est = (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

and B_simple = EMA(tr(Sigma)_est) / EMA(|G|^2_est): numerator and denominator are smoothed
separately (bias-corrected EMAs), never the per-step ratio, which is very noisy.
Here the small batches are the micro-batches of gradient accumulation (each one's mean
gradient, before they are summed) and the big batch is the mini-batch, so measuring costs one
squared norm per micro-batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def estimates(small_sq, big_sq, b_small: float, b_big: float):
  """(|G|^2_est, tr(Sigma)_est) from E|G_small|^2 and |G_big|^2 at batch sizes b_small < b_big."""
  if not 0 < b_small < b_big:
    raise ValueError(f"need 0 < b_small < b_big, got {b_small}, {b_big}")
  g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
  trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
  return g2, trace


@dataclasses.dataclass
class EMA:
  """Exponential moving average with bias correction (as Adam's moments)."""
  decay: float
  value: float = 0.0
  count: int = 0

  def update(self, x: float) -> float:
    self.value = self.decay * self.value + (1.0 - self.decay) * float(x)
    self.count += 1
    return self.get()

  def get(self) -> float:
    return self.value / (1.0 - self.decay ** self.count) if self.count else float("nan")


class NoiseScale:
  """Running B_simple for one model and one unit (responses or prompts).

  `update` takes a step's raw estimates and returns the metrics to log under `prefix`.
  `state`/`load` make it part of a checkpoint, so a resumed run continues the same averages.
  """

  def __init__(self, prefix: str, decay: float):
    self.prefix = prefix
    self.g2, self.trace = EMA(decay), EMA(decay)

  def update(self, g2_est: float, trace_est: float) -> dict[str, float]:
    """Fold in a step's raw estimates; the metrics of this step."""
    self.g2.update(g2_est)
    self.trace.update(trace_est)
    return {f"{self.prefix}/grad_sq_est": float(g2_est),
            f"{self.prefix}/trace_est": float(trace_est), **self.current()}

  def current(self) -> dict[str, float]:
    """The smoothed values and B_simple as they stand (empty before the first estimate).

    B_simple is inf while the smoothed |G|^2 is not positive: the gradient is still lost in
    its noise (or the estimates are too few to tell).
    """
    if not self.g2.count:
      return {}
    g2, trace = self.g2.get(), self.trace.get()
    return {f"{self.prefix}/grad_sq_ema": g2, f"{self.prefix}/trace_ema": trace,
            f"{self.prefix}/b_simple": trace / g2 if g2 > 0 else float("inf")}

  def state(self) -> dict[str, Any]:
    return {"g2": [self.g2.value, self.g2.count], "trace": [self.trace.value, self.trace.count]}

  def load(self, state: dict[str, Any]) -> None:
    self.g2.value, self.g2.count = state["g2"]
    self.trace.value, self.trace.count = state["trace"]

"""A noisy quadratic trained by Adam: a problem whose critical batch is known, to validate the
critical-batch probe whole (tests/unit/analysis/test_probe_synthetic.py).

Loss L(theta) = |theta|^2 / (2 d); a sample's gradient is theta plus noise of standard
deviation `sigma` per coordinate, so a batch of B samples has gradient noise sigma^2 / B per
coordinate and B_simple = tr(Sigma) / |G|^2 = d sigma^2 / |theta|^2 (McCandlish et al. 2018).
The optimizer is the probe's: Adam (b1, b2, eps as the config's), its moments either fresh at
the branch or the parent's. Progress is -L, a held-out metric without evaluation noise, as the
probe's reference likelihood is. Evaluations are made as the trainer makes them: after the
step whose responses reach the next multiple of the spacing, and at the branch point.

Everything is vectorized over seeds (the leading axis); numpy only, no JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Problem:
  d: int = 64
  sigma: float = 1.0  # per-sample gradient noise, per coordinate
  b1: float = 0.9
  b2: float = 0.99
  eps: float = 1e-8

  def b_simple(self, theta: np.ndarray) -> float:
    return float(self.d * self.sigma ** 2 / np.sum(theta ** 2))

  def metric(self, theta: np.ndarray) -> np.ndarray:
    return -np.sum(theta ** 2, axis=-1) / (2 * self.d)


@dataclasses.dataclass
class Adam:
  m: np.ndarray
  v: np.ndarray
  t: int

  @classmethod
  def fresh(cls, shape) -> "Adam":
    return cls(np.zeros(shape), np.zeros(shape), 0)

  def copy(self, seeds: int) -> "Adam":
    """This state for every one of `seeds` branches (a single state broadcast)."""
    tile = lambda a: np.broadcast_to(a, (seeds,) + a.shape[-1:]).copy()  # noqa: E731
    return Adam(tile(self.m), tile(self.v), self.t)


def train(problem: Problem, theta: np.ndarray, state: Adam, batch: int, lr: float, steps: int,
          rng: np.random.Generator, every: int = 0) -> tuple[np.ndarray, Adam, list]:
  """`steps` Adam steps of `batch` samples from `theta` (seeds x d). Returns the weights, the
  state and, with `every`, the evaluations [(responses, metric per seed)], the start first."""
  p = problem
  theta, m, v, t = theta.copy(), state.m.copy(), state.v.copy(), state.t
  evals = [(0, p.metric(theta))] if every else []
  for s in range(1, steps + 1):
    g = theta + p.sigma / np.sqrt(batch) * rng.standard_normal(theta.shape)
    t += 1
    m = p.b1 * m + (1 - p.b1) * g
    v = p.b2 * v + (1 - p.b2) * g * g
    theta = theta - lr * (m / (1 - p.b1 ** t)) / (np.sqrt(v / (1 - p.b2 ** t)) + p.eps)
    if every and (s * batch) // every > ((s - 1) * batch) // every:
      evals.append((s * batch, p.metric(theta)))
  return theta, Adam(m, v, t), evals


def curves(evals: list) -> list[list[tuple[float, float]]]:
  """Per seed, [(responses, metric)]: the shape analysis/probe.py reads."""
  seeds = len(evals[0][1])
  return [[(float(x), float(y[i])) for x, y in evals] for i in range(seeds)]


def parent(problem: Problem, batch: int, lr: float, steps: int, seed: int = 0,
           scale: float = 1.0) -> tuple[np.ndarray, Adam]:
  """The run the probe branches: `steps` Adam steps at `batch` from theta ~ N(0, scale^2)."""
  rng = np.random.default_rng(seed)
  theta = scale * rng.standard_normal((1, problem.d))
  theta, state, _ = train(problem, theta, Adam.fresh((1, problem.d)), batch, lr, steps, rng)
  return theta[0], state


def branches(problem: Problem, theta: np.ndarray, state: Adam, batch: int, lr: float,
             responses: int, every: int, seeds, optimizer: str = "fresh") -> list:
  """The curves of one batch and rate's branches from (theta, state), one per seed."""
  seeds = list(seeds)
  rng = np.random.default_rng([batch, int(round(lr * 1e9))] + seeds)
  start = np.broadcast_to(theta, (len(seeds), problem.d))
  init = Adam.fresh(start.shape) if optimizer == "fresh" else state.copy(len(seeds))
  _, _, evals = train(problem, start, init, batch, lr, responses // batch, rng, every)
  return curves(evals)

"""The gradient noise scale against a problem whose answer is known in closed form."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlscale import sharding
from rlscale.rl import noise_scale
from rlscale.rl.update import accumulate

# Least squares, x ~ N(0, I_n), y = x.w* + e, e ~ N(0, s2); per-sample gradient (x.d - e) x with
# d = w - w*. Then G = d and Sigma = |d|^2 I + d d^T + s2 I:
#   |G|^2 = |d|^2,   tr(Sigma) = (n + 1) |d|^2 + n s2.
N, S2 = 8, 1.0
D = np.full(N, 1 / math.sqrt(N))  # |d|^2 = 1
TRUE_G2, TRUE_TRACE = 1.0, (N + 1) * 1.0 + N * S2
B_BIG, B_SMALL, TRIALS = 256, 32, 400


def _grad_fn(theta, xs):
  x, y, w = xs
  def loss(theta):
    r = x @ theta - y
    return jnp.sum(w * 0.5 * r * r), {}
  return jax.value_and_grad(loss, has_aux=True)(theta)


def _estimate(mesh, rules):
  @jax.jit
  def trial(key):
    with sharding.activation_sharding(mesh, rules):
      kx, ke = jax.random.split(key)
      x = jax.random.normal(kx, (B_BIG, N))
      y = x @ jnp.zeros(N) + jnp.sqrt(S2) * jax.random.normal(ke, (B_BIG,))
      theta = jnp.asarray(D, jnp.float32)  # w* = 0, so d = theta
      w = jnp.full((B_BIG,), 1.0 / B_BIG)
      micro = jax.tree.map(lambda a: a.reshape((B_BIG // B_SMALL, B_SMALL) + a.shape[1:]),
                           (x, y, w))
      micro = jax.tree.map(lambda a: sharding.constrain(a, (None, "batch") + (None,) * (a.ndim - 2)),
                           micro)
      shares = jnp.sum(micro[2], axis=1)
      grads, _, _, small_sq = accumulate(_grad_fn, theta, micro, shares)
      return small_sq, jnp.sum(grads * grads)
  small, big = jax.vmap(trial)(jax.random.split(jax.random.key(0), TRIALS))
  g2, trace = noise_scale.estimates(np.asarray(small, np.float64), np.asarray(big, np.float64),
                                    B_SMALL, B_BIG)
  return g2.mean(), trace.mean()


@pytest.mark.parametrize("shape", [(1, 1, 1), (8, 1, 1), (2, 4, 1)])
def test_estimates_match_the_closed_form_on_any_mesh(shape, rules):
  devices = jax.devices()[:int(np.prod(shape))]
  g2, trace = _estimate(sharding.make_mesh(shape, devices), rules)
  assert abs(g2 - TRUE_G2) / TRUE_G2 < 0.1, g2
  assert abs(trace - TRUE_TRACE) / TRUE_TRACE < 0.1, trace
  assert abs(trace / g2 - TRUE_TRACE / TRUE_G2) / (TRUE_TRACE / TRUE_G2) < 0.1


def test_estimator_algebra_by_hand():
  # E|G_B|^2 = |G|^2 + tr/B with |G|^2 = 2, tr = 64: at B=4 -> 18, at B=16 -> 6.
  g2, trace = noise_scale.estimates(18.0, 6.0, 4, 16)
  assert g2 == pytest.approx(2.0) and trace == pytest.approx(64.0)
  with pytest.raises(ValueError):
    noise_scale.estimates(1.0, 1.0, 16, 16)


def test_ema_is_bias_corrected_and_ratio_of_emas():
  ema = noise_scale.EMA(0.9)
  assert ema.update(5.0) == pytest.approx(5.0)  # no pull towards the zero start
  assert ema.update(7.0) == pytest.approx((0.9 * 0.1 * 5 + 0.1 * 7) / (1 - 0.81))
  ns = noise_scale.NoiseScale("actor/noise_responses", 0.5)
  ns.update(1.0, 10.0)
  out = ns.update(3.0, 10.0)
  # Smoothed separately: tr_ema / g2_ema, not the mean of per-step ratios (10 and 3.33).
  assert out["actor/noise_responses/b_simple"] == pytest.approx(10.0 / ((0.25 + 1.5) / 0.75))
  again = noise_scale.NoiseScale("x", 0.5)
  again.load(ns.state())
  assert again.update(2.0, 4.0)["x/b_simple"] == ns.update(2.0, 4.0)["actor/noise_responses/b_simple"]

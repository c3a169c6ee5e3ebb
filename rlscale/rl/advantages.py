"""Advantages from rewards. Pure functions of arrays, registered by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlscale.rl.registry import Registry

ADVANTAGES = Registry("advantage estimator")


def _offsets(rewards_PxG):
  """Rewards relative to their group's first one. Every estimator here depends only on these
  differences, and they are exactly 0 for a group of equal rewards, so its advantages are
  exactly 0: the group mean of e.g. 0.7s is not 0.7 in float32, and GRPO would divide that
  rounding residue by a std of 0 + eps into an advantage of order 0.1."""
  return rewards_PxG - rewards_PxG[..., :1]


@ADVANTAGES.register("grpo")
def grpo(rewards_PxG, eps: float = 1e-6):
  """Group-relative: (r - group mean) / (group std + eps), std with Bessel's correction.

  As in DeepSeekMath's GRPO (and TRL, verl). A group whose rewards are all equal gets 0.
  """
  d = _offsets(rewards_PxG)
  centered = d - jnp.mean(d, axis=-1, keepdims=True)
  std = jnp.std(d, axis=-1, keepdims=True, ddof=1)
  return centered / (std + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards_PxG):
  """Dr. GRPO (Liu et al. 2025): the group mean is subtracted, the std is not divided out."""
  d = _offsets(rewards_PxG)
  return d - jnp.mean(d, axis=-1, keepdims=True)


@ADVANTAGES.register("rloo")
def rloo(rewards_PxG):
  """Leave-one-out baseline (Ahmadian et al. 2024): r_i - mean of the group's other rewards."""
  g = rewards_PxG.shape[-1]
  d = _offsets(rewards_PxG)
  return d - (jnp.sum(d, axis=-1, keepdims=True) - d) / (g - 1)


def token_rewards(score_B, mask_BxN, kl_BxN=None, kl_coef: float = 0.0):
  """Per-token rewards: the verifier's score on each response's last token, minus an optional
  per-token KL penalty kl_coef * (log pi - log pi_ref)."""
  m = mask_BxN.astype(jnp.float32)
  last = jnp.sum(m, axis=-1).astype(jnp.int32) - 1
  onehot = jax.nn.one_hot(jnp.maximum(last, 0), m.shape[-1]) * (last >= 0)[:, None]
  r = onehot * score_B[:, None]
  if kl_BxN is not None and not (isinstance(kl_coef, (int, float)) and kl_coef == 0):
    r = r - kl_coef * kl_BxN * m  # kl_coef may be an argument of the compiled function
  return r * m


def gae(rewards_BxN, values_BxN, mask_BxN, gamma: float = 1.0, lam: float = 1.0):
  """Generalized advantage estimation (Schulman et al. 2016) over right-padded responses.

  delta_t = r_t + gamma V_{t+1} - V_t, with V = 0 past a response's last token;
  A_t = delta_t + gamma lam A_{t+1}. Returns (advantages, returns = A + V), 0 on padding.
  """
  m = mask_BxN.astype(jnp.float32)
  v = values_BxN * m
  next_v = jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
  delta = (rewards_BxN + gamma * next_v - v) * m

  def step(carry, x):
    d, mt = x
    a = d + gamma * lam * carry * mt
    return a, a

  _, adv = jax.lax.scan(step, jnp.zeros(m.shape[0]), (delta.T[::-1], m.T[::-1]))
  adv = adv[::-1].T * m
  return adv, (adv + v) * m


def whiten(x_BxN, mask_BxN, eps: float = 1e-8):
  """(x - mean) / std over the valid tokens of the whole batch; 0 on padding."""
  m = mask_BxN.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  mean = jnp.sum(x_BxN * m) / n
  var = jnp.sum(jnp.square(x_BxN - mean) * m) / n
  return (x_BxN - mean) * jax.lax.rsqrt(var + eps) * m

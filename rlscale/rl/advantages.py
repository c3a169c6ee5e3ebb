"""Advantages from rewards. Pure functions of arrays, registered by name."""

from __future__ import annotations

import jax.numpy as jnp

from rlscale.rl.registry import Registry

ADVANTAGES = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo(rewards_PxG, eps: float = 1e-6):
  """Group-relative: (r - group mean) / (group std + eps), std with Bessel's correction.

  As in DeepSeekMath's GRPO (and TRL, verl). A group whose rewards are all equal gets 0.
  """
  centered = rewards_PxG - jnp.mean(rewards_PxG, axis=-1, keepdims=True)
  std = jnp.std(rewards_PxG, axis=-1, keepdims=True, ddof=1)
  return centered / (std + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards_PxG):
  """Dr. GRPO (Liu et al. 2025): the group mean is subtracted, the std is not divided out."""
  return rewards_PxG - jnp.mean(rewards_PxG, axis=-1, keepdims=True)


@ADVANTAGES.register("rloo")
def rloo(rewards_PxG):
  """Leave-one-out baseline (Ahmadian et al. 2024): r_i - mean of the group's other rewards."""
  g = rewards_PxG.shape[-1]
  total = jnp.sum(rewards_PxG, axis=-1, keepdims=True)
  return rewards_PxG - (total - rewards_PxG) / (g - 1)

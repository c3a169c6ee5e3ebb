"""GRPO's per-token loss: clipped surrogate, optional KL to a reference, optional entropy bonus."""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp

from rlscale.rl.losses import KL_ESTIMATORS, clipped_surrogate, entropy
from rlscale.rl.update import TokenInputs


def make_loss(rl: Mapping[str, Any]):
  """extras: `advantages` [B] and `old_logp` [B, N]; `ref_logp` [B, N] when kl_coef > 0."""
  eps_low, eps_high = float(rl["clip_eps_low"]), float(rl["clip_eps_high"])
  kl_coef, ent_coef = float(rl["kl_coef"]), float(rl["entropy_coef"])
  kl_fn = KL_ESTIMATORS.get(rl["kl_estimator"])

  def loss(inp: TokenInputs):
    adv = inp.extras["advantages"][:, None]
    old = inp.extras["old_logp"]
    pg, clipped = clipped_surrogate(inp.logp, old, adv, eps_low, eps_high)
    log_ratio = inp.logp - old
    metrics = {"pg_loss": pg, "clip_frac": clipped.astype(jnp.float32),
               "approx_kl": 0.5 * jnp.square(log_ratio),  # k2 of the behaviour policy
               "ratio": jnp.exp(log_ratio)}
    total = pg
    if kl_coef:
      kl = kl_fn(inp.logp, inp.extras["ref_logp"])
      total = total + kl_coef * kl
      metrics["kl"] = kl
    if ent_coef:
      total = total - ent_coef * entropy(inp.logits)
    return total, metrics

  return loss

"""The policy's per-token loss that GRPO and PPO share: the clipped surrogate (around the
behaviour policy, or a proximal one), an optional KL term to the frozen reference, an entropy
bonus, and the metrics every run logs."""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp

from rlscale.rl.losses import KL_ESTIMATORS, clipped_surrogate, decoupled_surrogate
from rlscale.rl.update import TokenInputs


def make_policy_loss(rl: Mapping[str, Any], kl_in_loss: bool = True):
  """loss(TokenInputs) -> (per-token loss, per-token metrics).

  extras: `advantages` ([B] per response or [B, N] per token), `old_logp` [B, N] (the
  behaviour policy, the importance-sampling denominator) and, when rl.kl_coef > 0 and
  `kl_in_loss`, `ref_logp` [B, N]. With a proximal policy (TokenInputs.prox_logp) the clip is
  taken around it (batch-size-invariant PPO).
  """
  eps_low, eps_high = float(rl["clip_eps_low"]), float(rl["clip_eps_high"])
  dual = float(rl["dual_clip"]) or None
  kl_coef = float(rl["kl_coef"]) if kl_in_loss else 0.0
  ent_coef = float(rl["entropy_coef"])
  kl_fn = KL_ESTIMATORS.get(rl["kl_estimator"])

  def loss(inp: TokenInputs):
    adv = inp.extras["advantages"]
    adv = adv[:, None] if adv.ndim == 1 else adv
    behav = inp.extras["old_logp"]
    if inp.prox_logp is None:
      pg, clipped = clipped_surrogate(inp.logp, behav, adv, eps_low, eps_high, dual)
    else:
      pg, clipped = decoupled_surrogate(inp.logp, behav, inp.prox_logp, adv, eps_low, eps_high,
                                        dual)
    log_ratio = inp.logp - behav
    ent = inp.entropy
    metrics = {"pg_loss": pg, "clip_frac": clipped.astype(jnp.float32),
               "approx_kl": 0.5 * jnp.square(log_ratio),  # k2 of the behaviour policy
               "ratio": jnp.exp(log_ratio), "entropy": ent}
    if inp.prox_logp is not None:
      metrics["prox_kl"] = 0.5 * jnp.square(inp.logp - inp.prox_logp)
    total = pg
    if kl_coef:
      kl = kl_fn(inp.logp, inp.extras["ref_logp"])
      total = total + kl_coef * kl
      metrics["kl"] = kl
    if ent_coef:
      total = total - ent_coef * ent
    return total, metrics

  return loss

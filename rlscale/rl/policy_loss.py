"""The policy's per-token loss that GRPO and PPO share: the clipped surrogate (around the
behaviour policy, or a proximal one), an optional KL term to the frozen reference, an entropy
bonus, and the metrics every run logs."""

from __future__ import annotations

from typing import Any, Mapping

import jax.numpy as jnp

from rlscale.rl.losses import KL_ESTIMATORS, clipped_surrogate, decoupled_surrogate
from rlscale.rl.update import TokenInputs


class PolicyLoss:
  """loss(TokenInputs, hyper=None) -> (per-token loss, per-token metrics).

  extras: `advantages` ([B] per response or [B, N] per token), `old_logp` [B, N] (the
  behaviour policy, the importance-sampling denominator) and, when rl.kl_coef > 0 and
  `kl_in_loss`, `ref_logp` [B, N]. With a proximal policy (TokenInputs.prox_logp) the clip is
  taken around it (batch-size-invariant PPO). With an off-policy correction
  (rl/off_policy.py) `old_logp` is the trainer's own at the step's start and `is_weight` [B, N]
  multiplies each token's clipped loss.

  `hyper` holds the numbers a sweep varies without changing shapes, as the compiled update's
  arguments (rl/update.make_update): the ratio's clip bounds 1 - clip_eps_low and
  1 + clip_eps_high (computed here in double precision, as the constants they replace were),
  and the KL and entropy coefficients. A coefficient of 0 removes its term from the program;
  `hyper=None` uses the config's values as constants.
  """

  def __init__(self, rl: Mapping[str, Any], kl_in_loss: bool = True):
    self.dual = float(rl["dual_clip"]) or None
    self.kl_fn = KL_ESTIMATORS.get(rl["kl_estimator"])
    kl_coef = float(rl["kl_coef"]) if kl_in_loss else 0.0
    ent_coef = float(rl["entropy_coef"])
    self.hyper = {"ratio_low": 1.0 - float(rl["clip_eps_low"]),
                  "ratio_high": 1.0 + float(rl["clip_eps_high"])}
    if kl_coef:
      self.hyper["kl_coef"] = kl_coef
    if ent_coef:
      self.hyper["entropy_coef"] = ent_coef

  def __call__(self, inp: TokenInputs, hyper: Mapping[str, Any] | None = None):
    h = self.hyper if hyper is None else hyper
    bounds = (h["ratio_low"], h["ratio_high"])
    adv = inp.extras["advantages"]
    adv = adv[:, None] if adv.ndim == 1 else adv
    behav = inp.extras["old_logp"]
    if inp.prox_logp is None:
      pg, clipped = clipped_surrogate(inp.logp, behav, adv, dual_clip=self.dual, bounds=bounds)
    else:
      pg, clipped = decoupled_surrogate(inp.logp, behav, inp.prox_logp, adv,
                                        dual_clip=self.dual, bounds=bounds)
    if "is_weight" in inp.extras:  # rl.off_policy_correction: constant per token
      pg = pg * inp.extras["is_weight"]
    log_ratio = inp.logp - behav
    ent = inp.entropy
    metrics = {"pg_loss": pg, "clip_frac": clipped.astype(jnp.float32),
               "approx_kl": 0.5 * jnp.square(log_ratio),  # k2 of the behaviour policy
               "ratio": jnp.exp(log_ratio), "entropy": ent}
    if inp.prox_logp is not None:
      metrics["prox_kl"] = 0.5 * jnp.square(inp.logp - inp.prox_logp)
    total = pg
    if "kl_coef" in self.hyper:
      kl = self.kl_fn(inp.logp, inp.extras["ref_logp"])
      total = total + h["kl_coef"] * kl
      metrics["kl"] = kl
    if "entropy_coef" in self.hyper:
      total = total - h["entropy_coef"] * ent
    return total, metrics


def make_policy_loss(rl: Mapping[str, Any], kl_in_loss: bool = True) -> PolicyLoss:
  return PolicyLoss(rl, kl_in_loss)

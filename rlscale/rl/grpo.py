"""GRPO: group-relative advantages and the per-token loss (clipped surrogate, optional KL to a
frozen reference, optional entropy bonus)."""

from __future__ import annotations

import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from rlscale.rl.advantages import ADVANTAGES
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
    ent = entropy(inp.logits)
    metrics = {"pg_loss": pg, "clip_frac": clipped.astype(jnp.float32),
               "approx_kl": 0.5 * jnp.square(log_ratio),  # k2 of the behaviour policy
               "ratio": jnp.exp(log_ratio), "entropy": ent}
    total = pg
    if kl_coef:
      kl = kl_fn(inp.logp, inp.extras["ref_logp"])
      total = total + kl_coef * kl
      metrics["kl"] = kl
    if ent_coef:
      total = total - ent_coef * ent
    return total, metrics

  return loss


class GRPO:
  """Group-relative advantages on the host, one actor update per step."""

  def __init__(self, cfg, env, graphdef, params, total_responses: int):
    from rlscale.rl.trained import Trained
    from rlscale.rl.update import policy_forward, response_fn
    r = cfg.rl
    self.cfg = cfg
    self.actor = Trained("actor", policy_forward(graphdef), make_loss(r), params, cfg.optim,
                         responses_per_step=r.num_prompts * r.group_size,
                         num_minibatches=r.num_minibatches, num_epochs=r.num_epochs,
                         microbatch=r.microbatch, group_size=r.group_size,
                         total_responses=total_responses, aggregation=r.loss_aggregation,
                         max_len=cfg.rollout.max_new_tokens, mesh=env.mesh, rules=env.rules,
                         noise_cfg=cfg.noise)
    self.models = {"actor": self.actor}
    self.ref_params = jax.tree.map(jnp.copy, params) if r.kl_coef else None
    self.logprobs = response_fn(policy_forward(graphdef), "logp", env.mesh, env.rules)

  def prepare(self, batch, out, rewards) -> tuple[dict[str, float], dict[str, float]]:
    """Fill the batch's extras; returns (phase seconds, host metrics)."""
    r = self.cfg.rl
    adv = ADVANTAGES.get(r.advantage)(jnp.asarray(rewards.reshape(-1, r.group_size)))
    batch.extras["advantages"] = jnp.asarray(adv).reshape(-1)
    t = time.time()
    batch.extras["old_logp"] = (self.logprobs(self.actor.params, batch)
                                if r.old_logprobs == "recompute" else out.logprobs)
    if self.ref_params is not None:
      batch.extras["ref_logp"] = self.logprobs(self.ref_params, batch)
    if r.old_logprobs == "recompute" or self.ref_params is not None:
      jax.block_until_ready(batch.extras)
      return {"logprobs": time.time() - t}, {}
    return {}, {}

  def update(self, batch, key, by_group: bool):
    return {}, {"actor": self.actor.step(batch, key, by_group)}

  def recomputed_forwards(self) -> int:
    return (self.cfg.rl.old_logprobs == "recompute") + (self.ref_params is not None)

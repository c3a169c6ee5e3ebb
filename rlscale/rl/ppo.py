"""PPO with a critic: token-level rewards, GAE, clipped surrogate and clipped value losses.

The actor and the critic are two `Trained` models on the same mesh, each with its own
optimizer, scaling rule, mini-batches and micro-batches, and each with the full set of
batch-size instruments (gradient norms, noise scale, effective hyperparameters).
Batch-size-invariant PPO (Hilton et al. 2021) is optional: with `rl.prox_com` > 0 the clip
anchor is a proximal policy kept as an EWMA of the actor's weights, whose centre of mass (in
optimizer steps) grows as the batch shrinks, while the behaviour policy (the sampler's
log-probs) stays the importance-sampling denominator.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from rlscale import sharding
from rlscale.rl.advantages import gae, token_rewards, whiten
from rlscale.rl.losses import (KL_ESTIMATORS, clipped_surrogate, clipped_value_loss,
                               decoupled_surrogate, entropy, explained_variance)
from rlscale.rl.update import TokenInputs, ValueInputs


def make_actor_loss(rl: Mapping[str, Any]):
  """extras: `advantages` [B, N], `old_logp` [B, N] (the behaviour policy)."""
  eps_low, eps_high = float(rl["clip_eps_low"]), float(rl["clip_eps_high"])
  dual = float(rl["dual_clip"]) or None
  ent_coef = float(rl["entropy_coef"])

  def loss(inp: TokenInputs):
    adv, behav = inp.extras["advantages"], inp.extras["old_logp"]
    if inp.prox_logp is None:
      pg, clipped = clipped_surrogate(inp.logp, behav, adv, eps_low, eps_high, dual)
    else:
      pg, clipped = decoupled_surrogate(inp.logp, behav, inp.prox_logp, adv, eps_low, eps_high, dual)
    ent = entropy(inp.logits)
    log_ratio = inp.logp - behav
    metrics = {"pg_loss": pg, "clip_frac": clipped.astype(jnp.float32), "entropy": ent,
               "approx_kl": 0.5 * jnp.square(log_ratio), "ratio": jnp.exp(log_ratio)}
    if inp.prox_logp is not None:
      metrics["prox_kl"] = 0.5 * jnp.square(inp.logp - inp.prox_logp)
    return pg - ent_coef * ent, metrics

  return loss


def make_critic_loss(critic: Mapping[str, Any]):
  """extras: `returns` [B, N] and `old_values` [B, N]."""
  clip = float(critic["value_clip"])

  def loss(inp: ValueInputs):
    vl, clipped = clipped_value_loss(inp.values, inp.extras["old_values"], inp.extras["returns"],
                                     clip)
    return vl, {"value_loss": vl, "value_clip_frac": clipped.astype(jnp.float32),
                "value_mean": inp.values,
                "value_abs_error": jnp.abs(inp.values - inp.extras["returns"])}

  return loss


class PPO:
  """Critic values -> token rewards -> GAE -> critic update and actor update, every step."""

  def __init__(self, cfg, env, graphdef, params, total_responses: int, critic_model):
    from rlscale.rl.trained import Trained
    from rlscale.rl.update import policy_forward, response_fn, value_forward
    r, c = cfg.rl, cfg.critic
    self.cfg = cfg
    per_step = r.num_prompts * r.group_size
    common = dict(responses_per_step=per_step, group_size=r.group_size,
                  total_responses=total_responses, aggregation=r.loss_aggregation,
                  max_len=cfg.rollout.max_new_tokens, mesh=env.mesh, rules=env.rules,
                  noise_cfg=cfg.noise)
    self.actor = Trained("actor", policy_forward(graphdef), make_actor_loss(r), params, cfg.optim,
                         num_minibatches=r.num_minibatches, num_epochs=r.num_epochs,
                         microbatch=r.microbatch, prox_com=r.prox_com, **common)
    critic_graphdef, critic_params = nnx.split(critic_model)
    self.critic = Trained("critic", value_forward(critic_graphdef), make_critic_loss(c),
                          critic_params, c.optim, num_minibatches=c.num_minibatches,
                          num_epochs=c.num_epochs, microbatch=c.microbatch, **common)
    self.models = {"actor": self.actor, "critic": self.critic}
    self.ref_params = jax.tree.map(jnp.copy, params) if r.kl_coef else None
    self.logprobs = response_fn(policy_forward(graphdef), "logp", env.mesh, env.rules)
    self.values = response_fn(value_forward(critic_graphdef), "values", env.mesh, env.rules)
    kl_fn = KL_ESTIMATORS.get(r.kl_estimator)

    @jax.jit
    def advantages_fn(scores, resp_mask, values, old_logp, ref_logp):
      kl = None if ref_logp is None else kl_fn(old_logp, ref_logp)
      rewards = token_rewards(scores, resp_mask, kl, r.kl_coef)
      adv, returns = gae(rewards, values, resp_mask, r.gamma, r.lam)
      if r.whiten_advantages:
        adv = whiten(adv, resp_mask)
      m = resp_mask.astype(jnp.float32)
      stats = {"critic/explained_variance": explained_variance(values, returns, resp_mask),
               "critic/return_mean": jnp.sum(returns * m) / jnp.maximum(jnp.sum(m), 1.0),
               "reward/kl_penalty": (jnp.sum(kl * m) / jnp.maximum(jnp.sum(m), 1.0)
                                     if kl is not None else jnp.zeros(()))}
      return adv, returns, stats

    self.advantages_fn = advantages_fn
    self.steps_done = 0

  def prepare(self, batch, out, rewards) -> tuple[dict[str, float], dict[str, Any]]:
    """Old values, (reference log-probs), advantages and returns.

    Returns (phase seconds, metrics); the metrics stay on the device until the step's
    metrics are fetched.
    """
    t = time.time()
    old_logp = out.logprobs
    if self.cfg.rl.old_logprobs == "recompute":
      old_logp = self.logprobs(self.actor.params, batch)
    values = self.values(self.critic.params, batch)
    ref = self.logprobs(self.ref_params, batch) if self.ref_params is not None else None
    scores = sharding.put_batch(rewards, self.actor.update.mesh, self.actor.update.rules)
    adv, returns, stats = self.advantages_fn(scores, batch.resp_mask, values, old_logp, ref)
    batch.extras.update(advantages=adv, old_logp=old_logp, old_values=values, returns=returns)
    jax.block_until_ready(adv)  # the phase's own time; nothing is copied to the host
    return {"logprobs": time.time() - t}, stats

  def update(self, batch, key, by_group: bool):
    """Critic first (timed on its own), then the actor once the critic's warm-up is over."""
    t = time.time()
    critic = self.critic.step(batch, jax.random.fold_in(key, 0), by_group)
    jax.block_until_ready(critic)
    phases = {"critic_update": time.time() - t}
    self.steps_done += 1
    metrics = {"critic": critic}
    if self.steps_done > self.cfg.critic.warmup_steps:
      metrics["actor"] = self.actor.step(batch, jax.random.fold_in(key, 1), by_group)
    return phases, metrics

  def recomputed_forwards(self) -> int:
    # The critic's value forward, plus reference and recomputed old log-probs.
    return 1 + (self.cfg.rl.old_logprobs == "recompute") + (self.ref_params is not None)

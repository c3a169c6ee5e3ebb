"""PPO with a critic: token-level rewards, GAE, clipped surrogate and clipped value losses.

The actor and the critic are two `Trained` models on the same mesh, each with its own
optimizer, scaling rule, mini-batches and micro-batches (from the batch plan), and each with
the full set of batch-size instruments (gradient norms, noise scale, effective
hyperparameters). The proximal-policy variant is rl/ppo_ewma.py.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlscale import models
from rlscale.checkpoints import hf
from rlscale.rl import algorithm, off_policy
from rlscale.rl.advantages import gae, token_rewards, whiten
from rlscale.rl.losses import KL_ESTIMATORS, clipped_value_loss, explained_variance
from rlscale.rl.policy_loss import make_policy_loss
from rlscale.rl.update import ValueInputs, policy_forward, response_fn, value_forward


class CriticLoss:
  """loss(ValueInputs, hyper=None): the clipped value loss; extras: `returns` [B, N] and
  `old_values` [B, N]. `hyper` (the compiled update's arguments, rl/update.make_update) holds
  the value clip when it is on (0 removes the clip from the program); None: the config's."""

  def __init__(self, critic: Mapping[str, Any]):
    clip = float(critic["value_clip"])
    self.hyper = {"value_clip": clip} if clip > 0 else {}

  def __call__(self, inp: ValueInputs, hyper: Mapping[str, Any] | None = None):
    clip = (self.hyper if hyper is None else hyper).get("value_clip", 0.0)
    vl, clipped = clipped_value_loss(inp.values, inp.extras["old_values"], inp.extras["returns"],
                                     clip)
    return vl, {"value_loss": vl, "value_clip_frac": clipped.astype(jnp.float32),
                "value_mean": inp.values,
                "value_abs_error": jnp.abs(inp.values - inp.extras["returns"])}


def make_critic_loss(critic: Mapping[str, Any]) -> CriticLoss:
  return CriticLoss(critic)


def make_advantages(rl: Mapping[str, Any]):
  """advantages(scores, resp_mask, values, old_logp, ref_logp, kl_coef) -> (advantages,
  returns, stats), to compile (jax.jit, or Context.jit); kl_coef (an argument, not a constant)
  weighs the KL penalty in the token rewards when there are reference log-probs."""
  kl_fn = KL_ESTIMATORS.get(rl["kl_estimator"])

  def advantages(scores, resp_mask, values, old_logp, ref_logp, kl_coef):
    kl = None if ref_logp is None else kl_fn(old_logp, ref_logp)
    rewards = token_rewards(scores, resp_mask, kl, kl_coef)
    adv, returns = gae(rewards, values, resp_mask, rl["gamma"], rl["lam"])
    if rl["whiten_advantages"]:
      adv = whiten(adv, resp_mask)
    m = resp_mask.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(m), 1.0)
    stats = {"critic/explained_variance": explained_variance(values, returns, resp_mask),
             "critic/return_mean": jnp.sum(returns * m) / n,
             "reward/kl_penalty": jnp.sum(kl * m) / n if kl is not None else jnp.zeros(())}
    return adv, returns, stats

  return advantages


@algorithm.ALGORITHMS.register("ppo")
class PPO:
  """Critic values -> token rewards -> GAE -> critic update and actor update, every step."""

  @staticmethod
  def check(cfg) -> list[str]:
    missing = [f"rl.{k}" for k in ("gamma", "lam", "whiten_advantages", "dual_clip", "prox_com")
               if k not in cfg.rl] + ([] if "critic" in cfg else ["critic"])
    if missing:
      return [f"kind={cfg.kind!r} needs {', '.join(missing)}, which this config lacks: start "
              f"from configs/ppo.py"]
    r = cfg.rl
    errors = algorithm.policy_loss_errors(r)
    if cfg.kind == "ppo" and isinstance(r.prox_com, (int, float)) and r.prox_com > 0:
      errors.append(f"rl.prox_com={r.prox_com} turns on the proximal policy of kind='ppo_ewma' "
                    f"(configs/ppo.py:ewma); kind='ppo' anchors the clip at the behaviour policy")
    return errors

  prox_com = 0.0  # the actor's proximal policy (ppo_ewma); 0: the behaviour policy is the anchor

  def __init__(self, ctx: algorithm.Context):
    cfg = ctx.cfg
    r, c, env = cfg.rl, cfg.critic, ctx.env
    self.rl, self.warmup_steps = r, c.warmup_steps
    forward = policy_forward(ctx.graphdef, chunk=cfg.train.logprob_chunk,
                             remat=cfg.train.remat)
    self.actor = algorithm.trained_model(
        ctx, "actor", forward, make_policy_loss(r, False), ctx.params, cfg.optim,
        prox_com=self.prox_com, per_run=lambda cf: (make_policy_loss(cf.rl, False), cf.optim))
    critics = [nnx.split(hf.load_model(c.hf_checkpoint or ctx.base, models.ValueModel, env.mesh,
                                       env.rules, key=jax.random.key(cf.seed + 1),
                                       dtype=cfg.model.dtype,
                                       param_dtype=cfg.model.param_dtype)[0])
               for cf in ctx.configs()]  # each run's head from its own seed
    critic_graphdef = critics[0][0]
    critic_forward = value_forward(critic_graphdef, remat=cfg.train.remat)
    self.critic = algorithm.trained_model(
        ctx, "critic", critic_forward, make_critic_loss(c), ctx.stack([p for _, p in critics]),
        c.optim, per_run=lambda cf: (make_critic_loss(cf.critic), cf.critic.optim))
    self.models = {"actor": self.actor, "critic": self.critic}
    self.ref_params = jax.tree.map(jnp.copy, ctx.params) if r.kl_coef else None
    group = algorithm.batch_group(ctx)
    pack = ctx.plan.main.pack
    self.logprobs = response_fn(forward, "logp", env.mesh, env.rules, group, pack, ctx.lanes)
    self.values = response_fn(value_forward(critic_graphdef), "values", env.mesh, env.rules, group,
                              pack, ctx.lanes)
    self.advantages = ctx.jit(make_advantages(r), (True,) * 6)
    self.kl_coef = ctx.stack([np.float32(cf.rl.kl_coef) for cf in ctx.configs()])
    self.fold_in = ctx.fold_in
    self.correction = off_policy.Correction(r, ctx.jit)

  def prepare(self, batch, sample_logp, scores):
    """Old values, (reference log-probs), advantages and returns; the stats stay on the device."""
    t = time.time()
    old_logp = sample_logp
    if self.rl.old_logprobs == "recompute" or self.correction.on:
      old_logp = self.logprobs(self.actor.params, batch)
    values = self.values(self.critic.params, batch)
    ref = self.logprobs(self.ref_params, batch) if self.ref_params is not None else None
    adv, returns, stats = self.advantages(scores, batch.resp_mask, values, old_logp, ref,
                                          self.kl_coef)
    batch.extras.update(advantages=adv, old_logp=old_logp, old_values=values, returns=returns)
    if self.correction.on:  # the trainer's log-probs anchor the clip; the sampler's weight
      stats = {**stats, **self.correction.apply(batch, old_logp, sample_logp)}
    jax.block_until_ready(adv)  # the phase's own time; nothing is copied to the host
    return {"logprobs": time.time() - t}, stats

  def update(self, batch, key, step, by_group):
    """Critic first (timed on its own), then the actor once the critic's warm-up is over."""
    t = time.time()
    critic = self.critic.step(batch, self.fold_in(key, 0), by_group)
    jax.block_until_ready(critic)
    metrics = {"critic": critic}
    phases = {"critic_update": time.time() - t}
    if step > self.warmup_steps:
      metrics["actor"] = self.actor.step(batch, self.fold_in(key, 1), by_group)
    return phases, metrics

  def extra_forwards(self) -> int:
    # The critic's value forward, plus reference and recomputed old log-probs.
    return (1 + (self.rl.old_logprobs == "recompute" or self.correction.on)
            + (self.ref_params is not None))

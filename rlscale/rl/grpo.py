"""GRPO: group-relative advantages (GRPO, Dr. GRPO or RLOO by `rl.advantage`) and one actor
update per step with the shared policy loss (clipped surrogate, optional KL to a frozen
reference, optional entropy bonus)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from rlscale.rl import algorithm, off_policy
from rlscale.rl.advantages import ADVANTAGES
from rlscale.rl.policy_loss import make_policy_loss
from rlscale.rl.update import policy_forward, response_fn


@algorithm.ALGORITHMS.register("grpo")
class GRPO:
  group_relative = True  # a group of equal rewards has zero advantage (dynamic sampling)

  @staticmethod
  def check(cfg) -> list[str]:
    r = cfg.rl
    if "advantage" not in r:
      return [f"kind={cfg.kind!r} needs rl.advantage ({', '.join(sorted(ADVANTAGES))}), which "
              f"this config lacks: start from configs/grpo.py"]
    errors = algorithm.registry_errors("rl.advantage", r.advantage, ADVANTAGES)
    errors += algorithm.policy_loss_errors(r)
    if isinstance(r.group_size, int) and r.group_size < 2 and r.advantage in ("grpo", "rloo"):
      errors.append(f"rl.group_size={r.group_size}: advantage {r.advantage!r} needs groups of 2+")
    return errors

  def __init__(self, ctx: algorithm.Context):
    r = ctx.cfg.rl
    self.rl = r
    forward = policy_forward(ctx.graphdef, chunk=ctx.cfg.train.logprob_chunk,
                             remat=ctx.cfg.train.remat)
    self.actor = algorithm.trained_model(ctx, "actor", forward, make_policy_loss(r), ctx.params,
                                         ctx.cfg.optim,
                                         per_run=lambda c: (make_policy_loss(c.rl), c.optim))
    self.models = {"actor": self.actor}
    self.ref_params = jax.tree.map(jnp.copy, ctx.params) if r.kl_coef else None
    self.logprobs = response_fn(forward, "logp", ctx.env.mesh, ctx.env.rules,
                                algorithm.batch_group(ctx), ctx.plan.main.pack, ctx.lanes)
    advantage, g = ADVANTAGES.get(r.advantage), r.group_size
    self.group = g
    self.advantages = ctx.jit(lambda scores: advantage(scores.reshape(-1, g)).reshape(-1),
                              (True,))
    self.correction = off_policy.Correction(r, ctx.jit)

  def prepare(self, batch, sample_logp, scores):
    batch.extras["advantages"] = self.advantages(scores)
    recompute = self.rl.old_logprobs == "recompute" or self.correction.on
    if not recompute and self.ref_params is None:
      batch.extras["old_logp"] = sample_logp
      return {}, {}
    t, host = time.time(), {}
    old_logp = self.logprobs(self.actor.params, batch) if recompute else sample_logp
    if self.correction.on:  # the trainer's log-probs anchor the clip; the sampler's weight
      adv, g = batch.extras["advantages"], self.group  # rows of the effective batch: every
      informative = jnp.any(adv.reshape(*adv.shape[:-1], -1, g) != 0, axis=-1)  # response of
      rows = jnp.repeat(informative, g, axis=-1)  # a group whose advantages are not all 0
      host = self.correction.apply(batch, old_logp, sample_logp, rows)
    else:
      batch.extras["old_logp"] = old_logp
    if self.ref_params is not None:
      batch.extras["ref_logp"] = self.logprobs(self.ref_params, batch)
    jax.block_until_ready(batch.extras)  # the phase's own time
    return {"logprobs": time.time() - t}, host

  def update(self, batch, key, step, by_group):
    return {}, {"actor": self.actor.step(batch, key, by_group)}

  def extra_forwards(self) -> int:
    return ((self.rl.old_logprobs == "recompute" or self.correction.on)
            + (self.ref_params is not None))

"""Corrections for responses sampled by an older policy (rollout.max_staleness, or a sampler
whose numerics differ from the trainer's): `rl.off_policy_correction`.

Three policies enter: pi_behav, the sampler's weights that drew the responses (their log-probs
recorded while sampling); pi_old, the trainer's weights at the start of the step (its
log-probs recomputed by one forward pass); pi, the weights being trained. Every correction
clips the ratio pi / pi_old (the clip anchor is the trainer's own policy, as AReaL's proximal
policy) and multiplies each token's clipped loss by a weight w built from
r = pi_old / pi_behav, held constant (it does not depend on the weights trained):

- "tis", truncated importance sampling (Yao et al. 2025; verl, OpenRLHF, Tunix, Marin):
  w = min(r, cap), token by token.
- "mis", sequence-masked IS (NeMo-RL's and OpenRLHF's seq-mask-tis, slime's MIS): a response
  whose geometric-mean ratio exp(mean over its tokens of log r) lies outside
  [1 / threshold, threshold] gets w = 0 on every token; the others w = min(r, cap).
- "decoupled", decoupled PPO (Fu et al. 2025, AReaL): w = r where r <= cap, and 0 where it
  exceeds the cap (AReaL masks such tokens rather than truncating them).

"none" trains with the sampler's log-probs as the clip anchor and no weight (the on-policy
loss applied as it is). The weights are computed once per step, before the update, over the
unpacked [B, N] response tokens: a packed layout carries them as it carries every per-token
input.
"""

from __future__ import annotations

import math

import jax.numpy as jnp

CORRECTIONS = ("none", "tis", "mis", "decoupled")


def weights(mode: str, old_logp, behav_logp, mask, cap: float, threshold: float, rows=None):
  """(w [B, N], metrics): the correction's per-token weight (0 off the response tokens) and
  what it did, as token means over the response tokens: off_policy/is_ratio (r's mean),
  is_ratio_max, changed_frac (the tokens whose weight is not r: truncated or masked),
  mismatch_kl (KL(pi_behav || pi_old), the k3 estimate r - 1 - log r on the behaviour's
  samples), masked_effective (how many of the responses `rows` [B] marks, the effective batch's
  (every response when None), have no token left with a weight) and, for "mis",
  masked_responses (the fraction of responses masked)."""
  if mode not in CORRECTIONS[1:]:
    raise ValueError(f"off-policy correction {mode!r}; known: {', '.join(CORRECTIONS[1:])}")
  m = mask.astype(jnp.float32)
  log_r = jnp.where(mask, old_logp - behav_logp, 0.0)
  r = jnp.exp(log_r)
  if mode == "tis":
    w = jnp.minimum(r, cap)
  elif mode == "decoupled":
    w = jnp.where(r <= cap, r, 0.0)
  else:  # mis
    tokens = jnp.sum(m, axis=-1)
    mean_log_r = jnp.sum(log_r, axis=-1) / jnp.maximum(tokens, 1.0)
    keep = jnp.abs(mean_log_r) <= math.log(threshold)
    w = jnp.where(keep[:, None], jnp.minimum(r, cap), 0.0)
  w = w * m
  n = jnp.maximum(jnp.sum(m), 1.0)
  mean = lambda x: jnp.sum(x * m) / n  # noqa: E731
  metrics = {"off_policy/is_ratio": mean(r),
             "off_policy/is_ratio_max": jnp.max(jnp.where(mask, r, 0.0)),
             "off_policy/changed_frac": mean((w != r).astype(jnp.float32)),
             "off_policy/mismatch_kl": mean(r - 1.0 - log_r)}
  live = jnp.sum(m, axis=-1) > 0
  counted = live if rows is None else live & rows
  metrics["off_policy/masked_effective"] = jnp.sum(
      jnp.where(counted & jnp.all(w == 0, axis=-1), 1, 0))
  if mode == "mis":
    metrics["off_policy/masked_responses"] = (
        jnp.sum(jnp.where(live & ~keep, 1.0, 0.0)) / jnp.maximum(jnp.sum(live), 1))
  return w, metrics


class Correction:
  """A step's correction: `apply(batch, old_logp, behav_logp)` puts the clip anchor and the
  weights in the batch's extras and returns the metrics (on the device)."""

  def __init__(self, rl, jit):
    """`jit(fn, lane_args)`: the algorithm's compile (algorithm.Context.jit)."""
    self.mode = rl.off_policy_correction
    if self.on:
      cap, threshold = float(rl.is_cap), float(rl.mis_threshold)
      self._weights = jit(lambda old, behav, mask, rows: weights(
          self.mode, old, behav, mask, cap, threshold, rows), (True, True, True, True))

  @property
  def on(self) -> bool:
    return self.mode != "none"

  def apply(self, batch, old_logp, behav_logp, rows=None) -> dict:
    """`rows` [B] bool: the responses the effective batch counts (every one when None)."""
    if rows is None:
      rows = jnp.any(batch.resp_mask, axis=-1)
    w, metrics = self._weights(old_logp, behav_logp, batch.resp_mask, rows)
    batch.extras.update(old_logp=old_logp, is_weight=w)
    return metrics

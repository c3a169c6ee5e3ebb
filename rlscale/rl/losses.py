"""Per-token policy losses and the loss aggregation modes. Pure functions of arrays.

Every loss here is per token; `token_weights` turns a mini-batch's response mask into weights
w such that the mini-batch loss is sum(w * loss). Weights are computed once for the whole
mini-batch, so splitting it into micro-batches (gradient accumulation) never changes the
gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlscale.rl.registry import Registry

AGGREGATIONS = Registry("loss aggregation")
KL_ESTIMATORS = Registry("KL estimator")


def clipped_surrogate(logp, old_logp, adv, eps_low: float = 0.2, eps_high: float = 0.2,
                      dual_clip: float | None = None, *, bounds=None):
  """PPO's clipped objective as a loss, per token, with separate low/high clip ranges (DAPO).

  Returns (loss, clipped) where `clipped` marks tokens whose gradient the clip removed.
  With `dual_clip` = c > 1 (Ye et al. 2020) the loss of a negative-advantage token is capped
  at c * |adv|. `bounds` = (1 - eps_low, 1 + eps_high), when given, replaces the eps values
  (rl/policy_loss.py passes them as the compiled update's arguments).
  """
  low, high = (1.0 - eps_low, 1.0 + eps_high) if bounds is None else bounds
  ratio = jnp.exp(logp - old_logp)
  unclipped = -adv * ratio
  clipped_obj = -adv * jnp.clip(ratio, low, high)
  loss = jnp.maximum(unclipped, clipped_obj)
  clipped = clipped_obj > unclipped
  if dual_clip is not None:
    cap = -adv * dual_clip
    dual = (adv < 0) & (loss > cap)
    loss = jnp.where(dual, cap, loss)
    clipped = clipped | dual
  return loss, clipped


def decoupled_surrogate(logp, behav_logp, prox_logp, adv, eps_low: float = 0.2,
                        eps_high: float = 0.2, dual_clip: float | None = None, *, bounds=None):
  """Batch-size-invariant PPO (Hilton, Cobbe, Schulman 2021): the ratio pi / pi_prox is clipped
  around a proximal policy, and pi_prox / pi_behav re-weights the behaviour policy's samples.
  With pi_prox = pi_behav this is `clipped_surrogate`."""
  weight = jnp.exp(jax.lax.stop_gradient(prox_logp - behav_logp))
  loss, clipped = clipped_surrogate(logp, jax.lax.stop_gradient(prox_logp), adv, eps_low, eps_high,
                                    dual_clip, bounds=bounds)
  return weight * loss, clipped


def clipped_value_loss(values, old_values, returns, clip: float):
  """0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2), per token, and where the
  clipped term won. clip <= 0 turns clipping off."""
  unclipped = jnp.square(values - returns)
  if isinstance(clip, (int, float)) and clip <= 0:  # a traced clip is on (rl/ppo.CriticLoss)
    return 0.5 * unclipped, jnp.zeros_like(unclipped, bool)
  clipped_sq = jnp.square(old_values + jnp.clip(values - old_values, -clip, clip) - returns)
  # Inside the clip range the two terms are one number computed two ways: their order there
  # is float rounding, not clipping.
  outside = jnp.abs(values - old_values) > clip
  return 0.5 * jnp.maximum(unclipped, clipped_sq), outside & (clipped_sq > unclipped)


def explained_variance(values, returns, mask):
  """1 - Var(R - V) / Var(R) over the valid tokens: 1 is a perfect critic, 0 a constant one."""
  m = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  def var(x):
    mean = jnp.sum(x * m) / n
    return jnp.sum(jnp.square(x - mean) * m) / n
  return 1.0 - var(returns - values) / jnp.maximum(var(returns), 1e-8)


@KL_ESTIMATORS.register("k1")
def kl_k1(logp, ref_logp):
  """log pi - log pi_ref (Schulman's k1: unbiased, can be negative)."""
  return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp, ref_logp):
  return 0.5 * jnp.square(logp - ref_logp)


@KL_ESTIMATORS.register("k3")
def kl_k3(logp, ref_logp):
  """exp(ref - logp) - (ref - logp) - 1 (Schulman's k3: unbiased, never negative)."""
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


def entropy(logits):
  """Entropy of softmax(logits) over the last axis, in nats."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  p = jnp.exp(logp)
  return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)  # 0 log 0 = 0 for masked logits


@AGGREGATIONS.register("token-mean")
def token_mean(mask_BxN, max_len: int):
  """Every token of the mini-batch counts the same (DAPO)."""
  m = mask_BxN.astype(jnp.float32)
  return m / jnp.maximum(jnp.sum(m), 1.0)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(mask_BxN, max_len: int):
  """Mean over each sequence's tokens, then over sequences (the original GRPO)."""
  m = mask_BxN.astype(jnp.float32)
  per_seq = jnp.maximum(jnp.sum(m, axis=-1, keepdims=True), 1.0)
  return m / per_seq / m.shape[0]


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(mask_BxN, max_len: int):
  """Sum over each sequence's tokens divided by a constant length, then mean (Dr. GRPO)."""
  m = mask_BxN.astype(jnp.float32)
  return m / float(max_len) / m.shape[0]


def token_weights(mask_BxN, mode: str, max_len: int):
  return AGGREGATIONS.get(mode)(mask_BxN, max_len)


def microbatch_shares(mask_MxbxN, weights_MxbxN, mode: str, max_len: int):
  """Each micro-batch's share of its mini-batch's loss, [M]: the sum of its tokens' mini-batch
  weights over the sum of the weights `mode` gives it on its own.

  Every aggregation weights a micro-batch's tokens in proportion to their weights on its own
  (n_i / N for token-mean, b / B for the per-sequence modes), so grads_i / share_i is the
  gradient the micro-batch would have alone: the small-batch gradient of the noise scale. The
  sum of the mini-batch weights alone is that ratio only where the weights sum to 1, which
  seq-mean-token-sum-norm's (sum of lengths / max_len / B) do not. A micro-batch without
  tokens has share 0.
  """
  alone = jax.vmap(lambda m: token_weights(m, mode, max_len))(mask_MxbxN)
  own = jnp.sum(alone.reshape(alone.shape[0], -1), axis=1)
  mine = jnp.sum(weights_MxbxN.reshape(weights_MxbxN.shape[0], -1), axis=1)
  return jnp.where(own > 0, mine / jnp.where(own > 0, own, 1.0), 0.0)

"""Off-policy corrections (rlscale/rl/off_policy.py): each against a hand-written reference, and
on a bandit whose responses come from a stale policy, how far each expected gradient lies from
the on-policy one."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlscale.rl import off_policy
from rlscale.rl.losses import clipped_surrogate
from rlscale.rl.policy_loss import make_policy_loss
from rlscale.rl.update import TokenInputs

CAP, THRESHOLD = 2.0, 1.5


def _reference(mode, old, behav, mask, cap=CAP, threshold=THRESHOLD):
  """The weights as the papers write them, row by row in plain Python."""
  w = np.zeros_like(old)
  for i in range(old.shape[0]):
    toks = [j for j in range(old.shape[1]) if mask[i, j]]
    geo = math.exp(sum(old[i, j] - behav[i, j] for j in toks) / max(len(toks), 1))
    for j in toks:
      r = math.exp(old[i, j] - behav[i, j])
      if mode == "tis":
        w[i, j] = min(r, cap)
      elif mode == "decoupled":
        w[i, j] = r if r <= cap else 0.0
      else:
        w[i, j] = min(r, cap) if 1 / threshold <= geo <= threshold else 0.0
  return w


@pytest.mark.parametrize("mode", ["tis", "mis", "decoupled"])
def test_weights_match_the_hand_written_reference(mode):
  rng = np.random.default_rng(0)
  old = rng.normal(-2.0, 0.5, (6, 5))
  behav = old + rng.normal(0.0, 0.6, (6, 5))  # some ratios past the cap, some responses masked
  mask = rng.random((6, 5)) < 0.8
  mask[0] = False  # a row without response tokens: no weight, no division by zero
  w, metrics = off_policy.weights(mode, jnp.asarray(old, jnp.float32),
                                  jnp.asarray(behav, jnp.float32), jnp.asarray(mask), CAP,
                                  THRESHOLD)
  want = _reference(mode, old, behav, mask)
  np.testing.assert_allclose(np.asarray(w), want, rtol=1e-5, atol=1e-7)
  r = np.exp(old - behav)[mask]
  assert float(metrics["off_policy/is_ratio"]) == pytest.approx(r.mean(), rel=1e-5)
  assert float(metrics["off_policy/is_ratio_max"]) == pytest.approx(r.max(), rel=1e-5)
  assert float(metrics["off_policy/mismatch_kl"]) == pytest.approx(
      np.mean(r - 1 - np.log(r)), rel=1e-4)
  changed = np.mean(~np.isclose(want[mask], r))
  assert float(metrics["off_policy/changed_frac"]) == pytest.approx(changed)
  assert 0 < changed < 1  # the draw exercises the bound
  if mode == "mis":
    assert 0 < float(metrics["off_policy/masked_responses"]) < 1
  # The effective batch loses the responses with tokens and no weight left, of those counted.
  live = mask.any(axis=1)
  dead = live & (want == 0).all(axis=1)
  assert int(metrics["off_policy/masked_effective"]) == dead.sum()
  rows = np.arange(6) % 2 == 0  # e.g. GRPO's informative responses
  _, some = off_policy.weights(mode, jnp.asarray(old, jnp.float32),
                               jnp.asarray(behav, jnp.float32), jnp.asarray(mask), CAP,
                               THRESHOLD, jnp.asarray(rows))
  assert int(some["off_policy/masked_effective"]) == (dead & rows).sum()
  if mode == "mis":
    assert dead.sum() > 0  # the draw masks some


def test_the_loss_multiplies_each_tokens_clipped_loss_by_its_weight():
  rl = ml_collections.ConfigDict({"dual_clip": 0.0, "kl_estimator": "k3", "kl_coef": 0.0,
                                  "entropy_coef": 0.0, "clip_eps_low": 0.2,
                                  "clip_eps_high": 0.28})
  rng = np.random.default_rng(1)
  logp, old = (jnp.asarray(rng.normal(-2, 0.3, (3, 4)), jnp.float32) for _ in range(2))
  adv, w = jnp.asarray(rng.normal(size=3), jnp.float32), jnp.asarray(rng.random((3, 4)),
                                                                      jnp.float32)
  inp = TokenInputs(logp, jnp.zeros_like(logp), jnp.ones((3, 4), bool),
                    {"advantages": adv, "old_logp": old, "is_weight": w})
  got, _ = make_policy_loss(rl)(inp)
  plain, _ = clipped_surrogate(logp, old, adv[:, None], bounds=(0.8, 1.28))
  np.testing.assert_allclose(np.asarray(got), np.asarray(plain * w), rtol=1e-6)


@pytest.mark.parametrize("field, value, message", [
    ("off_policy_correction", "vtrace", "rl.off_policy_correction='vtrace'; known: none, tis"),
    ("is_cap", 1.0, "rl.is_cap=1.0 must be a finite number > 1"),
    ("mis_threshold", 0.5, "rl.mis_threshold=0.5 must be a finite number > 1"),
    ("old_logprobs", "recompute", "with rl.old_logprobs='recompute'"),
])
def test_a_bad_correction_is_named(field, value, message):
  rl = ml_collections.ConfigDict({"off_policy_correction": "mis", "is_cap": 2.0,
                                  "mis_threshold": 2.0, "old_logprobs": "sampler"})
  rl[field] = value
  from rlscale.config import schema
  errors = schema.Rl._correction_errors(schema.with_defaults(schema.Rl, rl.to_dict()))
  assert any(message in e for e in errors), errors


# --- the bandit ---------------------------------------------------------------------------
# K arms, a softmax policy over them, rewards fixed per arm. The responses come from a stale
# policy pi_behav; the trainer's weights are pi_old (= pi at the step's start). The on-policy
# gradient is g* = sum_a pi(a) A(a) grad log pi(a), A = R - E_pi[R]. Each estimator's expected
# gradient is exact: the loss summed over the arms weighted by pi_behav (what sampling many
# responses converges to), differentiated at the trainer's weights.
K = 16


BANDIT_THRESHOLD = 2.0  # MIS's bound on a response's geometric-mean ratio, here one token's


def _bandit(seed=0, stale=0.3):
  rng = np.random.default_rng(seed)
  theta = rng.normal(0, 1.0, K)
  behav = theta + rng.normal(0, stale, K)  # the sampler's weights, several updates back
  reward = rng.random(K)
  return theta, behav, reward


def _expected_gradient(mode, theta, behav_theta, reward):
  logp_old = jax.nn.log_softmax(jnp.asarray(theta, jnp.float32))
  logp_b = jax.nn.log_softmax(jnp.asarray(behav_theta, jnp.float32))
  p_old = jnp.exp(logp_old)
  adv = jnp.asarray(reward, jnp.float32) - jnp.sum(p_old * reward)
  mask = jnp.ones((K, 1), bool)
  rl = ml_collections.ConfigDict({"dual_clip": 0.0, "kl_estimator": "k3", "kl_coef": 0.0,
                                  "entropy_coef": 0.0, "clip_eps_low": 0.2,
                                  "clip_eps_high": 0.28})
  loss_fn = make_policy_loss(rl)
  if mode == "none":  # the sampler's log-probs anchor the clip, no weight
    extras = {"advantages": adv, "old_logp": logp_b[:, None]}
  else:
    w, _ = off_policy.weights(mode, logp_old[:, None], logp_b[:, None], mask, CAP,
                              BANDIT_THRESHOLD)
    extras = {"advantages": adv, "old_logp": logp_old[:, None], "is_weight": w}

  def objective(t):
    logp = jax.nn.log_softmax(t)[:, None]
    per_token, _ = loss_fn(TokenInputs(logp, jnp.zeros_like(logp), mask, extras))
    return -jnp.sum(jnp.exp(logp_b) * per_token[:, 0])  # the expectation over pi_behav
  got = jax.grad(objective)(jnp.asarray(theta, jnp.float32))
  want = jax.grad(lambda t: jnp.sum(jax.nn.softmax(t) * adv))(jnp.asarray(theta, jnp.float32))
  return np.asarray(got), np.asarray(want)


def _error(got, want) -> float:
  return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_a_stale_sampler_pulls_the_uncorrected_gradient_away_and_each_correction_brings_it_back():
  """20 draws of a 16-arm bandit whose sampler's logits are off by N(0, 0.3) (ratios
  pi_old / pi_behav of about 0.6-1.6). Uncorrected, the clip around the sampler's log-probs
  drops every arm whose ratio lies outside [0.8, 1.28]: the expected gradient errs by 15% or
  more of the on-policy gradient's norm (median over draws; 21% measured, 76% at worst). TIS,
  MIS and decoupled PPO (cap 2, threshold 2) bring the median error under 5% and the 90th
  percentile under 10% (measured 0% / 0.1%, 0% / 7.3%, 0% / 5.3%: what remains is the arms
  past the cap or the threshold), and each is closer than the uncorrected update in at least
  17 of the 20 draws (measured 19, 18, 18; in the others no arm was clipped)."""
  errors = {m: [] for m in ("none", "tis", "mis", "decoupled")}
  for seed in range(20):
    theta, behav, reward = _bandit(seed)
    for mode in errors:
      errors[mode].append(_error(*_expected_gradient(mode, theta, behav, reward)))
  med = {m: float(np.median(v)) for m, v in errors.items()}
  assert med["none"] >= 0.15, med
  for mode in ("tis", "mis", "decoupled"):
    assert med[mode] <= 0.05 and np.percentile(errors[mode], 90) <= 0.1, (mode, med)
    closer = sum(c < u - 1e-6 for c, u in zip(errors[mode], errors["none"]))
    assert closer >= 17, (mode, closer, med)


def test_on_policy_responses_need_no_correction():
  """With the sampler's weights the trainer's, every correction's weight is 1 and every
  estimator is the on-policy gradient."""
  theta, _, reward = _bandit(3)
  for mode in ("none", "tis", "mis", "decoupled"):
    got, want = _expected_gradient(mode, theta, theta, reward)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)

"""Advantages, losses and aggregation against hand-computed numbers; micro-batch invariance."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tests.support import filled_optim as fill_optim
from rlscale import models
from rlscale.rl import optim
from rlscale.rl.advantages import ADVANTAGES
from rlscale.rl.losses import (KL_ESTIMATORS, clipped_surrogate, entropy, microbatch_shares,
                               token_weights)
from rlscale.rl.policy_loss import make_policy_loss
from rlscale.rl.update import SequenceBatch, TrainState, UpdateOptions, make_update, policy_forward

REWARDS = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])


def test_grpo_advantages_by_hand():
  # Group 1: mean 0.5, std with Bessel's correction sqrt(4 * 0.25 / 3) = 0.57735.
  a = ADVANTAGES.get("grpo")(REWARDS)
  s = 0.5 / math.sqrt(1 / 3)
  np.testing.assert_allclose(a[0], [s, -s, -s, s], rtol=1e-5)
  np.testing.assert_allclose(a[1], 0.0, atol=1e-6)  # all equal: no signal


def test_dr_grpo_and_rloo_by_hand():
  np.testing.assert_allclose(ADVANTAGES.get("dr_grpo")(REWARDS)[0], [0.5, -0.5, -0.5, 0.5])
  # Leave one out: 1 - mean(0, 0, 1) = 2/3; 0 - mean(1, 0, 1) = -2/3.
  np.testing.assert_allclose(ADVANTAGES.get("rloo")(REWARDS)[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3],
                             rtol=1e-6)
  np.testing.assert_allclose(ADVANTAGES.get("rloo")(REWARDS)[1], 0.0, atol=1e-6)
  with pytest.raises(ValueError, match="unknown advantage estimator 'ppo2'"):
    ADVANTAGES.get("ppo2")


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("jit", [False, True])
def test_equal_rewards_give_exactly_zero_advantage(name, jit):
  # Partial credit makes any reward value possible; the group mean of a non-representable value
  # is not that value in float32, and GRPO divides the residue by std + eps (~1e-6).
  fn = ADVANTAGES.get(name)
  fn = jax.jit(fn) if jit else fn
  values = [0.7, 0.1, 1 / 3, 1e6, -2.5, 0.0, 1.0, -1e-7, 3.14159, 123.456, -0.3, 2.0 ** -20]
  for g in (2, 3, 4, 5, 7, 8, 16, 64):
    rewards = jnp.asarray(np.repeat(np.asarray(values, np.float32)[:, None], g, 1))
    a = np.asarray(fn(rewards))
    assert np.all(a == 0.0), (g, values[int(np.argmax(np.abs(a).max(1)))], np.abs(a).max())
  # Beside an unequal group the equal one stays 0 and the unequal one is as by hand.
  mixed = fn(jnp.array([[0.7, 0.7, 0.7, 0.7], [0.7, 0.1, 0.1, 0.7]]))
  assert np.all(np.asarray(mixed[0]) == 0.0)
  np.testing.assert_allclose(mixed[1], np.asarray(ADVANTAGES.get(name)(REWARDS[:1]))[0] *
                             {"grpo": 1.0, "dr_grpo": 0.6, "rloo": 0.6}[name], rtol=1e-5)


def test_clipped_surrogate_by_hand():
  log = lambda x: jnp.log(jnp.asarray(x, jnp.float32))
  old = log([1.0, 1.0, 1.0, 1.0, 1.0])
  new = log([1.5, 0.5, 1.5, 1.1, 4.0])
  adv = jnp.array([1.0, -1.0, -1.0, 1.0, -1.0])
  loss, clipped = clipped_surrogate(new, old, adv, eps_low=0.2, eps_high=0.28)
  # ratio 1.5, A=+1: clipped at 1.28 -> -1.28.   ratio 0.5, A=-1: clipped at 0.8 -> 0.8.
  # ratio 1.5, A=-1: -A*r = 1.5 is larger than 1.28 -> kept, not clipped.  ratio 1.1: inside.
  np.testing.assert_allclose(loss, [-1.28, 0.8, 1.5, -1.1, 4.0], rtol=1e-5)
  np.testing.assert_array_equal(clipped, [True, True, False, False, False])
  loss, clipped = clipped_surrogate(new, old, adv, 0.2, 0.28, dual_clip=3.0)
  np.testing.assert_allclose(loss[-1], 3.0, rtol=1e-6)  # capped at c * |A|
  assert bool(clipped[-1])


def test_kl_estimators_by_hand():
  logp, ref = jnp.log(0.5), jnp.log(0.25)
  np.testing.assert_allclose(KL_ESTIMATORS.get("k1")(logp, ref), math.log(2), rtol=1e-6)
  np.testing.assert_allclose(KL_ESTIMATORS.get("k2")(logp, ref), 0.5 * math.log(2) ** 2, rtol=1e-6)
  # k3: exp(ref - logp) - (ref - logp) - 1 = 0.5 + log 2 - 1
  np.testing.assert_allclose(KL_ESTIMATORS.get("k3")(logp, ref), 0.5 + math.log(2) - 1, rtol=1e-6)
  assert float(KL_ESTIMATORS.get("k3")(ref, ref)) == 0.0


def test_entropy_by_hand():
  np.testing.assert_allclose(entropy(jnp.zeros((4,))), math.log(4), rtol=1e-6)
  np.testing.assert_allclose(entropy(jnp.array([0.0, -jnp.inf])), 0.0, atol=1e-6)


def test_aggregation_weights_by_hand():
  mask = jnp.array([[1, 1, 0], [1, 0, 0]], bool)
  np.testing.assert_allclose(token_weights(mask, "token-mean", 3), [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0]])
  np.testing.assert_allclose(token_weights(mask, "seq-mean-token-mean", 3),
                             [[0.25, 0.25, 0], [0.5, 0, 0]])
  np.testing.assert_allclose(token_weights(mask, "seq-mean-token-sum-norm", 3),
                             [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0]])


@pytest.mark.parametrize("mode, want", [
    ("token-mean", [0.5, 0.5, 0.0]),  # 3 of the 6 tokens each
    ("seq-mean-token-mean", [1 / 3, 1 / 3, 0.0]),  # 2 of 6 rows each (an empty row counts)
    ("seq-mean-token-sum-norm", [1 / 3, 1 / 3, 0.0]),  # weights sum to 1/6 each, not 1/3
])
def test_microbatch_shares_by_hand(mode, want):
  # Three micro-batches of two rows: lengths (2, 1), (3, 0), (0, 0); max_len 3.
  lengths = np.array([[2, 1], [3, 0], [0, 0]])
  mask = jnp.asarray(np.arange(3)[None, None] < lengths[..., None])
  w = token_weights(mask.reshape(6, 3), mode, 3).reshape(3, 2, 3)
  np.testing.assert_allclose(microbatch_shares(mask, w, mode, 3), want, rtol=1e-6)


RL = dict(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.05, kl_estimator="k3", entropy_coef=0.01,
          dual_clip=0.0)


def _batch(cfg, rows=8, prompt=5, resp=6, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, cfg.vocab_size, (rows, prompt + resp)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  mask[:, :2] = rng.random((rows, 2)) < 0.5  # some left padding
  resp_mask = np.arange(resp)[None] < rng.integers(1, resp + 1, (rows, 1))  # ragged lengths
  mask[:, prompt:] = resp_mask
  extras = {"advantages": rng.normal(size=rows).astype(np.float32),
            "old_logp": (-2 + 0.1 * rng.normal(size=(rows, resp))).astype(np.float32),
            "ref_logp": (-2 + 0.1 * rng.normal(size=(rows, resp))).astype(np.float32)}
  return SequenceBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(resp_mask),
                       {k: jnp.asarray(v) for k, v in extras.items()})


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_microbatch_size_never_changes_the_gradient(aggregation, mesh1, rules):
  cfg = models.ModelConfig(family="llama", vocab_size=32, d_model=32, num_layers=1, num_heads=2,
                           num_kv_heads=1, head_dim=16, mlp_dim=64)
  batch = _batch(cfg)
  opt = optax.sgd(1.0)  # parameters move by exactly minus the gradient
  results = []
  for micro in (8, 2):  # one micro-batch, then four
    model = models.CausalLM(cfg, rngs=nnx.Rngs(params=0))
    graphdef, params = nnx.split(model)
    update = make_update(policy_forward(graphdef), opt, make_policy_loss(RL),
                         UpdateOptions(num_minibatches=1, num_epochs=1, microbatch=micro,
                         aggregation=aggregation, max_len=6), mesh=mesh1, rules=rules)
    state = update.place(TrainState(params, opt.init(params), jnp.zeros((), jnp.int32)))
    state, metrics = update(state, batch, jax.random.key(0))
    results.append((jax.tree.leaves(state.params), jax.device_get(metrics)))
  (p1, m1), (p4, m4) = results
  for a, b in zip(p1, p4):  # the same gradient up to float32 summation order
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
  for k in m1:
    np.testing.assert_allclose(m1[k], m4[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_minibatches_take_one_optimizer_step_each(mesh1, rules):
  cfg = models.ModelConfig(family="qwen2", vocab_size=32, d_model=32, num_layers=1, num_heads=2,
                           num_kv_heads=1, head_dim=16, mlp_dim=64, qkv_bias=True)
  model = models.CausalLM(cfg, rngs=nnx.Rngs(params=0))
  graphdef, params = nnx.split(model)
  opt, _ = optim.make(fill_optim(dict(lr=1e-3)), batch=2, total_responses=80, responses_per_step=1)
  update = make_update(policy_forward(graphdef), opt, make_policy_loss(RL),
                       UpdateOptions(num_minibatches=4, num_epochs=2, microbatch=2,
                       aggregation="token-mean", max_len=6), mesh=mesh1, rules=rules)
  state = update.place(TrainState(params, opt.init(params), jnp.zeros((), jnp.int32)))
  state, metrics = update(state, _batch(cfg), jax.random.key(1))
  assert int(state.step) == 8  # 4 mini-batches x 2 epochs
  assert float(metrics["grad_norm_max"]) >= float(metrics["grad_norm"]) > 0
  assert 0.0 <= float(metrics["clip_frac"]) <= 1.0 and float(metrics["kl"]) >= 0.0
  state, _ = update(state, _batch(cfg, seed=2), jax.random.key(2))
  assert update.traces == 1  # the second step reuses the compiled update

"""PPO pieces against hand-computed numbers, and the PPO main job on the tiny config."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tests.support import REPO
from rlscale import models
from rlscale.config import files as config_files
from rlscale.run import train
from rlscale.rl.advantages import gae, token_rewards, whiten
from rlscale.rl.losses import (clipped_surrogate, clipped_value_loss, decoupled_surrogate,
                               explained_variance)
from rlscale.rl.update import SequenceBatch, TrainState, UpdateOptions, make_update, policy_forward

MASK = jnp.array([[1, 1, 1], [1, 1, 0]], bool)  # the second response is one token shorter


def test_token_rewards_put_the_score_on_the_last_token():
  r = token_rewards(jnp.array([1.0, 0.5]), MASK)
  np.testing.assert_allclose(r, [[0, 0, 1.0], [0, 0.5, 0]])
  kl = jnp.array([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
  r = token_rewards(jnp.array([1.0, 0.5]), MASK, kl, kl_coef=0.1)
  np.testing.assert_allclose(r, [[-0.01, -0.02, 0.97], [-0.04, 0.45, 0.0]], atol=1e-6)


def test_gae_by_hand_with_padding():
  rewards = jnp.array([[0, 0, 1.0], [0, 0.5, 0]])
  values = jnp.array([[0.5, 0.6, 0.7], [0.2, 0.3, 9.0]])  # 9.0 sits on padding: ignored
  adv, ret = gae(rewards, values, MASK, gamma=0.9, lam=0.5)
  # Row 0: d2 = 1 - .7 = .3; d1 = .9*.7 - .6 = .03; d0 = .9*.6 - .5 = .04
  #        A2 = .3, A1 = .03 + .45*.3 = .165, A0 = .04 + .45*.165 = .11425
  # Row 1: d1 = .5 - .3 = .2 (no value after the last token); d0 = .9*.3 - .2 = .07
  #        A1 = .2, A0 = .07 + .45*.2 = .16
  np.testing.assert_allclose(adv, [[0.11425, 0.165, 0.3], [0.16, 0.2, 0.0]], rtol=1e-5)
  np.testing.assert_allclose(ret, adv + values * MASK, rtol=1e-6)
  adv, ret = gae(rewards, values, MASK, gamma=1.0, lam=1.0)  # Monte Carlo: return - V
  np.testing.assert_allclose(ret, [[1, 1, 1], [0.5, 0.5, 0]], rtol=1e-6)


def test_whiten_uses_valid_tokens_only():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
  w = whiten(x, MASK)
  valid = np.array([1, 2, 3, 4, 5.0])
  np.testing.assert_allclose(w[MASK], (valid - valid.mean()) / valid.std(), rtol=1e-5)
  assert float(w[1, 2]) == 0.0


def test_clipped_value_loss_and_explained_variance_by_hand():
  v, old, ret = jnp.array([1.0, 0.0, 0.5]), jnp.array([0.5, 0.5, 0.5]), jnp.array([2.0, 1.0, 0.5])
  loss, clipped = clipped_value_loss(v, old, ret, clip=0.2)
  # V=1: unclipped (1-2)^2 = 1, clipped V .7 -> 1.69: max 1.69. V=0: 1 vs (.3-1)^2=.49: 1.
  np.testing.assert_allclose(loss, [0.5 * 1.69, 0.5, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(clipped, [True, False, False])
  # Inside the clip range old + (V - old) - R and V - R round differently (in float32 the first
  # squares above the second here; 2% of random such triples): a rounding order, not a clip.
  v, old, ret = (jnp.array([x], jnp.float32) for x in (0.0094012301415205, 0.08071726560592651,
                                                       -0.5900893807411194))
  assert float(jnp.square(old + (v - old) - ret)[0]) > float(jnp.square(v - ret)[0])
  assert not bool(clipped_value_loss(v, old, ret, clip=0.2)[1][0])
  ev = explained_variance(jnp.array([[1.0, 2.0, 3.0]]), jnp.array([[1.0, 2.0, 4.0]]),
                          jnp.ones((1, 3), bool))
  # Var(R - V) = Var(0, 0, 1) = 2/9; Var(R) = Var(1, 2, 4) = 14/9
  assert float(ev) == pytest.approx(1 - 2 / 14)


def test_decoupled_surrogate_by_hand():
  logp, behav, prox = jnp.log(jnp.array([0.6])), jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.4]))
  adv = jnp.array([1.0])
  loss, clipped = decoupled_surrogate(logp, behav, prox, adv, 0.2, 0.2)
  # ratio to the proximal policy .6/.4 = 1.5 -> clipped at 1.2; weight prox/behav = .8
  np.testing.assert_allclose(loss, [-0.8 * 1.2], rtol=1e-6)
  assert bool(clipped[0])
  same, _ = decoupled_surrogate(logp, behav, behav, adv, 0.2, 0.2)
  np.testing.assert_allclose(same, clipped_surrogate(logp, behav, adv, 0.2, 0.2)[0])


def _tiny():
  cfg = models.ModelConfig(family="llama", vocab_size=32, d_model=16, num_layers=1, num_heads=2,
                           num_kv_heads=1, head_dim=8, mlp_dim=32)
  return nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)))


def test_proximal_policy_is_an_ewma_of_the_weights(mesh1, rules):
  from rlscale.rl.policy_loss import make_policy_loss
  graphdef, params = _tiny()
  loss = make_policy_loss(dict(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=0.0,
                                entropy_coef=0.0, kl_coef=0.0, kl_estimator="k1"), False)
  update = make_update(policy_forward(graphdef), optax.sgd(0.5), loss,
                       UpdateOptions(num_minibatches=1, num_epochs=1, microbatch=2,
                       aggregation="token-mean", max_len=3, prox_decay=0.75), mesh=mesh1,
                       rules=rules)
  rng = np.random.default_rng(0)
  prox = jax.tree.map(lambda x: x + 0.01, params)  # a proximal policy away from the actor
  state = update.place(TrainState(params, optax.sgd(0.5).init(params), jnp.zeros((), jnp.int32),
                                  prox))
  tokens = jnp.asarray(rng.integers(3, 32, (4, 6)), jnp.int32)
  batch = SequenceBatch(tokens, jnp.ones((4, 6), bool), jnp.ones((4, 3), bool),
                        {"advantages": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                         "old_logp": jnp.full((4, 3), -3.0)})
  before = [np.asarray(x) for x in jax.tree.leaves(state.prox)]
  state, metrics = update(state, batch, jax.random.key(0))
  for b, p, q in zip(before, jax.tree.leaves(state.params), jax.tree.leaves(state.prox)):
    np.testing.assert_allclose(np.asarray(q), 0.75 * b + 0.25 * np.asarray(p), rtol=1e-5,
                               atol=1e-7)
  assert float(metrics["prox_kl"]) > 0  # the ratio was taken to the proximal policy


def test_proximal_centre_of_mass_grows_as_the_batch_shrinks(mesh1, rules):
  from rlscale.config.sections import noise_scale, optim
  from rlscale.rl.policy_loss import make_policy_loss
  from rlscale.plan.batch import ModelBatch
  from rlscale.rl.trained import Trained
  graphdef, params = _tiny()
  loss = make_policy_loss(dict(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=0.0,
                                entropy_coef=0.0, kl_coef=0.0, kl_estimator="k1"), False)
  cfg = optim(1e-3)
  cfg.reference_batch = 256
  for batch, com in ((256, 4.0), (64, 16.0), (1024, 1.0)):
    mb = ModelBatch("actor", minibatch=batch, num_minibatches=1, num_epochs=1,
                    microbatch=batch // 2, microbatch_auto=False)
    t = Trained("actor", policy_forward(graphdef), loss, params, cfg, batch=mb, group_size=1,
                total_responses=10 * batch, aggregation="token-mean", max_len=3, mesh=mesh1,
                rules=rules, noise_cfg=noise_scale(), prox_com=4.0)
    assert 1 / (1 - t.prox_decay) - 1 == pytest.approx(com)  # k x the steps at 1/k the batch


@pytest.mark.slow
def test_ppo_tiny_end_to_end(tiny_sft_base, tmp_path):
  cfg = config_files.load(os.path.join(REPO, "configs", "ppo.py:tiny"))
  with cfg.unlocked():
    cfg.init.cache_dir = tiny_sft_base
    cfg.init.sft_config = os.path.join(REPO, "configs", "sft.py:tiny")
    cfg.kind, cfg.rl.prox_com = "ppo_ewma", 2.0
  summary = train.main(cfg, str(tmp_path / "run"))
  assert summary["compilations"] == {"actor": 1, "critic": 1, "sampler": 1}
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
  for r in rows[1:]:
    for k in ("critic/value_loss", "critic/value_clip_frac", "critic/explained_variance",
              "critic/grad_norm", "critic/lr", "time/critic_update", "time/logprobs"):
      assert k in r and np.isfinite(r[k]), (r["step"], k)
    assert any(k.startswith("critic/noise_") and k.endswith("/b_simple") for k in r)
  assert "actor/pg_loss" not in rows[1]  # step 1 is the critic's warm-up
  for r in rows[2:]:
    for k in ("actor/pg_loss", "actor/clip_frac", "actor/approx_kl", "actor/grad_norm",
              "actor/lr", "actor/prox_kl", "actor/prox_decay", "time/actor_update"):
      assert k in r and np.isfinite(r[k]), (r["step"], k)
  assert "final/critic/explained_variance" in summary and "mean/time/critic_update" in summary

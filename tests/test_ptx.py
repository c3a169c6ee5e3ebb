"""PPO-ptx: the demonstrations' NLL gradient is added to the policy's, scaled by ptx_coef."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlscale import models
from rlscale.rl import ptx
from rlscale.rl.policy_loss import make_policy_loss
from rlscale.rl.update import SequenceBatch, TrainState, make_update, policy_forward

RL = dict(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.0, kl_estimator="k3", entropy_coef=0.0)
CFG = models.ModelConfig(family="llama", vocab_size=32, d_model=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=16, mlp_dim=64)


def _rows(rows, seed, prompt=5, resp=6):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, CFG.vocab_size, (rows, prompt + resp)).astype(np.int32)
  resp_mask = np.arange(resp)[None] < rng.integers(1, resp + 1, (rows, 1))
  mask = np.ones_like(tokens, bool)
  mask[:, prompt:] = resp_mask
  extras = {"advantages": rng.normal(size=rows).astype(np.float32),
            "old_logp": (-2 + 0.1 * rng.normal(size=(rows, resp))).astype(np.float32)}
  return SequenceBatch(jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(resp_mask),
                       {k: jnp.asarray(v) for k, v in extras.items()})


def _step(mesh, rules, loss, batch, coef=None, demos=None, minibatches=1):
  """Parameters after one SGD(1) update (they move by minus the gradient), and its metrics."""
  graphdef, params = nnx.split(models.CausalLM(CFG, rngs=nnx.Rngs(params=0)))
  opt = optax.sgd(1.0)
  update = make_update(policy_forward(graphdef), opt, loss, num_minibatches=minibatches,
                       num_epochs=1, microbatch=batch.tokens.shape[0] // minibatches,
                       aggregation="token-mean",
                       max_len=6, mesh=mesh, rules=rules, shuffle=False,
                       ptx=None if coef is None else (coef, ptx.nll))
  state = update.place(TrainState(params, opt.init(params), jnp.zeros((), jnp.int32)))
  before = jax.device_get(params)  # the update donates the state
  state, metrics = update(state, batch, jax.random.key(0), False, demos)
  return before, jax.device_get(state.params), jax.device_get(metrics)


def test_the_update_adds_coef_times_the_demonstrations_nll_gradient(mesh1, rules):
  batch, demos = _rows(8, 0), _rows(4, 1)
  p0, rl_only, m_rl = _step(mesh1, rules, make_policy_loss(RL), batch)
  _, nll_only, m_nll = _step(mesh1, rules, ptx.nll, demos)  # token-mean NLL of the demos alone
  _, mixed, m = _step(mesh1, rules, make_policy_loss(RL), batch, coef=0.3, demos=demos)
  expected = jax.tree.map(lambda a, b, c: b + 0.3 * (c - a), p0, rl_only, nll_only)
  for got, want in zip(jax.tree.leaves(mixed), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
  # Logged apart: the NLL, the norm of its gradient, and the RL gradient's own norm.
  np.testing.assert_allclose(m["ptx_nll"], m_nll["loss"], rtol=1e-6)
  np.testing.assert_allclose(m["ptx_grad_norm"], m_nll["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(m["grad_norm_rl"], m_rl["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(m["loss"], m_rl["loss"], rtol=1e-6)  # the policy loss alone
  assert m["grad_norm"] != pytest.approx(m_rl["grad_norm"])  # the clipped norm is of the sum


def test_each_optimizer_step_takes_its_own_block_of_demonstrations(mesh1, rules):
  # Two mini-batches: step 1 trains on demo rows 0-1, step 2 on rows 2-3. Swapping the blocks
  # changes the result; a coef of 0 gives the RL update exactly.
  batch, demos = _rows(8, 0), _rows(4, 1)
  swap = jax.tree.map(lambda x: jnp.concatenate([x[2:], x[:2]]), demos)
  _, a, _ = _step(mesh1, rules, make_policy_loss(RL), batch, 0.5, demos, minibatches=2)
  _, b, _ = _step(mesh1, rules, make_policy_loss(RL), batch, 0.5, swap, minibatches=2)
  assert any(not np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  _, zero, _ = _step(mesh1, rules, make_policy_loss(RL), batch, 0.0, demos, minibatches=2)
  _, rl, _ = _step(mesh1, rules, make_policy_loss(RL), batch, minibatches=2)
  for x, y in zip(jax.tree.leaves(zero), jax.tree.leaves(rl)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("coef,rows,unit,match", [
    (-0.1, 8, 1, "rl.ptx_coef=-0.1 must be a number >= 0"),
    (0.5, 6, 4, "rl.ptx_rows=6 must be a positive multiple of 4"),
    (0.5, 0, 1, "rl.ptx_rows=0"),
])
def test_bad_ptx_fields_are_named(coef, rows, unit, match):
  errors = ptx.check({"ptx_coef": coef, "ptx_rows": rows}, unit)
  assert len(errors) == 1 and match in errors[0]
  assert ptx.check({"ptx_coef": 0.0, "ptx_rows": 6}, 4) == []  # off: rows are not used

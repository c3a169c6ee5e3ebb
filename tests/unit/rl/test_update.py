"""The update's handling of rows without loss (dynamic sampling) and of a per-step lr scale."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlscale.rl.update import SequenceBatch, TrainState, UpdateOptions, make_update

D, ROWS, N = 4, 8, 3


def _update(opt, mesh, rules, **kw):
  forward = lambda theta, mb, prox: jnp.einsum("bnd,d->bn", mb.extras["x"], theta)
  options = UpdateOptions(microbatch=2, max_len=N, num_minibatches=2, shuffle=False, **kw)
  return make_update(forward, opt, lambda v: (v, {}), options, mesh=mesh, rules=rules)


def _batch(live_rows):
  x = np.random.default_rng(0).normal(size=(ROWS, N, D)).astype(np.float32)
  mask = np.zeros((ROWS, N), bool)
  mask[:live_rows] = True
  m = jnp.asarray(mask)
  return SequenceBatch(jnp.zeros((ROWS, N), jnp.int32), m, m, {"x": jnp.asarray(x)})


def _state(update, opt):
  theta = jnp.ones((D,), jnp.float32)
  return update.place(TrainState(theta, opt.init(theta), jnp.zeros((), jnp.int32)))


def test_a_minibatch_without_loss_takes_no_optimizer_step(mesh1, rules):
  """Rows 4-7 (the second mini-batch) carry no loss: with momentum, a step on their zero
  gradient would still move the parameters; counted rows skip it."""
  opt = optax.sgd(0.1, momentum=0.9)
  batch = _batch(live_rows=4)
  skip = _update(opt, mesh1, rules, count_rows=True)
  new, _ = skip(_state(skip, opt), batch, jax.random.key(0))
  plain = _update(opt, mesh1, rules)
  moved, _ = plain(_state(plain, opt), batch, jax.random.key(0))
  assert int(new.step) == 1 and int(moved.step) == 2
  assert not np.allclose(np.asarray(new.params), np.asarray(moved.params))
  # One SGD step on the first mini-batch: the token mean of x over its 4 rows x 3 tokens.
  grad = np.asarray(batch.extras["x"])[:4].sum(axis=(0, 1)) / 12
  np.testing.assert_allclose(np.asarray(new.params), 1 - 0.1 * grad, rtol=1e-5)


def test_lr_scale_scales_the_step_as_the_learning_rate_would(mesh1, rules):
  batch = _batch(live_rows=ROWS)
  a_opt, b_opt = optax.adam(1e-2), optax.adam(0.5e-2)
  a, b = _update(a_opt, mesh1, rules), _update(b_opt, mesh1, rules)
  scaled, _ = a(_state(a, a_opt), batch, jax.random.key(0), lr_scale=0.5)
  half, _ = b(_state(b, b_opt), batch, jax.random.key(0))
  np.testing.assert_allclose(np.asarray(scaled.params), np.asarray(half.params), rtol=1e-6)


def test_follow_batch_scales_lr_by_the_rule_at_the_effective_batch():
  import types
  from tests.support import filled_optim
  from rlscale.rl import optim
  from rlscale.rl.trained import Trained
  cfg = filled_optim({"lr": 1e-3, "lr_scaling": "sqrt", "reference_batch": 64,
                      "lr_batch": "effective"})
  model = types.SimpleNamespace(optim_cfg=cfg, batch=types.SimpleNamespace(num_minibatches=2),
                                scaled=optim.scale(cfg, 64), lr_scale=None)
  Trained.follow_batch(model, 32)  # 16 informative responses per optimizer step: k = 1/4
  assert model.lr_scale == pytest.approx(0.5)
  cfg["lr_batch"] = "nominal"
  model.lr_scale = None
  Trained.follow_batch(model, 32)
  assert model.lr_scale is None  # the nominal batch: no per-step scale

"""Learning-rate and Adam scaling rules, and schedules counted in responses."""


import pytest

from tests.support import filled_optim as fill_optim
from rlscale.rl import optim


def _cfg(**kw):
  base = dict(lr=1e-4, b1=0.9, b2=0.99, eps=1e-8, lr_scaling="none", reference_batch=512,
              adam_scaling=False, schedule="constant", warmup_responses=0, final_lr_frac=0.0)
  base.update(kw)
  return fill_optim(base)


@pytest.mark.parametrize("batch, ref, rule, want", [
    (2048, 512, "linear", 4e-4), (2048, 512, "sqrt", 2e-4), (128, 512, "sqrt", 5e-5),
    (128, 512, "linear", 2.5e-5), (128, 512, "none", 1e-4), (512, 512, "sqrt", 1e-4),
])
def test_lr_rules(batch, ref, rule, want):
  s = optim.scale(_cfg(lr_scaling=rule, reference_batch=ref), batch)
  assert s.lr == pytest.approx(want) and s.k == pytest.approx(batch / ref)
  assert (s.b1, s.b2, s.eps) == (0.9, 0.99, 1e-8)  # untouched without adam_scaling


def test_adam_scaling():
  s = optim.scale(_cfg(lr_scaling="sqrt", adam_scaling=True), 2048)  # k = 4
  assert s.b1 == pytest.approx(1 - 4 * 0.1) and s.b2 == pytest.approx(1 - 4 * 0.01)
  assert s.eps == pytest.approx(1e-8 / 2)
  s = optim.scale(_cfg(adam_scaling=True), 128)  # k = 1/4
  assert s.b1 == pytest.approx(1 - 0.025) and s.b2 == pytest.approx(0.9975)
  assert s.eps == pytest.approx(2e-8)
  s = optim.scale(_cfg(adam_scaling=True), 512 * 20)  # k = 20: beta1 would be negative
  assert s.b1 == 0.0 and s.b2 == pytest.approx(0.8)
  s = optim.scale(_cfg(adam_scaling=True, b2=0.99999), 128)
  assert s.b2 == 0.9999  # clipped


def test_schedule_is_the_same_per_response_at_every_batch():
  cfg = _cfg(schedule="cosine", warmup_responses=1000, final_lr_frac=0.1)
  total = 8192
  small = optim.schedule(cfg, 1e-3, total, 128)
  big = optim.schedule(cfg, 1e-3, total, 1024)
  for responses in (0, 1024, 2048, 4096, 8192):
    assert float(small(responses // 128)) == pytest.approx(float(big(responses // 1024)))
  assert float(big(0)) == 0.0 and float(big(8)) == pytest.approx(1e-4)  # cosine end
  assert float(small(4)) == pytest.approx(1e-3 * 512 / 1000)  # in the warmup


def test_optimizer_logs_the_scaled_hyperparameters():
  import jax.numpy as jnp
  tx, s = optim.make(_cfg(lr_scaling="sqrt", adam_scaling=True), batch=2048,
                     total_responses=10_000, responses_per_step=2048)
  state = tx.init({"w": jnp.zeros(3)})
  _, state = tx.update({"w": jnp.ones(3)}, state, {"w": jnp.zeros(3)})
  hp = optim.hyperparams(state)
  assert float(hp["learning_rate"]) == pytest.approx(2e-4)
  assert float(hp["b1"]) == pytest.approx(0.6) and float(hp["eps"]) == pytest.approx(5e-9)
  with pytest.raises(ValueError, match="lr_scaling='cubic'"):
    optim.scale(_cfg(lr_scaling="cubic"), 1)


@pytest.mark.parametrize("clip", [0.0, 1.0])
def test_a_branch_keeps_the_parents_moments_and_its_own_rate_and_clock(clip):
  """optim.branched: a parent trained 30 steps at B = 256 on a cosine schedule; a branch at
  B = 8 must run its own rate (its rule at its batch) from the start of its own schedule, on the
  parent's Adam moments and bias-correction count."""
  import jax
  import jax.numpy as jnp
  cfg = _cfg(schedule="cosine", lr_scaling="sqrt", reference_batch=256, grad_clip=clip)
  parent_tx, _ = optim.make(cfg, batch=256, total_responses=256 * 40, responses_per_step=256)
  state = parent_tx.init({"w": jnp.zeros(3)})
  for _ in range(30):
    _, state = parent_tx.update({"w": jnp.ones(3)}, state, {"w": jnp.zeros(3)})
  branch_tx, s = optim.make(cfg, batch=8, total_responses=128, responses_per_step=8)
  mine = optim.branched(branch_tx.init({"w": jnp.zeros(3)}), state)
  _, after = branch_tx.update({"w": jnp.ones(3)}, mine, {"w": jnp.zeros(3)})
  # Step 0 of its own 16-step cosine: its full rate, 1e-4 x sqrt(8 / 256).
  assert float(optim.hyperparams(after)["learning_rate"]) == pytest.approx(s.lr)
  adam = lambda st: [x for x in jax.tree.leaves(st, is_leaf=lambda y: hasattr(y, "nu"))  # noqa: E731
                     if hasattr(x, "nu")][0]
  assert int(adam(mine).count) == 30  # the parent's: warm moments are not re-inflated
  assert jnp.array_equal(adam(mine).nu["w"], adam(state).nu["w"])
  # Without it the parent's clock and rate would be read: 30 of its 40 steps into its decay.
  _, stale = branch_tx.update({"w": jnp.ones(3)}, state, {"w": jnp.zeros(3)})
  assert float(optim.hyperparams(stale)["learning_rate"]) != pytest.approx(s.lr)

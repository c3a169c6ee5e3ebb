"""The update with shared-prompt training against the per-row update on one device: the same
parameters after the step and the same metrics (the noise scale's two gradient norms
included), for the policy loss (GRPO's and PPO's actor: clipped surrogate, KL, entropy) and the
critic's value loss, on several mesh layouts.

Both updates shuffle by whole groups (the per-row one with by_group=True): the shared one
always does, so the two see the same micro-batches. Tolerance: float32; parameters after one
SGD step of lr 1 (so they move by minus the gradient) within 1e-5 of the largest entry of
their parameter's change (plus two float32 ulps at 1.0, where norm weights live), metrics within 1e-4 relative (the summation order differs).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlscale import models
from rlscale.parallel import sharding
from rlscale.rl import packing
from rlscale.rl.policy_loss import make_policy_loss
from rlscale.rl.ppo import make_critic_loss
from rlscale.rl.update import (SequenceBatch, TrainState, UpdateOptions, make_update,
                               policy_forward, value_forward)
from tests.unit.models.test_shared_prompt import groups

RL = dict(clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.05, kl_estimator="k3",
          entropy_coef=0.01, dual_clip=0.0)
CFG = models.ModelConfig(family="qwen3", vocab_size=64, d_model=32, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, mlp_dim=64, qk_norm=True)
G, ROWS = 4, 32


def batch():
  tokens, mask, n = groups(CFG.vocab_size, g=ROWS // G, group=G, tp=6, n=5, seed=3)
  rng = np.random.default_rng(4)
  per_token = lambda: jnp.asarray((-2 + 0.1 * rng.normal(size=(ROWS, n))).astype(np.float32))
  extras = {"advantages": jnp.asarray(rng.normal(size=ROWS).astype(np.float32)),
            "old_logp": per_token(), "ref_logp": per_token(),
            "returns": per_token() + 2, "old_values": per_token() + 2}
  return SequenceBatch(tokens, mask, mask[:, -n:], extras)


def run(kind, mesh, shared, remat="none", pack=False):
  rules = sharding.rules_from_config(None)
  if kind == "actor":
    model, forward, loss = models.CausalLM, policy_forward, make_policy_loss(RL)
  else:
    model, forward, loss = models.ValueModel, value_forward, make_critic_loss({"value_clip": 0.2})
  graphdef, params = nnx.split(model(CFG, rngs=nnx.Rngs(params=0)))
  opt = optax.sgd(1.0)
  update = make_update(forward(graphdef, remat=remat), opt, loss, UpdateOptions(num_minibatches=2,
                       num_epochs=1, microbatch=8, aggregation="seq-mean-token-mean", max_len=5,
                       group_size=G, shared_prompt=G if shared else 1, pack=pack), mesh=mesh,
                       rules=rules)
  state = update.place(TrainState(params, opt.init(params), jnp.zeros((), jnp.int32)))
  delta = jax.tree.map(jnp.copy, params)
  state, metrics = update(state, batch(), jax.random.key(0), by_group=True)
  delta = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), state.params, delta)
  if pack:
    assert update.packed_rows is not None and update.packed_rows < update.packer.rows
  return delta, jax.device_get(metrics), update.traces


@pytest.fixture(scope="module")
def reference():
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  return {kind: run(kind, mesh, shared=False) for kind in ("actor", "critic")}


@pytest.mark.parametrize("kind,shape,remat,pack", [("actor", (1, 1, 1), "none", False),
                                                   ("actor", (2, 2, 2), "full", False),
                                                   ("critic", (1, 2, 4), "none", False),
                                                   ("critic", (2, 1, 1), "dots", False),
                                                   ("actor", (1, 1, 1), "none", True),
                                                   ("actor", (2, 1, 1), "full", True),
                                                   ("critic", (1, 2, 4), "none", True),
                                                   ("critic", (1, 2, 1), "dots", True)])
def test_shared_prompt_update_equals_the_per_row_update(reference, kind, shape, remat, pack):
  """pack: the responses packed into fewer rows per shard (rl/packing.py), 2 batch shards of
  one group each, or one shard of two."""
  n = int(np.prod(shape))
  mesh = sharding.make_mesh(shape, devices=jax.devices()[:n])
  delta, metrics, traces = run(kind, mesh, shared=True, remat=remat, pack=pack)
  want_delta, want_metrics, _ = reference[kind]
  for (path, a), b in zip(jax.tree.leaves_with_path(delta), jax.tree.leaves(want_delta)):
    scale = float(np.max(np.abs(b))) or 1.0
    # + two float32 ulps at 1.0: the norm weights (near 1) move by less than their spacing allows
    assert float(np.max(np.abs(a - b))) <= 1e-5 * scale + 2.4e-7, jax.tree_util.keystr(path)
  assert "noise/grad_sq_small" in metrics and set(metrics) == set(want_metrics)
  for k in metrics:
    np.testing.assert_allclose(metrics[k], want_metrics[k], rtol=1e-4, atol=1e-7, err_msg=k)
  assert traces == 1


def test_shared_prompt_needs_micro_batches_of_whole_groups():
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  graphdef, _ = nnx.split(models.CausalLM(CFG, rngs=nnx.Rngs(params=0)))
  with pytest.raises(ValueError, match="whole groups of 4"):
    make_update(policy_forward(graphdef), optax.sgd(1.0), make_policy_loss(RL),
                UpdateOptions(num_minibatches=1, num_epochs=1, microbatch=6,
                aggregation="token-mean", max_len=5, group_size=4, shared_prompt=4), mesh=mesh,
                rules=sharding.rules_from_config(None))


def test_whole_batch_forwards_run_each_prompt_once():
  """The old/reference log-probs and the critic's values over the step's batch (response_fn
  with the group, padded and packed), on 4 batch shards of 2 groups each, against the per-row
  forward."""
  from rlscale.rl.update import response_fn
  rules = sharding.rules_from_config(None)
  mesh = sharding.make_mesh((2, 2, 2))
  b = batch()
  for model, forward, field in ((models.CausalLM, policy_forward, "logp"),
                                (models.ValueModel, value_forward, "values")):
    graphdef, params = nnx.split(model(CFG, rngs=nnx.Rngs(params=0)))
    want = response_fn(forward(graphdef), field, mesh, rules)(params, b)
    got = response_fn(forward(graphdef), field, mesh, rules, group=G)(params, b)
    np.testing.assert_allclose(np.where(b.resp_mask, got, 0), np.where(b.resp_mask, want, 0),
                               atol=1e-5, err_msg=field)
    packed = response_fn(forward(graphdef), field, mesh, rules, group=G, pack=True)(params, b)
    np.testing.assert_allclose(np.where(b.resp_mask, packed, 0), np.where(b.resp_mask, want, 0),
                               atol=1e-5, err_msg=f"{field}, packed")
    beyond = np.arange(b.resp_mask.shape[1])[None] > np.asarray(packing.input_lengths(b.resp_mask))[:, None]
    assert beyond.any() and np.all(np.asarray(packed)[beyond] == 0)  # packed: not computed

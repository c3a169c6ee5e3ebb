"""The packed response stream (models/packed_rows.py, shared_prompt.packed_hidden, planned by
rl/packing.py) against the per-row forward: log-probs, entropies, values and every parameter's
gradient, at the positions that carry loss, on one and on two batch shards' layouts.

Tolerance: that of tests/unit/models/test_shared_prompt.py (float32, the same sums in another
order): 1e-5 absolute for per-token values, 1e-5 of each parameter's largest gradient entry.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlscale import models
from rlscale.rl import packing
from tests.unit.models.test_shared_prompt import FAMILIES, TOL, assert_grads_close, groups


def plan(mask, n, group, shards):
  resp = mask[:, -n:]
  rows = mask.shape[0]
  packer = packing.Packer(num_epochs=1, num_minibatches=1, microbatch=rows, shards=shards,
                          group=group)
  lengths = np.asarray(packing.input_lengths(resp))
  p = packer.plan(lengths, np.arange(rows)[None], n - 1)
  assert p is not None, "the test's rows should pack into fewer rows"
  return jax.tree.map(lambda x: jnp.asarray(x[0, 0, 0]), p), lengths


def loss_fn(graphdef, tokens, mask, n, group, chunk, remat, p):
  resp = mask[:, -n:].astype(jnp.float32)

  def loss(params):
    logp, ent = nnx.merge(graphdef, params).response_logprobs(tokens, mask, n, chunk, remat,
                                                              group, p)
    return jnp.sum(resp * (0.3 * logp + 0.1 * ent)), (logp, ent)
  return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.parametrize("family,remat,chunk,shards", [("llama", "none", 0, 1),
                                                       ("qwen2", "full", 48, 2),
                                                       ("qwen3", "dots", 0, 2)])
def test_packed_policy_equals_the_per_row_path(tiny_cfg, family, remat, chunk, shards):
  cfg = tiny_cfg.replace(num_layers=2, **FAMILIES[family])
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)))
  tokens, mask, n = groups(cfg.vocab_size, g=4, n=9, seed=3)
  p, lengths = plan(mask, n, 4, shards)
  resp = np.asarray(mask[:, -n:])
  (v_row, (lp_row, ent_row)), g_row = loss_fn(graphdef, tokens, mask, n, 1, chunk, remat, None)(params)
  (v_pk, (lp_pk, ent_pk)), g_pk = loss_fn(graphdef, tokens, mask, n, 4, chunk, remat, p)(params)
  assert p.src.shape[1] * shards < tokens.shape[0]  # fewer rows than the per-row layout
  np.testing.assert_allclose(np.where(resp, lp_pk, 0), np.where(resp, lp_row, 0), atol=TOL)
  np.testing.assert_allclose(np.where(resp, ent_pk, 0), np.where(resp, ent_row, 0), atol=TOL)
  np.testing.assert_allclose(float(v_pk), float(v_row), rtol=TOL)
  assert_grads_close(g_pk, g_row)
  beyond = np.arange(n)[None] > lengths[:, None]  # after each row's last loss token
  assert np.all(np.asarray(lp_pk)[beyond] == 0)  # not computed


def test_packed_critic_equals_the_per_row_path(tiny_cfg):
  cfg = tiny_cfg.replace(num_layers=2)
  graphdef, params = nnx.split(models.ValueModel(cfg, rngs=nnx.Rngs(params=1)))
  tokens, mask, n = groups(cfg.vocab_size, g=4, n=9, seed=4)
  p, _ = plan(mask, n, 4, 2)
  resp = mask[:, -n:].astype(jnp.float32)

  def run(group, pk):
    def loss(params):
      v = nnx.merge(graphdef, params).response_values(tokens, mask, n, "none", group, pk)
      return jnp.sum(resp * jnp.square(v - 0.5)), v
    return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)

  (l_row, v_row), g_row = run(1, None)
  (l_pk, v_pk), g_pk = run(4, p)
  np.testing.assert_allclose(np.where(resp, v_pk, 0), np.where(resp, v_row, 0), atol=TOL)
  np.testing.assert_allclose(float(l_pk), float(l_row), rtol=TOL)
  assert_grads_close(g_pk, g_row)

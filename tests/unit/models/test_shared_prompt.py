"""Shared-prompt training (models/shared_prompt.py) against the per-row forward: log-probs,
entropies, values and every parameter's gradient, for each family, remat policy and
log-prob chunking.

Tolerance: float32 throughout; the two paths compute the same sums in a different order (the
prompt's gradient summed once over its G rows instead of G row gradients summed), so values
agree within 1e-5 absolute and gradients within 1e-5 of the largest gradient entry of their
parameter (measured: ~3e-6).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlscale import models

TOL = 1e-5


def groups(vocab, g=3, group=4, tp=7, n=6, seed=0):
  """g groups of `group` rows: one left-padded prompt per group (lengths 2..tp), responses of
  1..n real tokens then padding (row g*group + i is member i of group g)."""
  rng = np.random.default_rng(seed)
  tokens = np.zeros((g * group, tp + n), np.int32)
  mask = np.zeros_like(tokens, bool)
  for h in range(g):
    plen = int(rng.integers(2, tp + 1))
    prompt = rng.integers(3, vocab, plen)
    for i in range(group):
      r, rl = h * group + i, int(rng.integers(1, n + 1))
      tokens[r, tp - plen:tp], mask[r, tp - plen:tp] = prompt, True
      tokens[r, tp:tp + rl], mask[r, tp:tp + rl] = rng.integers(3, vocab, rl), True
  return jnp.asarray(tokens), jnp.asarray(mask), n


def assert_grads_close(got, want):
  for path, a, b in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(got),
                        jax.tree.leaves(want)):
    scale = float(jnp.max(jnp.abs(b))) or 1.0
    err = float(jnp.max(jnp.abs(a - b)))
    assert err <= TOL * scale, (jax.tree_util.keystr(path[0]), err, scale)


def policy_loss(graphdef, tokens, mask, n, group, chunk, remat):
  resp = mask[:, -n:].astype(jnp.float32)

  def loss(params):
    logp, ent = nnx.merge(graphdef, params).response_logprobs(tokens, mask, n, chunk, remat,
                                                              group)
    return jnp.sum(resp * (0.3 * logp + 0.1 * ent)), (logp, ent)
  return jax.jit(jax.value_and_grad(loss, has_aux=True))


FAMILIES = {
    "llama": dict(),
    "qwen2": dict(family="qwen2", qkv_bias=True, tie_embeddings=False),
    "qwen3": dict(family="qwen3", qk_norm=True),
}


@pytest.mark.parametrize("family,remat,chunk", [("llama", "none", 0), ("qwen2", "full", 48),
                                                ("qwen3", "dots", 0)])
def test_policy_logprobs_and_gradients_equal_the_per_row_path(tiny_cfg, family, remat, chunk):
  cfg = tiny_cfg.replace(num_layers=2, **FAMILIES[family])
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)))
  tokens, mask, n = groups(cfg.vocab_size)
  resp = np.asarray(mask[:, -n:])
  (v_row, (lp_row, ent_row)), g_row = policy_loss(graphdef, tokens, mask, n, 1, chunk, remat)(params)
  (v_sh, (lp_sh, ent_sh)), g_sh = policy_loss(graphdef, tokens, mask, n, 4, chunk, remat)(params)
  np.testing.assert_allclose(np.where(resp, lp_sh, 0), np.where(resp, lp_row, 0), atol=TOL)
  np.testing.assert_allclose(np.where(resp, ent_sh, 0), np.where(resp, ent_row, 0), atol=TOL)
  np.testing.assert_allclose(float(v_sh), float(v_row), rtol=TOL)
  assert_grads_close(g_sh, g_row)


def test_critic_values_and_gradients_equal_the_per_row_path(tiny_cfg):
  cfg = tiny_cfg.replace(num_layers=2)
  graphdef, params = nnx.split(models.ValueModel(cfg, rngs=nnx.Rngs(params=1)))
  tokens, mask, n = groups(cfg.vocab_size, g=2, group=3, seed=1)
  resp = mask[:, -n:].astype(jnp.float32)

  def loss(params, group):
    v = nnx.merge(graphdef, params).response_values(tokens, mask, n, "none", group)
    return jnp.sum(resp * jnp.square(v - 0.5)), v
  grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (_, v_row), g_row = grad(params, 1)
  (_, v_sh), g_sh = grad(params, 3)
  np.testing.assert_allclose(v_sh * resp, v_row * resp, atol=TOL)
  assert_grads_close(g_sh, g_row)


def test_each_prompt_runs_once(tiny_cfg):
  """The compiled training step's FLOPs fall as the prompt's share of the tokens: with
  prompts of 32 and responses of 8 in groups of 8, the per-row path runs 8 x 40 tokens per
  group and the shared path 32 + 8 x 7 (the last response token is no query's input)."""
  cfg = tiny_cfg.replace(num_layers=1)
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)))
  tokens, mask, n = groups(cfg.vocab_size, g=2, group=8, tp=32, n=8)

  def flops(group):
    fn = policy_loss(graphdef, tokens, mask, n, group, 0, "none")
    return fn.lower(params).compile().cost_analysis()["flops"]
  ratio = flops(8) / flops(1)
  assert ratio < 0.45, ratio  # 88 / 320 of the token-proportional work, attention aside

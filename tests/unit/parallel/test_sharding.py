"""Mesh construction, logical rules, and the same numbers on every mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rlscale import models
from rlscale.parallel import sharding
from rlscale.sampling import Sampler, SamplingParams, generate

MESH_ATOL = 1e-5  # float32 logits and log-probs: only the summation order differs between meshes
MESHES = [(8, 1, 1), (2, 2, 2), (1, 2, 4)]


def test_make_mesh_fills_minus_one_and_checks_sizes():
  assert dict(sharding.make_mesh((-1, 2, 1)).shape) == {"data": 4, "fsdp": 2, "tensor": 1}
  with pytest.raises(ValueError, match="at most one -1"):
    sharding.make_mesh((-1, -1, 2))
  with pytest.raises(ValueError, match="does not fit 8 devices: it needs 12"):
    sharding.make_mesh((3, 2, 2))
  with pytest.raises(ValueError, match="multiply to 3, which does not divide them"):
    sharding.make_mesh((-1, 3, 1))
  with pytest.raises(ValueError, match=r"mesh.shape=\(8, 1\) must be 3 positive sizes"):
    sharding.make_mesh((8, 1))


def test_rules_map_logical_axes_and_replicate_what_does_not_divide(rules):
  mesh = sharding.make_mesh((1, 2, 4))
  assert sharding.logical_to_spec(("embed", "mlp"), (256, 704), mesh, rules) == P("fsdp", "tensor")
  # 2 KV heads do not split over a tensor axis of 4: replicated rather than an XLA error.
  assert sharding.logical_to_spec(("embed", "kv_heads"), (256, 2), mesh, rules) == P("fsdp", None)
  # A mesh axis serves one array axis at most.
  assert sharding.logical_to_spec(("mlp", "vocab"), (8, 8), mesh, rules) == P("tensor", None)
  assert sharding.logical_to_spec(("batch", None), (8, 3), sharding.make_mesh((2, 2, 2)),
                                  rules) == P(("data", "fsdp"), None)
  with pytest.raises(ValueError, match="'model' is not a mesh axis"):
    sharding.rules_from_config([("mlp", "model")])


@pytest.fixture(scope="module")
def mesh_cfg():
  # kv_heads=4 so that the (1, 2, 4) mesh really splits attention over `tensor`.
  return models.ModelConfig(family="qwen3", vocab_size=128, d_model=128, num_layers=2,
                            num_heads=8, num_kv_heads=4, head_dim=32, mlp_dim=256,
                            qk_norm=True, tie_embeddings=False)


@pytest.fixture(scope="module")
def reference(mesh_cfg, mesh1, rules):
  model = models.create_sharded(models.CausalLM, mesh_cfg, mesh1, rules, jax.random.key(0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 128, (8, 12)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  for r in range(8):
    mask[r, :r] = False
  return model, tokens, mask


def _on_mesh(model, mesh, rules):
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, jax.device_put(state, sharding.state_shardings(state, mesh, rules)))


def _sample(model, mesh, rules, tokens, mask, temperature):
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingParams(max_new_tokens=16, temperature=temperature,
                                             decode_chunk=8), mesh, rules)
  return generate(sampler, state, tokens, mask, jax.random.key(3))


def test_parameters_are_created_on_their_shards(mesh_cfg, rules):
  mesh = sharding.make_mesh((1, 2, 4))
  model = models.create_sharded(models.CausalLM, mesh_cfg, mesh, rules, jax.random.key(0))
  state = nnx.state(model)
  qkv = state["model"]["layers"][0]["qkv"][...]
  assert qkv.sharding.spec == P("fsdp", "tensor")
  assert qkv.addressable_shards[0].data.shape == (64, 1, 4, 32)  # [E/2, KV/4, G+2, D]
  assert state["lm_head"][...].sharding.spec == P("fsdp", "tensor")
  assert state["model"]["final_norm"][...].sharding.spec == P()


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
@pytest.mark.parametrize("shape", MESHES)
def test_forward_and_decode_agree_with_one_device(shape, reference, mesh1, rules):
  model, tokens, mask = reference
  mesh = sharding.make_mesh(shape)
  sharded = _on_mesh(model, mesh, rules)

  @jax.jit
  def forward(state, tokens, mask):
    with sharding.activation_sharding(mesh, rules):
      return nnx.merge(nnx.graphdef(model), state)(tokens, mask)

  logits = forward(nnx.state(sharded), sharding.put_batch(tokens, mesh, rules),
                   sharding.put_batch(mask, mesh, rules))
  want = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
  assert np.abs(np.asarray(logits) - want)[mask].max() <= MESH_ATOL

  for temperature in (0.0, 1.0):
    ref = _sample(model, mesh1, rules, tokens, mask, temperature)
    out = _sample(sharded, mesh, rules, tokens, mask, temperature)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(ref.mask))
    assert np.abs(np.asarray(out.logprobs) - np.asarray(ref.logprobs)).max() <= MESH_ATOL
    assert out.tokens.sharding == sharding.batch_sharding(mesh, 2, rules)

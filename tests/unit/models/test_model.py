"""The decoder: config checks, parameter count, padding, the critic, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlscale import models
from rlscale.models.layers import rope_inv_freq


def _rows(rng, vocab, b, t):
  tokens = rng.integers(1, vocab, (b, t)).astype(np.int32)
  return tokens, np.ones((b, t), bool)


def test_named_sizes_have_the_published_parameter_counts():
  # Totals from the model cards (embeddings included, tied counted once).
  expected = {"qwen2.5-0.5b": 494.0e6, "qwen3-0.6b": 596.0e6, "qwen3-1.7b": 1.72e9,
              "llama-3.2-1b": 1.236e9, "llama-3-8b": 8.03e9}
  for name, n in expected.items():
    got = models.named(name).num_params()
    assert abs(got - n) / n < 0.01, (name, got, n)


def test_param_count_matches_the_built_model(tiny_cfg):
  for cfg in (tiny_cfg, tiny_cfg.replace(family="qwen2", qkv_bias=True, tie_embeddings=False),
              tiny_cfg.replace(family="qwen3", qk_norm=True)):
    _, state = models.abstract_model(models.CausalLM, cfg)
    n = sum(int(np.prod(v.shape)) for v in jax.tree.leaves(state))
    assert n == cfg.num_params()


@pytest.mark.parametrize("bad, field", [
    (dict(num_heads=6, num_kv_heads=4), "num_kv_heads"),
    (dict(head_dim=63), "head_dim"),
    (dict(family="gpt2"), "family"),
    (dict(d_model=0), "d_model"),
    (dict(dtype="float33"), "dtype"),
])
def test_bad_model_config_names_the_field(tiny_cfg, bad, field):
  with pytest.raises(ValueError, match=field):
    tiny_cfg.replace(**bad)


def test_unknown_named_size_and_field():
  with pytest.raises(ValueError, match="qwen9"):
    models.named("qwen9")
  with pytest.raises(ValueError, match="d_modle"):
    models.from_config_dict({"name": "tiny", "d_modle": 3})


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_left_padding_does_not_change_real_positions(tiny_cfg):
  model = models.CausalLM(tiny_cfg, rngs=nnx.Rngs(params=0))
  rng = np.random.default_rng(0)
  tokens, mask = _rows(rng, tiny_cfg.vocab_size, 1, 7)
  ref = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))[0]
  padded = np.concatenate([np.zeros((1, 5), np.int32), tokens], 1)
  pmask = np.concatenate([np.zeros((1, 5), bool), mask], 1)
  got = np.asarray(model(jnp.asarray(padded), jnp.asarray(pmask)))[0, 5:]
  np.testing.assert_allclose(got, ref, atol=1e-5)


def test_token_logprobs_agree_with_full_logits(tiny_cfg):
  model = models.CausalLM(tiny_cfg, rngs=nnx.Rngs(params=1))
  tokens, mask = _rows(np.random.default_rng(1), tiny_cfg.vocab_size, 2, 9)
  logits = model(jnp.asarray(tokens), jnp.asarray(mask))
  full = jax.nn.log_softmax(logits, -1)[:, 3:-1]
  want = np.take_along_axis(np.asarray(full), tokens[:, 4:, None], -1)[..., 0]
  got = model.token_logprobs(jnp.asarray(tokens), jnp.asarray(mask), 4)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_prefill_last_position_equals_full_forward(tiny_cfg):
  model = models.CausalLM(tiny_cfg, rngs=nnx.Rngs(params=2))
  tokens, mask = _rows(np.random.default_rng(2), tiny_cfg.vocab_size, 3, 6)
  mask[1, :2] = False
  full, kvs_full = model.model(jnp.asarray(tokens), jnp.asarray(mask), return_kv=True)
  last, kvs = model.model.prefill(jnp.asarray(tokens), jnp.asarray(mask))
  np.testing.assert_allclose(np.asarray(last), np.asarray(full[:, -1]), atol=1e-5)
  for (k1, v1), (k2, v2) in zip(kvs_full, kvs):
    np.testing.assert_allclose(np.asarray(k1), np.asarray(k2), atol=1e-6)
    np.testing.assert_allclose(np.asarray(v1), np.asarray(v2), atol=1e-6)


def test_critic_gives_one_value_per_position_from_the_same_backbone(tiny_cfg):
  critic = models.ValueModel(tiny_cfg, rngs=nnx.Rngs(params=0))
  policy = models.CausalLM(tiny_cfg, rngs=nnx.Rngs(params=0))
  tokens, mask = _rows(np.random.default_rng(3), tiny_cfg.vocab_size, 2, 5)
  values = critic(jnp.asarray(tokens), jnp.asarray(mask))
  assert values.shape == (2, 5) and values.dtype == jnp.float32
  # Same init key: the backbone is the policy's, so its hidden states feed the value head.
  hidden = policy.model(jnp.asarray(tokens), jnp.asarray(mask))
  want = np.asarray(hidden) @ np.asarray(critic.value_head[...]) + float(critic.value_bias[...])
  np.testing.assert_allclose(np.asarray(values), want, atol=1e-5)


def test_bfloat16_compute_keeps_float32_logits(tiny_cfg):
  cfg = tiny_cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
  model = models.CausalLM(cfg, rngs=nnx.Rngs(params=0))
  ref_model = models.CausalLM(tiny_cfg, rngs=nnx.Rngs(params=0))
  tokens, mask = _rows(np.random.default_rng(4), cfg.vocab_size, 2, 6)
  logits = model(jnp.asarray(tokens), jnp.asarray(mask))
  assert logits.dtype == jnp.float32
  assert model.model.embed[...].dtype == jnp.bfloat16
  ref = ref_model(jnp.asarray(tokens), jnp.asarray(mask))
  assert float(jnp.max(jnp.abs(logits - ref))) < 0.05  # bf16 rounding of weights and activations


def test_llama3_rope_scaling_only_touches_low_frequencies():
  cfg = models.named("llama-3.2-1b")
  plain = rope_inv_freq(cfg.replace(rope_scaling=None))
  scaled = rope_inv_freq(cfg)
  wavelen = 2 * np.pi / plain
  s = cfg.rope_scaling
  high = wavelen < s.original_max_position / s.high_freq_factor
  low = wavelen > s.original_max_position / s.low_freq_factor
  np.testing.assert_array_equal(scaled[high], plain[high])
  np.testing.assert_allclose(scaled[low], plain[low] / s.factor, rtol=1e-6)
  mid = ~high & ~low
  assert np.all(scaled[mid] < plain[mid]) and np.all(scaled[mid] > plain[mid] / s.factor)

"""The KV-cache decode loop against the training forward, and the sampling rules."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlscale import models
from rlscale.parallel import sharding
from rlscale.sampling import Sampler, SamplingParams, generate
from rlscale.sampling.sample import row_keys, row_uniforms, sample

LOGP_ATOL = 1e-4  # float32: decode-loop log-probs against the full-sequence forward


@pytest.fixture(scope="module")
def policy(tiny_cfg, mesh1, rules):
  model = models.create_sharded(models.CausalLM, tiny_cfg, mesh1, rules, jax.random.key(0))
  model.mesh = mesh1  # the tests' way to carry the mesh along
  return model


def _prompts(vocab, b=6, p=9, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, vocab, (b, p)).astype(np.int32)
  mask = np.ones((b, p), bool)
  for r in range(b):
    pads = (2 * r) % p
    mask[r, :pads] = False
    tokens[r, :pads] = 0
  return tokens, mask


def _run(policy, params, tokens, mask, key=1, **kw):
  graphdef, state = nnx.split(policy)
  sampler = Sampler(graphdef, params, policy.mesh)
  return sampler, generate(sampler, state, tokens, mask, jax.random.key(key), **kw)


def _recompute(policy, tokens, mask, out):
  full = jnp.asarray(np.concatenate([tokens, np.asarray(out.tokens)], 1))
  fmask = jnp.asarray(np.concatenate([mask, np.asarray(out.mask)], 1))
  logits = np.asarray(policy(full, fmask))[:, tokens.shape[1] - 1:-1]
  return logits


def test_auto_decode_chunk_follows_the_rows_per_device():
  from rlscale.sampling import kv_cache
  from rlscale.sampling.decode import _cache_shapes
  assert kv_cache.chunk_size(63, "auto", rows_per_device=64) == 64
  assert kv_cache.chunk_size(63, "auto", rows_per_device=512) == 16
  assert kv_cache.chunk_size(511, "auto", rows_per_device=127) == 64
  assert kv_cache.chunk_size(511, "auto", rows_per_device=128) == 16
  assert kv_cache.chunk_size(9, "auto", rows_per_device=512) == 16  # slots rounded up to 16
  cfg = models.named("tiny", vocab_size=64)
  p = SamplingParams(max_new_tokens=64, decode_chunk="auto")
  slots = lambda rows, shards: _cache_shapes(cfg, p, rows, 8, shards).chunks[0][0].v_BxKxTxD.shape[2]
  assert (slots(512, 1), slots(512, 8), slots(1024, 8)) == (16, 64, 16)  # rows per device
  with pytest.raises(ValueError, match="decode_chunk='x' must be >= 1 or 'auto'"):
    SamplingParams(max_new_tokens=4, decode_chunk="x")


@pytest.mark.parametrize("chunk", [64, 5, "auto"])
def test_greedy_tokens_are_the_argmax_of_the_full_forward(policy, tiny_cfg, chunk):
  tokens, mask = _prompts(tiny_cfg.vocab_size)
  _, out = _run(policy, SamplingParams(max_new_tokens=17, temperature=0.0, decode_chunk=chunk),
                tokens, mask)
  logits = _recompute(policy, tokens, mask, out)
  np.testing.assert_array_equal(np.asarray(out.tokens), logits.argmax(-1))
  logp = jax.nn.log_softmax(logits, -1)
  want = np.take_along_axis(np.asarray(logp), np.asarray(out.tokens)[..., None], -1)[..., 0]
  assert np.abs(np.asarray(out.logprobs) - want).max() <= LOGP_ATOL


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=20, temperature=1.0, decode_chunk=8),
    SamplingParams(max_new_tokens=20, temperature=0.7, top_k=10, decode_chunk=64),
    SamplingParams(max_new_tokens=20, temperature=1.3, top_p=0.8, decode_chunk=16),
    SamplingParams(max_new_tokens=20, temperature=0.9, top_k=20, top_p=0.9, decode_chunk=7),
])
@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_sampled_logprobs_equal_the_training_forward(policy, tiny_cfg, params):
  tokens, mask = _prompts(tiny_cfg.vocab_size, seed=1)
  _, out = _run(policy, params, tokens, mask)
  logits = _recompute(policy, tokens, mask, out)
  toks = np.asarray(out.tokens)[..., None]
  policy_lp = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits, -1)), toks, -1)[..., 0]
  assert np.abs(np.asarray(out.logprobs) - policy_lp).max() <= LOGP_ATOL
  # The sampler's own distribution: temperature, then top-k, then top-p, renormalized.
  z = logits / params.temperature
  order = np.argsort(-z, axis=-1, kind="stable")
  zs = np.take_along_axis(z, order, -1)
  keep = np.ones_like(zs, bool)
  if params.top_k:
    keep[..., params.top_k:] = False
  if params.top_p < 1:
    p = np.exp(zs - zs.max(-1, keepdims=True)) * keep
    p /= p.sum(-1, keepdims=True)
    keep &= (np.cumsum(p, -1) - p) < params.top_p
  zs = np.where(keep, zs, -np.inf)
  slp_sorted = zs - np.log(np.sum(np.exp(zs - zs.max(-1, keepdims=True)), -1, keepdims=True)) - zs.max(-1, keepdims=True)
  rank = np.argmax(order == toks, axis=-1)[..., None]
  want = np.take_along_axis(slp_sorted, rank, -1)[..., 0]
  assert np.all(np.isfinite(want)), "a sampled token lies outside the allowed set"
  assert np.abs(np.asarray(out.sample_logprobs) - want).max() <= LOGP_ATOL


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_top_k_one_and_tiny_top_p_are_greedy(policy, tiny_cfg):
  tokens, mask = _prompts(tiny_cfg.vocab_size, seed=2)
  _, greedy = _run(policy, SamplingParams(max_new_tokens=12, temperature=0.0), tokens, mask)
  for p in (SamplingParams(max_new_tokens=12, top_k=1), SamplingParams(max_new_tokens=12, top_p=1e-6)):
    _, out = _run(policy, p, tokens, mask)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(greedy.tokens))
    np.testing.assert_allclose(np.asarray(out.sample_logprobs), 0.0, atol=1e-6)


def test_inverse_cdf_sampling_has_the_softmax_frequencies():
  logits = jnp.array([2.0, 0.5, -1.0, 1.0, 0.0, -np.inf, 1.5, -3.0])
  n = 40_000
  keys = row_keys(jax.random.key(0), jnp.arange(n))
  u = row_uniforms(keys, 4)[:, 3]
  tok, lp, slp = sample(jnp.tile(logits, (n, 1)), u, SamplingParams(max_new_tokens=1))
  freq = np.bincount(np.asarray(tok), minlength=8) / n
  p = np.asarray(jax.nn.softmax(logits))
  sigma = np.sqrt(p * (1 - p) / n)
  assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-12), (freq, p)
  assert freq[5] == 0  # a token of probability zero is never drawn
  np.testing.assert_allclose(np.asarray(lp), np.log(p[np.asarray(tok)]), atol=1e-5)
  np.testing.assert_array_equal(np.asarray(lp), np.asarray(slp))


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_eos_ends_rows_and_the_loop(policy, tiny_cfg):
  tokens, mask = _prompts(tiny_cfg.vocab_size, seed=3)
  n = 30
  _, free = _run(policy, SamplingParams(max_new_tokens=n, decode_chunk=8), tokens, mask, key=5)
  free_toks = np.asarray(free.tokens)
  eos = int(free_toks[0, 3])  # a token row 0 samples at step 3 when nothing stops it
  _, out = _run(policy, SamplingParams(max_new_tokens=n, eos_ids=(eos,), pad_id=0, decode_chunk=8),
                tokens, mask, key=5)
  toks, m, lengths = np.asarray(out.tokens), np.asarray(out.mask), np.asarray(out.lengths)
  for r in range(toks.shape[0]):
    hits = np.flatnonzero(free_toks[r] == eos)
    want = hits[0] + 1 if hits.size else n  # EOS itself is part of the response
    assert lengths[r] == want
    np.testing.assert_array_equal(toks[r, :want], free_toks[r, :want])
    assert m[r, :want].all() and not m[r, want:].any()
    assert (toks[r, want:] == 0).all() and (np.asarray(out.logprobs)[r, want:] == 0).all()
  assert int(out.steps) == lengths.max()
  # Every row ends at its first token: the loop runs no further step.
  _, first = _run(policy, SamplingParams(max_new_tokens=n, eos_ids=tuple(range(tiny_cfg.vocab_size))),
                  tokens, mask)
  assert int(first.steps) == 1 and (np.asarray(first.lengths) == 1).all()


def test_same_shapes_never_retrace_and_cache_is_reused(policy, tiny_cfg):
  graphdef, state = nnx.split(policy)
  sampler = Sampler(graphdef, SamplingParams(max_new_tokens=8), policy.mesh)
  tokens, mask = _prompts(tiny_cfg.vocab_size)
  for i in range(3):
    sampler(state, tokens, mask, jax.random.key(i), row_ids=np.arange(6) + 6 * i)
  assert sampler.traces == 1
  out = generate(sampler, state, np.concatenate([tokens, tokens]), np.concatenate([mask, mask]),
                 jax.random.key(0), generation_batch=6)
  assert sampler.traces == 1 and out.tokens.shape == (12, 8)
  sampler(state, tokens[:, 1:], mask[:, 1:], jax.random.key(0))  # a new prompt length compiles once
  assert sampler.traces == 2


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_generation_batch_does_not_change_the_samples(policy, tiny_cfg):
  tokens, mask = _prompts(tiny_cfg.vocab_size, b=10, seed=4)
  params = SamplingParams(max_new_tokens=10, decode_chunk=4)
  _, whole = _run(policy, params, tokens, mask, key=7)
  sampler, parts = _run(policy, params, tokens, mask, key=7, generation_batch=4)
  np.testing.assert_array_equal(np.asarray(parts.tokens), np.asarray(whole.tokens))
  np.testing.assert_array_equal(np.asarray(parts.mask), np.asarray(whole.mask))
  np.testing.assert_allclose(np.asarray(parts.logprobs), np.asarray(whole.logprobs), atol=1e-5)
  assert sampler.traces == 1  # 10 rows in calls of 4: the last call is padded, not recompiled


def test_one_token_budget(policy, tiny_cfg):
  tokens, mask = _prompts(tiny_cfg.vocab_size)
  _, out = _run(policy, SamplingParams(max_new_tokens=1, temperature=0.0), tokens, mask)
  logits = _recompute(policy, tokens, mask, out)
  np.testing.assert_array_equal(np.asarray(out.tokens), logits.argmax(-1))
  assert int(out.steps) == 1


@pytest.mark.parametrize("kw, field", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(max_new_tokens=4, temperature=-1), "temperature"),
    (dict(max_new_tokens=4, top_p=0.0), "top_p"), (dict(max_new_tokens=4, top_k=-2), "top_k"),
    (dict(max_new_tokens=4, decode_chunk=0), "decode_chunk"),
])
def test_bad_sampling_params_name_the_field(kw, field):
  with pytest.raises(ValueError, match=field):
    SamplingParams(**kw)


@pytest.fixture(scope="module")
def small_cfg():
  return models.ModelConfig(family="llama", vocab_size=64, d_model=32, num_layers=1, num_heads=2,
                            num_kv_heads=2, head_dim=16, mlp_dim=64)


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
@pytest.mark.parametrize("shape, batches", [((8, 1, 1), (None, 12, 6)), ((2, 2, 2), (6,))])
def test_rows_the_batch_shards_do_not_divide_are_padded(small_cfg, rules, shape, batches):
  # 12 rows on 8 batch shards, or calls of 6 rows on 8 or 4: each call is padded to a multiple
  # of the shards and trimmed, and every row samples what it does in a run that divides evenly.
  mesh = sharding.make_mesh(shape, jax.devices()[:8])
  graphdef, state = nnx.split(models.create_sharded(models.CausalLM, small_cfg, mesh, rules,
                                                    jax.random.key(0)))
  sampler = Sampler(graphdef, SamplingParams(max_new_tokens=6, decode_chunk=4), mesh, rules)
  tokens, mask = _prompts(small_cfg.vocab_size, b=16, seed=5)
  even = generate(sampler, state, tokens, mask, jax.random.key(3))
  for gb in batches:
    out = generate(sampler, state, tokens[:12], mask[:12], jax.random.key(3), generation_batch=gb)
    for f in ("tokens", "mask", "lengths"):
      np.testing.assert_array_equal(np.asarray(getattr(out, f)), np.asarray(getattr(even, f))[:12])
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(even.logprobs)[:12], atol=1e-5)
  assert sampler.traces == 2  # 16 rows (the even run, and 12 padded), then calls of 6 padded to 8
  with pytest.raises(ValueError, match="12 rows.*8 batch shards"):
    Sampler(graphdef, sampler.params, sharding.make_mesh((8, 1, 1), jax.devices()[:8]), rules)(
        state, tokens[:12], mask[:12], jax.random.key(3))


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
@pytest.mark.parametrize("shape, group, batches", [
    ((1, 1, 1), 4, (None, 8, 6)), ((8, 1, 1), 2, (None, 8)), ((2, 2, 2), 4, (None,))])
def test_a_group_prefilled_once_samples_what_each_row_does(small_cfg, rules, shape, group,
                                                           batches):
  # Runs of `group` copies of a prompt: prefilling one copy and repeating its cache gives every
  # row the sample it draws on its own, on one device and with the batch over 8 or 2 shards;
  # calls that do not hold whole groups (6 rows of groups of 4; padded calls) prefill each row.
  mesh = sharding.make_mesh(shape, jax.devices()[:math.prod(shape)])
  graphdef, state = nnx.split(models.create_sharded(models.CausalLM, small_cfg, mesh, rules,
                                                    jax.random.key(0)))
  sampler = Sampler(graphdef, SamplingParams(max_new_tokens=6, decode_chunk=4), mesh, rules)
  prompts, pmask = _prompts(small_cfg.vocab_size, b=16 // group, seed=6)
  tokens, mask = np.repeat(prompts, group, axis=0), np.repeat(pmask, group, axis=0)
  for gb in batches:
    each = generate(sampler, state, tokens, mask, jax.random.key(3), generation_batch=gb)
    shared = generate(sampler, state, tokens, mask, jax.random.key(3), generation_batch=gb,
                      group_size=group)
    for f in ("tokens", "mask", "lengths"):
      np.testing.assert_array_equal(np.asarray(getattr(shared, f)), np.asarray(getattr(each, f)))
    np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(each.logprobs), atol=1e-5)
  shared_calls = [g for (_, g) in sampler._calls]  # noqa: SLF001
  assert group in shared_calls


def test_rows_of_a_group_that_differ_are_an_error(policy, tiny_cfg):
  tokens, mask = _prompts(tiny_cfg.vocab_size, b=4)
  with pytest.raises(ValueError, match="group_size=2.*differ"):
    _run(policy, SamplingParams(max_new_tokens=2), tokens, mask, group_size=2)


def test_shared_prefill_needs_whole_groups_in_every_shard():
  from rlscale.sampling.decode import shared_prefill
  assert shared_prefill(8, rows=512, call_rows=512, shards=8) == 8  # 64 rows a shard
  assert shared_prefill(8, rows=64, call_rows=64, shards=16) == 1  # 4 rows a shard
  assert shared_prefill(4, rows=6, call_rows=6, shards=1) == 1  # a call of 1.5 groups
  assert shared_prefill(1, rows=8, call_rows=8, shards=1) == 1

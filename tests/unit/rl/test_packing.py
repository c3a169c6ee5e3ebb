"""The packing plan (rl/packing.py): every response input placed exactly once, rows that never
mix groups or cross a shard, the inverse index, the buckets and the compiled shapes they bound.
The packed update's numbers against the padded one: tests/unit/rl/test_shared_prompt_update.py
and tests/unit/models/test_packed_rows.py."""

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
from rlscale.rl.update import SequenceBatch, TrainState, UpdateOptions, make_update, policy_forward


def test_input_lengths_are_the_last_loss_token():
  mask = jnp.asarray([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 0, 1, 0],
                      [1, 1, 1, 1, 1]], bool)
  assert packing.input_lengths(mask).tolist() == [2, 0, 0, 3, 4]


@pytest.mark.parametrize("shards,group,micro", [(1, 4, 16), (2, 4, 16), (4, 2, 32), (2, 8, 32)])
def test_every_input_is_placed_once_on_rows_of_its_own_group_and_shard(shards, group, micro):
  rng = np.random.default_rng(shards * 100 + group)
  rows, width, epochs, minibatches = 64, 9, 2, 2
  lengths = np.minimum(rng.geometric(0.25, rows) - 1, width)
  perms = np.stack([rng.permutation(rows // group)[:, None] * group + np.arange(group)
                    for _ in range(epochs)]).reshape(epochs, rows)
  packer = packing.Packer(num_epochs=epochs, num_minibatches=minibatches, microbatch=micro,
                          shards=shards, group=group)
  p = packer.plan(lengths, perms, width)
  assert p is not None
  b_s, r = micro // shards, p.src.shape[-2]
  assert r in packer.buckets() and r < b_s
  lens = lengths[perms].reshape(epochs, minibatches, -1, shards, b_s)
  for idx in np.ndindex(*p.src.shape[:4]):
    src, back, row_group, n = p.src[idx], p.unpack[idx], p.row_group[idx], lens[idx]
    assert sorted(src[src >= 0].tolist()) == sorted(
        row * width + j for row in range(b_s) for j in range(n[row]))  # each input once
    for row in range(b_s):  # the inverse: where each input went, and nothing else
      went = back[row]
      assert np.all(went[:n[row]] >= 0) and np.all(went[n[row]:] == -1)
      assert np.all(src.reshape(-1)[went[:n[row]]] == row * width + np.arange(n[row]))
      if n[row]:  # one contiguous segment, on a row of its own group
        k = went[0] // width
        assert np.all(went[:n[row]] // width == k) and np.all(np.diff(went[:n[row]]) == 1)
        assert row_group[k] == row // group


def test_buckets_and_the_padded_fallback():
  packer = packing.Packer(num_epochs=1, num_minibatches=1, microbatch=64, shards=1, group=8)
  assert packer.buckets() == [8, 16, 24, 32, 40, 48, 56]
  full = np.full(64, 7)
  assert packer.plan(full, np.arange(64)[None], 7) is None  # nothing to save: padded rows
  half = np.full(64, 3)  # two responses per row of 7
  assert packer.plan(half, np.arange(64)[None], 7).src.shape[-2] == 32
  with pytest.raises(ValueError, match="whole groups of 8 on each of 3 batch shards"):
    packing.Packer(num_epochs=1, num_minibatches=1, microbatch=64, shards=3, group=8)


@pytest.mark.slow(seconds=21)  # a compilation per bucket: in .ci/run, out of the quick run
def test_compiled_updates_are_bounded_by_the_buckets(tiny_cfg):
  """Twelve steps of random lengths: one compiled update per bucket met (and one padded), none
  when a bucket comes again."""
  update, steps = _packed_steps(tiny_cfg)
  seen = set()
  for step in range(12):
    steps(step)
    seen.add(update.packed_rows)
    assert update.traces == len(seen), (step, seen)
  assert None in seen and len(seen) >= 3


@pytest.mark.slow(seconds=20)  # 8 compilations: in .ci/run, out of the README's quick run
def test_compiled_ahead_every_bucket_is_compiled_at_the_first_update(tiny_cfg):
  """train.compile_buckets='ahead': the first update compiles every bucket's program and the
  padded one; the steps after it, whatever bucket they meet, compile nothing more."""
  update, steps = _packed_steps(tiny_cfg)
  update.compile_ahead = True
  every = len(update.packer.buckets()) + 1
  seen = set()
  for step in range(6):
    steps(step)
    seen.add(update.packed_rows)
    assert update.traces == every, (step, update.traces)
  assert None in seen and len(seen) >= 3
  assert packing.compile_ahead("auto", packing.AHEAD_FROM_STEPS)
  assert not packing.compile_ahead("auto", packing.AHEAD_FROM_STEPS - 1)
  assert packing.compile_ahead("ahead", 4) and not packing.compile_ahead("on_use", 10**6)


def _packed_steps(tiny_cfg):
  """A packed update of a one-layer model, and a function running its step `i` on rows of
  random lengths (every 4th step all full: the padded program)."""
  cfg = tiny_cfg.replace(num_layers=1)
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)))
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])
  loss = make_policy_loss(dict(clip_eps_low=0.2, clip_eps_high=0.2, kl_coef=0.0,
                               kl_estimator="k3", entropy_coef=0.0, dual_clip=0.0))
  update = make_update(policy_forward(graphdef), optax.sgd(0.1), loss,
                       UpdateOptions(num_minibatches=1, num_epochs=1, microbatch=8,
                       aggregation="token-mean", max_len=8, group_size=4, shared_prompt=4,
                       pack=True), mesh=mesh, rules=sharding.rules_from_config(None))
  held = [update.place(TrainState(params, optax.sgd(0.1).init(params), jnp.zeros((), jnp.int32)))]
  rng = np.random.default_rng(0)

  def step(i):
    tokens = jnp.asarray(rng.integers(3, cfg.vocab_size, (16, 12)), jnp.int32)
    length = rng.integers(1, 9, 16) if i % 4 else np.full(16, 8)  # every 4th: all full
    resp = jnp.asarray(np.arange(8)[None] < length[:, None])
    mask = jnp.concatenate([jnp.ones((16, 4), bool), resp], axis=1)
    extras = {"advantages": jnp.asarray(rng.normal(size=16), jnp.float32),
              "old_logp": jnp.full((16, 8), -2.0), "ref_logp": jnp.full((16, 8), -2.0)}
    held[0], metrics = update(held[0], SequenceBatch(tokens, mask, resp, extras),
                              jax.random.key(i))
    assert np.isfinite(float(metrics["loss"]))

  return update, step


def test_inputs_after_the_last_loss_token_are_neutral_in_a_padded_step(tiny_cfg):
  """A step whose update runs padded while its reference log-probs were packed (0 after each
  row's last loss token; here +1000, whose k3 overflows): with packing on, those positions
  reach the loss as 0 and the loss stays finite; without the neutral inputs it would not."""
  from rlscale.rl.update import micro_grad_fn
  cfg = tiny_cfg.replace(num_layers=1)
  graphdef, params = nnx.split(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)))
  loss = make_policy_loss(dict(clip_eps_low=0.2, clip_eps_high=0.2, kl_coef=0.1,
                               kl_estimator="k3", entropy_coef=0.0, dual_clip=0.0))
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(3, cfg.vocab_size, (8, 12)), jnp.int32)
  resp = jnp.asarray(np.arange(8)[None] < rng.integers(1, 6, 8)[:, None])
  mask = jnp.concatenate([jnp.ones((8, 4), bool), resp], axis=1)
  done = np.asarray(packing.computed(resp))
  extras = {"advantages": jnp.asarray(rng.normal(size=8), jnp.float32),
            "old_logp": jnp.where(done, -2.0, 0.0), "ref_logp": jnp.where(done, -2.0, 1000.0)}
  w = resp.astype(jnp.float32) / jnp.sum(resp)
  xs = (SequenceBatch(tokens, mask, resp, extras), w, w, None)
  for pack, finite in ((True, True), (False, False)):
    (value, _), grads = jax.jit(micro_grad_fn(policy_forward(graphdef), loss, 1, pack))(
        params, xs, None)
    ok = np.isfinite(float(value)) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    assert ok == finite, pack


def test_the_neutral_positions_are_those_a_packed_forward_leaves_out():
  rng = np.random.default_rng(1)
  resp = np.arange(9)[None] < rng.integers(0, 10, 16)[:, None]
  packer = packing.Packer(num_epochs=1, num_minibatches=1, microbatch=16, shards=2, group=4)
  p = packer.plan(np.asarray(packing.input_lengths(jnp.asarray(resp))), np.arange(16)[None], 8)
  left_in = (p.unpack[0, 0, 0] >= 0).reshape(16, 8)  # [rows, n - 1] inputs computed
  want = np.concatenate([np.ones((16, 1), bool), left_in], axis=1)
  np.testing.assert_array_equal(np.asarray(packing.computed(jnp.asarray(resp))), want)

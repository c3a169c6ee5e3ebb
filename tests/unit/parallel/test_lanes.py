"""Runs side by side (rlscale/parallel/lanes.py): each lane computes what its run alone does.

On the CPU with a device per lane, a lane's decode runs the program of a run alone, so its
sampled tokens are identical; its update is compiled inside a mapped program, whose fusions
may order a reduction differently: within UPDATE_RTOL of the run alone.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rlscale import models
from rlscale.parallel import lanes as lanes_lib
from rlscale.parallel import sharding
from rlscale.rl.update import SequenceBatch, TrainState, UpdateOptions, make_update, policy_forward
from rlscale.sampling import Sampler, SamplingParams, generate

# A lane's parameter update against its run alone's, one SGD step (float32): the largest
# difference of an element over the update's largest element. The mapped program may sum in
# another order. SGD, not Adam: Adam's first step g / (|g| + eps) turns a last-bit difference
# of a gradient near eps into a visible one.
UPDATE_TOL = 1e-4
UPDATE_RTOL = 1e-5  # the loss


@pytest.fixture(scope="module")
def policy(tiny_cfg, mesh1, rules):
  return nnx.split(models.create_sharded(models.CausalLM, tiny_cfg, mesh1, rules,
                                         jax.random.key(0)))


def test_lane_devices_divide_the_lanes():
  assert lanes_lib.lane_devices(4, 8) == 4
  assert lanes_lib.lane_devices(10, 8) == 5  # two lanes on each of 5 devices
  assert lanes_lib.lane_devices(7, 2) == 1
  assert lanes_lib.lane_devices(6, 4) == 3


@pytest.mark.parametrize("n", [3, 16])  # a device per lane; two lanes per device (vmap)
def test_stack_take_and_map(n):
  lanes = lanes_lib.Lanes(n)
  trees = [{"a": np.full((2, 3), k, np.float32), "b": np.int32(k)} for k in range(n)]
  stacked = lanes.stack(trees)
  assert stacked["a"].shape == (n, 2, 3) and stacked["a"].sharding == lanes.sharding
  for k in (0, n - 1):
    mine = lanes.take(stacked, k)
    np.testing.assert_array_equal(np.asarray(mine["a"]), trees[k]["a"])
    assert mine["a"].devices() == {lanes.device_of(k)}
  shift = lanes.map(lambda x, s: {"a": x["a"] + s, "b": x["b"] * 2}, (True, False))
  out = lanes.host(shift(stacked, np.float32(0.5)))
  np.testing.assert_array_equal(out["a"][:, 0, 0], np.arange(n) + 0.5)
  np.testing.assert_array_equal(out["b"], np.arange(n) * 2)


def test_a_lanes_decode_samples_the_tokens_of_its_run_alone(policy, mesh1, rules):
  graphdef, params = policy
  lanes = lanes_lib.Lanes(3)
  p = SamplingParams(max_new_tokens=6, eos_ids=(1,), pad_id=0, decode_chunk=4)
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 128, (8, 5)).astype(np.int32)
  mask = np.ones((8, 5), bool)
  mask[1, :2] = False
  seeds = [3, 4, 5]
  solo = Sampler(graphdef, p, mesh1, rules)
  alone = [generate(solo, params, tokens, mask, jax.random.key(s), 4) for s in seeds]
  keys = lanes.map(lambda k: jax.random.wrap_key_data(k), (True,))(
      lanes.stack([jax.random.key_data(jax.random.key(s)) for s in seeds]))
  side = generate(Sampler(graphdef, p, mesh1, rules, lanes), lanes.broadcast(params), tokens,
                  mask, keys, 4)
  for k, a in enumerate(alone):
    np.testing.assert_array_equal(np.asarray(side.tokens)[k], np.asarray(a.tokens))
    np.testing.assert_array_equal(np.asarray(side.logprobs)[k], np.asarray(a.logprobs))
  assert not np.array_equal(np.asarray(side.tokens)[0], np.asarray(side.tokens)[1])


def test_a_lanes_update_is_its_run_alones(policy, mesh1, rules):
  """Two lanes at two learning rates (the update's argument) against each run alone."""
  graphdef, params = policy
  lanes = lanes_lib.Lanes(2)
  rng = np.random.default_rng(1)
  b, p, n = 8, 4, 5
  tokens = jnp.asarray(rng.integers(3, 128, (b, p + n)).astype(np.int32))
  mask = jnp.ones((b, p + n), bool)
  resp = jnp.asarray(rng.random((b, n)) < 0.9)
  extras = {"advantages": jnp.asarray(rng.normal(size=b).astype(np.float32)),
            "old_logp": jnp.asarray(-rng.random((b, n)).astype(np.float32))}
  batch = SequenceBatch(tokens, mask, resp, extras)

  def loss(inp, hyper=None):
    h = hyper or {"scale": 1.0}
    return -h["scale"] * inp.extras["advantages"][:, None] * inp.logp, {}
  loss.hyper = {"scale": 1.0}
  opt = lambda hyper: optax.sgd(hyper["lr"])
  options = UpdateOptions(microbatch=4, max_len=n)
  kw = dict(mesh=mesh1, rules=rules)
  solo = make_update(policy_forward(graphdef), opt, loss, options, **kw)
  hypers = [{"lr": 1.0, "scale": 1.0}, {"lr": 3.0, "scale": 0.5}]
  keys = [jax.random.key(7), jax.random.key(8)]
  alone = []
  for h, key in zip(hypers, keys):
    state = solo.place(TrainState(params, optax.sgd(h["lr"]).init(params),
                                  jnp.zeros((), jnp.int32)))
    new, metrics = solo(jax.tree.map(jnp.copy, state), batch, key, hyper=h)
    alone.append((new, metrics))
  side = make_update(policy_forward(graphdef), opt, loss, options, lanes=lanes, **kw)
  init = lambda q: TrainState(q, optax.sgd(0.0).init(q), jnp.zeros((), jnp.int32))
  state = lanes.map(init, (True,))(lanes.broadcast(params))
  stack = lambda t: lanes.stack([t, t])
  lane_keys = lanes.map(jax.random.wrap_key_data, (True,))(
      lanes.stack([jax.random.key_data(k) for k in keys]))
  new, metrics = side(state, SequenceBatch(*(stack(x) for x in batch[:3]), stack(extras)),
                      lane_keys, hyper=lanes.stack([{k: np.float32(v) for k, v in h.items()}
                                                    for h in hypers]))
  worst = 0.0
  for k, (a, m) in enumerate(alone):
    mine = lanes.take(new.params, k)
    for x, y, p0 in zip(jax.tree.leaves(mine), jax.tree.leaves(a.params),
                        jax.tree.leaves(params)):
      step = np.asarray(y) - np.asarray(p0)
      diff = np.max(np.abs(np.asarray(x) - np.asarray(y)))
      worst = max(worst, diff / max(np.max(np.abs(step)), 1e-30))
    np.testing.assert_allclose(np.asarray(metrics["loss"])[k], np.asarray(m["loss"]),
                               rtol=UPDATE_RTOL)
  assert worst < UPDATE_TOL, worst
  assert int(np.asarray(new.step)[1]) == 1 and side.traces == 1


def test_stacked_arrays_keep_one_layout_whatever_their_source(mesh1):
  lanes = lanes_lib.Lanes(2)
  host = lanes.stack([np.zeros(3, np.float32), np.ones(3, np.float32)])
  dev = lanes.stack([jnp.zeros(3), jax.device_put(jnp.ones(3), jax.devices()[5])])
  assert host.sharding == dev.sharding == lanes.sharding
  np.testing.assert_array_equal(np.asarray(host), np.asarray(dev))
  assert sharding.batch_divisor(mesh1) == 1

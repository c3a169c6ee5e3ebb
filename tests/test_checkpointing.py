"""Checkpointer: sharded round trip on the 8 simulated devices, latest step, keep limit, async saves."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlscale import sharding
from rlscale.checkpointing import Checkpointer


@pytest.fixture(scope="module")
def mesh():
  return sharding.make_mesh((2, 2, 2))  # data, fsdp, tensor over all 8 devices


def _state(mesh, scale=1.0):
  """A small pytree: a 2-D sharded matrix, a 1-D sharded vector, a replicated scalar and RNG data."""
  w = jnp.arange(32 * 8, dtype=jnp.float32).reshape(32, 8) * scale
  b = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32) * scale
  return {
      "w": jax.device_put(w, NamedSharding(mesh, P(("data", "fsdp"), "tensor"))),
      "b": jax.device_put(b, NamedSharding(mesh, P("tensor"))),
      "step": jax.device_put(jnp.int32(7 * scale), NamedSharding(mesh, P())),
      "rng": jax.device_put(jax.random.key_data(jax.random.key(3)), NamedSharding(mesh, P())),
  }


def _steps_on_disk(directory):
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def test_round_trip_keeps_values_shardings_and_meta(tmp_path, mesh):
  state = _state(mesh)
  ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  assert ckpt.latest_step() is None
  meta = {"step": 5, "data_position": 640, "ema": [0.5, 1.25], "note": "x"}
  ckpt.save(5, state, meta)
  ckpt.wait()
  like = jax.tree.map(jnp.zeros_like, state)  # same shapes, dtypes and shardings, other values
  got, got_meta = ckpt.restore(5, like)
  ckpt.close()
  assert got_meta == meta
  for k in state:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(state[k]))
    assert got[k].dtype == state[k].dtype
    assert got[k].sharding.is_equivalent_to(state[k].sharding, state[k].ndim), k


def test_restore_into_another_layout(tmp_path, mesh):
  """A restart on another mesh layout reads the same numbers (the checkpoint holds whole arrays)."""
  state = _state(mesh)
  ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  ckpt.save(1, state, {})
  replicated = NamedSharding(mesh, P())
  like = {k: jax.device_put(jnp.zeros_like(v), replicated) for k, v in state.items()}
  got, _ = ckpt.restore(1, like)
  ckpt.close()
  assert got["w"].sharding.is_equivalent_to(replicated, 2)
  np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(state["w"]))
  np.testing.assert_array_equal(np.asarray(got["b"]), np.asarray(state["b"]))


def test_latest_step_and_keep_limit(tmp_path, mesh):
  directory = str(tmp_path / "ckpt")
  ckpt = Checkpointer(directory, keep=2, async_save=False)
  for step in (2, 4, 6):
    ckpt.save(step, _state(mesh, scale=step), {"step": step})
  ckpt.close()
  assert _steps_on_disk(directory) == [4, 6]  # the oldest went when the third was saved
  reopened = Checkpointer(directory, keep=2)
  assert reopened.latest_step() == 6
  got, meta = reopened.restore(4, _state(mesh))
  reopened.close()
  assert meta == {"step": 4}
  np.testing.assert_array_equal(np.asarray(got["b"]), np.asarray(_state(mesh, scale=4)["b"]))


def test_async_save_is_complete_after_close(tmp_path, mesh):
  directory = str(tmp_path / "ckpt")
  ckpt = Checkpointer(directory, async_save=True)
  state = _state(mesh, scale=3.0)
  ckpt.save(3, state, {"step": 3})
  ckpt.close()  # returns only when the files are written and committed
  assert _steps_on_disk(directory) == [3]
  assert not [d for d in os.listdir(directory) if "tmp" in d]  # no half-written step left
  again = Checkpointer(directory)
  assert again.latest_step() == 3
  got, meta = again.restore(3, _state(mesh))
  again.close()
  assert meta == {"step": 3}
  np.testing.assert_array_equal(np.asarray(got["w"]), np.asarray(state["w"]))

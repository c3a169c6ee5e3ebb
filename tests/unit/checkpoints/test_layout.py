"""A checkpoint records the layout it was saved on; a restore onto another mesh (fewer or more
devices) reshards it through orbax, bit for bit, and says so (issue 47, class 2)."""

import logging as pylogging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlscale.checkpoints import checkpointer
from rlscale.checkpoints.checkpointer import Checkpointer
from rlscale.parallel import sharding


def _state(devices: int):
  mesh = sharding.make_mesh((-1, 1, 1), devices=jax.devices()[:devices])
  rows = NamedSharding(mesh, P("data"))
  w = jax.device_put(jnp.arange(16 * 3, dtype=jnp.float32).reshape(16, 3) / 7, rows)
  b = jax.device_put(jnp.linspace(-1, 1, 5, dtype=jnp.bfloat16), NamedSharding(mesh, P()))
  return {"w": w, "b": b}


@pytest.mark.parametrize("saved_on, restored_on", [(8, 4), (4, 8), (8, 8)])
def test_a_restore_onto_another_mesh_is_bit_for_bit_and_named(tmp_path, saved_on, restored_on,
                                                             caplog):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  ckpt.save(1, _state(saved_on), {"step": 1})
  ckpt.wait()
  saved = checkpointer.saved_layout(str(tmp_path / "ckpt"))
  assert saved == {"mesh": {"data": saved_on, "fsdp": 1, "tensor": 1}, "devices": 8,
                   "processes": 1}
  like = _state(restored_on)
  with caplog.at_level(pylogging.WARNING):
    state, meta = ckpt.restore(1, like)
  ckpt.close()
  assert meta == {"step": 1}  # the checkpoint's own records stay its own
  for k in like:
    assert state[k].sharding == like[k].sharding
    np.testing.assert_array_equal(np.asarray(state[k]).view(np.uint8),
                                  np.asarray(_state(saved_on)[k]).view(np.uint8))
  if saved_on == restored_on:
    assert ckpt.layout_change is None and "resharded" not in caplog.text
    return
  now = checkpointer.layout_of(like)
  assert ckpt.layout_change == (saved, now)
  assert (f"saved on mesh data={saved_on} fsdp=1 tensor=1 of 8 devices in 1 process and is "
          f"restored onto mesh data={restored_on} fsdp=1 tensor=1 of 8 devices in 1 process: "
          f"orbax resharded its arrays, each matching its checksum") in caplog.text


def test_the_layout_key_is_the_checkpoints_own(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  try:
    with pytest.raises(ValueError, match="'_layout' is reserved"):
      ckpt.save(1, _state(8), {checkpointer.LAYOUT: {}})
  finally:
    ckpt.close()


def test_a_step_saved_before_layouts_were_recorded_has_none(tmp_path):
  assert checkpointer.saved_layout(str(tmp_path / "missing")) is None
  (tmp_path / "ckpt" / "3").mkdir(parents=True)  # unreadable: skipped
  assert checkpointer.saved_layout(str(tmp_path / "ckpt")) is None

"""orbax_leak: a save of 16 arrays keeps ~8 KB of Python objects instead of ~27 KB (orbax's reads
of tensorstore's byte counters and of each array's directory spec, whose results tensorstore
never frees; what stays comes from its other calls, a few hundred bytes an array). Saves are
written and read back as before."""

import gc
import tracemalloc

import jax.numpy as jnp
import numpy as np
import pytest

from rlscale.checkpoints import orbax_leak
from rlscale.checkpoints.checkpointer import Checkpointer


def _state():
  return {f"w{i}": jnp.full((32, 8), float(i)) for i in range(16)}


def _held_per_save(directory, saves: int) -> float:
  state = _state()
  ckpt = Checkpointer(str(directory), keep=2)
  try:
    for step in range(1, 6):  # orbax's caches, the event loops' first allocations
      ckpt.save(step, state, {"step": step})
      ckpt.wait()
    gc.collect()
    tracemalloc.start()
    try:
      before = tracemalloc.get_traced_memory()[0]
      for step in range(6, 6 + saves):
        ckpt.save(step, state, {"step": step})
        ckpt.wait()
      gc.collect()
      return (tracemalloc.get_traced_memory()[0] - before) / saves
    finally:
      tracemalloc.stop()
  finally:
    ckpt.close()


@pytest.fixture
def unpatched():
  orbax_leak.undo()
  yield
  orbax_leak.apply()


def test_a_save_keeps_little_and_restores_the_same(tmp_path):
  assert orbax_leak.applied()  # importing the checkpointer applies it
  held = _held_per_save(tmp_path / "patched", 30)
  assert held < 13000, f"{held:.0f} bytes a save stay allocated"
  ckpt = Checkpointer(str(tmp_path / "patched"), keep=2)
  try:
    state, meta = ckpt.restore(ckpt.latest_step(), _state())
  finally:
    ckpt.close()
  assert meta["step"] == 35
  for i in range(16):
    np.testing.assert_array_equal(state[f"w{i}"], np.full((32, 8), float(i)))


def test_without_it_a_save_keeps_far_more(tmp_path, unpatched):
  """The reason it exists. When this fails, tensorstore freed what it returns and orbax_leak
  can go."""
  assert not orbax_leak.applied()
  held = _held_per_save(tmp_path / "original", 15)
  assert held > 20000, f"{held:.0f} bytes a save stay allocated"

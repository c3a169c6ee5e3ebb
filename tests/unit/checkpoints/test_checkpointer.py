"""Checkpointer: sharded round trip on the 8 simulated devices, latest step, keep limit, async
saves, and damaged checkpoints: a truncated or bit-flipped array file is found, the previous step
used."""

import json
import logging
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlscale.parallel import sharding
from rlscale.checkpoints.checkpointer import (CHECKSUMS, CheckpointDamaged, CheckpointMismatch,
                                              Checkpointer)



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


# --- damaged checkpoints: checksums, fallback to the previous intact step ---


def _data_state(mesh, seed):
  """A state whose `w` is big and random enough that orbax stores it in a data file of its own
  (small arrays sit inline in the b-tree nodes, which carry a CRC of their own)."""
  w = jax.random.normal(jax.random.key(seed), (256, 64), jnp.float32)
  return {
      "w": jax.device_put(w, NamedSharding(mesh, P(("data", "fsdp"), "tensor"))),
      "b": jax.device_put(jnp.full((16,), float(seed)), NamedSharding(mesh, P("tensor"))),
      "step": jax.device_put(jnp.int32(seed), NamedSharding(mesh, P())),
  }


def _saved(directory, mesh, steps=(1, 2)):
  ckpt = Checkpointer(directory, keep=len(steps), async_save=True)
  for step in steps:
    ckpt.save(step, _data_state(mesh, step), {"step": step})
  ckpt.close()


def _data_file(directory, step):
  """The largest file orbax wrote for the arrays of `step`: where w's chunks are.

  A step folder (orbax 0.12, OCDBT over zarr): meta/metadata (the JSON meta), state/_METADATA
  and state/_sharding (the tree), state/manifest.ocdbt and state/d/<hash> (the b-tree, CRC'd),
  and state/ocdbt.process_<p>/d/<hash>: the zstd-compressed chunks each process wrote, with no
  checksum of their own.
  """
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(directory, str(step), "state"))
           for f in fs]
  path = max(files, key=os.path.getsize)
  assert os.path.getsize(path) > 16_000, sorted((os.path.getsize(f), f) for f in files)
  return path


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _flip_bit(path):
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)[0]
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte ^ 0x10]))


def _assert_state(got, want):
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
    assert got[k].dtype == want[k].dtype


def _warnings(caplog):
  """Warnings of the code under test. asyncio's "exception was never retrieved" reports of
  TensorStore reads that an earlier test's failed restore left behind can land in any later
  test, whenever the garbage collector finds them: they are not this test's."""
  return [r.getMessage() for r in caplog.records
          if r.levelno >= logging.WARNING and r.name != "asyncio"]


def test_intact_checkpoint_round_trips_exactly(tmp_path, mesh, caplog):
  directory = str(tmp_path / "ckpt")
  _saved(directory, mesh)
  with open(os.path.join(directory, "2", "meta", "metadata")) as f:
    on_disk = json.load(f)[CHECKSUMS]  # the checksums travel inside the step's meta
  assert set(on_disk) == {"w", "b", "step"} and len(on_disk["w"]["sha256"]) == 8  # one a shard
  ckpt = Checkpointer(directory)
  with caplog.at_level(logging.WARNING):
    step, got, meta = ckpt.restore_latest(jax.tree.map(jnp.zeros_like, _data_state(mesh, 0)))
  ckpt.close()
  assert step == 2 and meta == {"step": 2}
  _assert_state(got, _data_state(mesh, 2))
  assert not _warnings(caplog)


def test_truncated_array_file_falls_back_to_the_previous_step(tmp_path, mesh, caplog):
  directory = str(tmp_path / "ckpt")
  _saved(directory, mesh)
  _truncate(_data_file(directory, 2))
  ckpt = Checkpointer(directory, keep=2, async_save=False)
  with caplog.at_level(logging.WARNING):
    step, got, meta = ckpt.restore_latest(_data_state(mesh, 0))
  assert step == 1 and meta == {"step": 1}
  _assert_state(got, _data_state(mesh, 1))
  [line] = _warnings(caplog)
  assert "step 2 is damaged: w: unreadable" in line and "trying step 1" in line, line
  assert "tensorstore_spec" not in line  # one line, not TensorStore's spec dumps
  # The damaged step is set aside with its files, so the resumed run can save step 2 again.
  assert ckpt.latest_step() == 1 and os.listdir(os.path.join(directory, "damaged"))
  ckpt.save(2, _data_state(mesh, 2), {"step": 2})
  assert ckpt.restore_latest(_data_state(mesh, 0))[0] == 2
  ckpt.close()


def test_flipped_bit_is_detected_and_falls_back(tmp_path, mesh, caplog):
  directory = str(tmp_path / "ckpt")
  _saved(directory, mesh)
  _flip_bit(_data_file(directory, 2))
  # Orbax alone reads the flipped bit without complaint: the defect the checksums are for.
  raw = ocp.CheckpointManager(directory)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _data_state(mesh, 0))
  silent = raw.restore(2, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
  raw.close()
  assert not np.array_equal(np.asarray(silent["state"]["w"]), np.asarray(_data_state(mesh, 2)["w"]))

  ckpt = Checkpointer(directory)
  with pytest.raises(CheckpointDamaged, match=r"step 2 is damaged: w: checksum mismatch") as e:
    ckpt.restore(2, _data_state(mesh, 0))
  assert (e.value.step, e.value.array) == (2, "w")
  with caplog.at_level(logging.WARNING):
    step, got, meta = ckpt.restore_latest(_data_state(mesh, 0))
  ckpt.close()
  assert step == 1 and meta == {"step": 1}
  _assert_state(got, _data_state(mesh, 1))
  [line] = _warnings(caplog)
  assert "step 2 is damaged: w: checksum mismatch in shard" in line, line


def test_every_step_damaged_gives_none(tmp_path, mesh, caplog):
  directory = str(tmp_path / "ckpt")
  _saved(directory, mesh)
  _flip_bit(_data_file(directory, 2))
  _truncate(_data_file(directory, 1))
  ckpt = Checkpointer(directory)
  with caplog.at_level(logging.WARNING):
    assert ckpt.restore_latest(_data_state(mesh, 0)) == (None, None, {})
  assert ckpt.latest_step() is None
  ckpt.close()
  lines = _warnings(caplog)
  assert len(lines) == 2, lines  # one line a damaged step
  assert "step 2 is damaged: w: checksum mismatch" in lines[0] and "trying step 1" in lines[0]
  assert "step 1 is damaged: w: unreadable" in lines[1] and "no older step" in lines[1]


def test_damaged_meta_falls_back(tmp_path, mesh, caplog):
  directory = str(tmp_path / "ckpt")
  _saved(directory, mesh)
  with open(os.path.join(directory, "2", "meta", "metadata"), "r+b") as f:
    f.truncate(10)
  ckpt = Checkpointer(directory)
  with caplog.at_level(logging.WARNING):
    assert ckpt.restore_latest(_data_state(mesh, 0))[0] == 1
  ckpt.close()
  [line] = _warnings(caplog)
  assert "step 2 is damaged: meta: unreadable" in line, line


def test_checkpoint_from_before_checksums_restores_with_a_warning(tmp_path, mesh, caplog):
  directory = str(tmp_path / "ckpt")
  old = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=True))
  state = _data_state(mesh, 4)
  old.save(4, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                      meta=ocp.args.JsonSave({"step": 4})))
  old.close()
  ckpt = Checkpointer(directory)
  with caplog.at_level(logging.WARNING):
    step, got, meta = ckpt.restore_latest(_data_state(mesh, 0))
  ckpt.close()
  assert step == 4 and meta == {"step": 4}
  _assert_state(got, state)
  [line] = _warnings(caplog)
  assert "step 4" in line and "no checksums" in line


def test_restore_into_other_arrays_is_an_error_not_damage(tmp_path, mesh):
  """A changed model asks for other shapes: a clear error, and no step is set aside."""
  directory = str(tmp_path / "ckpt")
  _saved(directory, mesh)
  like = {**_data_state(mesh, 0), "b": jnp.zeros((8,))}
  ckpt = Checkpointer(directory)
  with pytest.raises(CheckpointMismatch, match=r"step 2 .* shapes: b saved \[16\], asked \[8\]"):
    ckpt.restore_latest(like)
  with pytest.raises(CheckpointMismatch, match=r"not saved: extra"):
    ckpt.restore(2, {**_data_state(mesh, 0), "extra": jnp.zeros(())})
  assert ckpt.latest_step() == 2 and not os.path.exists(os.path.join(directory, "damaged"))
  ckpt.close()


def test_reserved_meta_key_is_refused(tmp_path, mesh):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  with pytest.raises(ValueError, match=CHECKSUMS):
    ckpt.save(1, _data_state(mesh, 1), {CHECKSUMS: 1})
  ckpt.close()


_INTERRUPTED_SAVE = """
import glob, os, sys, time
import jax, jax.numpy as jnp
from rlscale.checkpoints.checkpointer import Checkpointer
directory = sys.argv[1]
ckpt = Checkpointer(directory, async_save=True)
ckpt.save(1, {"w": jnp.ones((8, 8))}, {"step": 1})
ckpt.wait()
ckpt.save(2, {"w": jax.random.normal(jax.random.key(0), (2048, 2048))}, {"step": 2})
while not glob.glob(os.path.join(directory, "2.orbax-checkpoint-tmp*")):
  if os.path.exists(os.path.join(directory, "2")):
    sys.exit(3)  # finished before it could be interrupted
  time.sleep(0.0005)
os._exit(0)  # killed mid-save: no clean-up, no commit
"""


def test_interrupted_save_is_not_used(tmp_path, caplog):
  directory = str(tmp_path / "ckpt")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run([sys.executable, "-c", _INTERRUPTED_SAVE, directory], env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert [d for d in os.listdir(directory) if d.startswith("2.")]  # the half-written step 2
  ckpt = Checkpointer(directory)
  with caplog.at_level(logging.WARNING):
    step, got, meta = ckpt.restore_latest({"w": jnp.zeros((8, 8))})
  ckpt.close()
  assert step == 1 and meta == {"step": 1}
  np.testing.assert_array_equal(np.asarray(got["w"]), np.ones((8, 8)))
  assert not _warnings(caplog)


_TWO_PROCESS_WORKER = """
import faulthandler, json, logging, os, sys
faulthandler.dump_traceback_later(240, exit=True)  # a hang ends with the stacks, not silence
from rlscale.parallel import distributed
distributed.initialize()
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from rlscale.parallel import sharding
from rlscale.checkpoints.checkpointer import Checkpointer

directory, out = sys.argv[1], sys.argv[2]
mesh = sharding.make_mesh((2, 2, 2))  # 4 devices of each process
def state(step):
  w = jax.random.normal(jax.random.key(step), (256, 64), jnp.float32)
  return {"w": jax.device_put(w, NamedSharding(mesh, P(("data", "fsdp"), "tensor"))),
          "b": jax.device_put(jnp.full((16,), float(step)), NamedSharding(mesh, P()))}
lines = []
class Keep(logging.Handler):
  def emit(self, record):
    if record.levelno >= logging.WARNING and record.name != "asyncio":
      lines.append(record.getMessage())
logging.getLogger("absl").addHandler(Keep())

ckpt = Checkpointer(directory, keep=3, async_save=True)
for step in (1, 2, 3):
  ckpt.save(step, state(step), {"step": step})
ckpt.close()
multihost_utils.sync_global_devices("saved")
if jax.process_index() == 0:  # damage files only process 1 reads: the shards it wrote
  def data_file(step):
    d = os.path.join(directory, str(step), "state", "ocdbt.process_1", "d")
    return max((os.path.join(d, f) for f in os.listdir(d)), key=os.path.getsize)
  with open(data_file(3), "r+b") as f:
    f.truncate(os.path.getsize(data_file(3)) // 2)
  with open(data_file(2), "r+b") as f:
    f.seek(os.path.getsize(data_file(2)) // 2)
    byte = f.read(1)[0]
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte ^ 0x10]))
multihost_utils.sync_global_devices("damaged")
ckpt = Checkpointer(directory, keep=3)
step, got, meta = ckpt.restore_latest(state(0))
ckpt.close()
want = state(1)
same = all(np.array_equal(np.asarray(a.data), np.asarray(b.data))
           for k in want for a, b in zip(got[k].addressable_shards, want[k].addressable_shards))
json.dump({"step": step, "meta": meta, "same": same, "warnings": lines}, open(out, "w"))
"""


@pytest.mark.slow
def test_two_processes_agree_on_damage_only_one_of_them_reads(tmp_path):
  """Each process checks the shards it reads; a damaged shard of process 1 makes both fall back."""
  from tests.support.process_env import free_port, process_env
  port = free_port()
  directory = str(tmp_path / "ckpt")
  procs = []
  for pid in range(2):
    env = process_env(port, 2, pid)
    procs.append(subprocess.Popen(
        [sys.executable, "-c", _TWO_PROCESS_WORKER, directory, str(tmp_path / f"out{pid}.json")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  for p in procs:
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out.decode()[-3000:]
  results = [json.load(open(tmp_path / f"out{pid}.json")) for pid in range(2)]
  for r in results:
    assert r["step"] == 1 and r["meta"] == {"step": 1} and r["same"], r
    assert len(r["warnings"]) == 2, r["warnings"]
    assert "step 3 is damaged: w: unreadable" in r["warnings"][0], r["warnings"]
    # A flipped bit inside a zstd chunk is caught by our checksum or, when it breaks the
    # frame (it depends on the random data and so on the run), by the decoder: either way
    # both processes must name step 2 and fall back together.
    assert re.search(r"step 2 is damaged: w: (checksum mismatch|unreadable)",
                     r["warnings"][1]), r["warnings"]
    assert all("on process 1" in line for line in r["warnings"]), r["warnings"]
  with open(os.path.join(directory, "1", "meta", "metadata")) as f:
    assert len(json.load(f)[CHECKSUMS]["w"]["sha256"]) == 8  # both processes' shards

"""Device roles: the sampler and the trainer on one mesh, or on two disjoint meshes.

`mesh.roles="colocated"` (the default) samples and trains on every device with one mesh of
`mesh.shape`. `mesh.roles="split"` gives `mesh.sampler_devices` of the devices to the sampler
(a mesh of `mesh.sampler_shape`) and the rest to the trainer (a mesh of `mesh.shape`), as
verl's and OpenRLHF's disaggregated placements do. Every process keeps devices in both roles
(its last `sampler_devices / processes` local devices sample), so a process's rows never leave
it on their way from the sampler to the trainer.

After each update the policy's weights move to the sampler's mesh shard by shard, device to
device, never through one host: one process by `jax.device_put` onto the sampler's
shardings; several processes (where JAX reshards only within one set of devices) by each
process copying its sampler devices' shards from its own trainer devices, after an
all-gather among the trainer's devices for a shard that no local trainer device holds whole
(`put`). `WeightSync` does that and times it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlscale.parallel import sharding

ROLES = ("colocated", "split")


@dataclasses.dataclass(frozen=True)
class Meshes:
  trainer: Mesh
  sampler: Mesh  # the trainer's mesh when colocated

  @property
  def split(self) -> bool:
    return self.sampler is not self.trainer


def _role_errors(mesh_cfg, devices: int, processes: int) -> list[str]:
  """The errors of mesh.roles and mesh.sampler_devices (the shapes aside)."""
  roles = mesh_cfg["roles"]
  if roles not in ROLES:
    return [f"mesh.roles={roles!r}; known: {', '.join(ROLES)}"]
  if roles == "colocated":
    return []
  s = mesh_cfg["sampler_devices"]
  if isinstance(s, bool) or not isinstance(s, int) or not 0 < s < devices:
    return [f"mesh.sampler_devices={s!r}: mesh.roles='split' needs 1 to {devices - 1} of the "
            f"{devices} devices for the sampler (the trainer gets the rest)"]
  if s % processes:
    return [f"mesh.sampler_devices={s} must split over {processes} processes (each keeps "
            f"devices in both roles)"]
  return []


def role_devices(sampler_devices: int) -> tuple[list[jax.Device], list[jax.Device]]:
  """(trainer, sampler) devices: each process's last sampler_devices/processes local devices
  sample. Ordered by process, then device id, so that every process agrees."""
  per = sampler_devices // jax.process_count()
  trainer, sampler = [], []
  for p in range(jax.process_count()):
    mine = sorted((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id)
    trainer += mine[:len(mine) - per]
    sampler += mine[len(mine) - per:]
  return trainer, sampler


def make_meshes(mesh_cfg, errors: list[str] | None = None,
                devices: list[jax.Device] | None = None) -> Meshes | None:
  """The trainer's and the sampler's meshes of the config's mesh section: a ValueError naming
  each bad field, or, given a list of `errors`, those appended and None. `devices`: the run's
  own (one lane of runs side by side), colocated; None: every device."""
  count = jax.device_count() if devices is None else len(devices)
  bad = _role_errors(mesh_cfg, count, jax.process_count())
  meshes = []
  if not bad:
    split = mesh_cfg["roles"] == "split"
    parts = (zip(("mesh.shape", "mesh.sampler_shape"), (mesh_cfg.shape, mesh_cfg.sampler_shape),
                 role_devices(mesh_cfg.sampler_devices)) if split
             else [("mesh.shape", mesh_cfg.shape, devices or jax.devices())])
    for field, shape, devices in parts:
      try:
        meshes.append(sharding.make_mesh(shape, devices, field))
      except ValueError as e:
        bad.append(str(e))
  if bad and errors is None:
    raise ValueError("; ".join(bad))
  if bad:
    errors += bad
    return None
  return Meshes(meshes[0], meshes[-1])


@jax.jit
def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


class WeightSync:
  """The sampler's copy of the policy's weights.

  Split: the weights resharded onto the sampler's mesh (`seconds` times the copy, after the
  update it waits for). Colocated: the trainer's own arrays, or, when the sampler must keep
  an older version while the trainer updates (`keep_copy`, overlapped generation), a copy on
  the same devices, since the update donates the arrays it replaces.
  """

  def __init__(self, meshes: Meshes, rules: sharding.Rules, keep_copy: bool):
    self.meshes, self.rules, self.keep_copy = meshes, rules, keep_copy
    self._shardings = None
    self.seconds: float | None = None  # the last split sync's time

  def __call__(self, params):
    if not self.meshes.split:
      return _copy(params) if self.keep_copy else params
    if self._shardings is None:
      self._shardings = sharding.state_shardings(params, self.meshes.sampler, self.rules)
    jax.block_until_ready(params)  # the update first: the sync's own time is the copy
    t = time.time()
    out = jax.block_until_ready(jax.tree.map(put, params, self._shardings))
    self.seconds = time.time() - t
    return out


def to_mesh(arrays: Sequence[jax.Array], mesh: Mesh, rules: sharding.Rules) -> list[jax.Array]:
  """Batch-sharded arrays (a rollout's rows) resharded onto `mesh`'s batch axes."""
  return [put(a, sharding.batch_sharding(mesh, a.ndim, rules)) for a in arrays]


def put(x: jax.Array, target: NamedSharding) -> jax.Array:
  """`x` resharded onto `target`, whose devices may be others than x's."""
  if jax.process_count() == 1 or x.sharding.device_set == target.device_set:
    return jax.device_put(x, target)
  return put_by_process(x, target)


def put_by_process(x: jax.Array, target: NamedSharding) -> jax.Array:
  """`put` as each process does it on several: its target shards from its own shards."""
  wanted = target.addressable_devices_indices_map(x.shape)
  if not all(_holder(x, idx) for idx in wanted.values()):
    x = jax.device_put(x, NamedSharding(x.sharding.mesh, P()))  # all-gather among x's devices
  pieces = []
  for device, idx in wanted.items():
    shard, rel = _holder(x, idx)
    pieces.append(jax.device_put(shard.data[rel], device))
  return jax.make_array_from_single_device_arrays(x.shape, target, pieces)


def _bounds(idx, shape) -> list[tuple[int, int]]:
  return [s.indices(n)[:2] for s, n in zip(idx, shape)]


def _holder(x: jax.Array, idx):
  """(a local shard of x that holds the region `idx` whole, the region within it) or None."""
  want = _bounds(idx, x.shape)
  for shard in x.addressable_shards:
    have = _bounds(shard.index, x.shape)
    if all(h0 <= w0 and w1 <= h1 for (w0, w1), (h0, h1) in zip(want, have)):
      return shard, tuple(slice(w0 - h0, w1 - h0) for (w0, w1), (h0, _) in zip(want, have))
  return None

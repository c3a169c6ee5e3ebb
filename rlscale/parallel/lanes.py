"""Runs side by side: S runs of one shape in one process, each on a lane of a device mesh.

Runs that differ only in their seed and in numbers the compiled programs take as arguments
(the learning rate, the clip, the loss coefficients) have the same programs. Stacked, they
share them: every array of a run (parameters, optimizer state, random keys, its batch) gets a
leading *lane* axis of size S, laid over a one-axis mesh of devices named "lane", and each
compiled step runs, on each device, the function a run alone would run (`jax.shard_map`). With
fewer devices than lanes, a device holds several lanes and maps the function over them
(`jax.vmap`); with one lane per device each device computes exactly what the run alone would.
On the CPU, a process made with `--xla_force_host_platform_device_count` >= S
(rlscale/run/main.py sets it for `--seeds`) has a device per lane, and the lanes share its
cores as separate processes would, but start, load and compile once.

A lane's device holds its run's whole model: runs whose own mesh spans several devices are
not stacked (the trainer refuses them in one line).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXIS = "lane"


def lane_devices(n: int, available: int) -> int:
  """How many devices `n` lanes use out of `available`: the largest divisor of n that fits
  (every device holds the same number of lanes)."""
  return max(d for d in range(1, min(n, available) + 1) if n % d == 0)


class Lanes:
  """S lanes over this process's devices (the first lane_devices(S, count) of them)."""

  def __init__(self, n: int, devices: Sequence[jax.Device] | None = None):
    if n < 1:
      raise ValueError(f"lanes: {n} lanes")
    devices = list(jax.local_devices() if devices is None else devices)
    used = lane_devices(n, len(devices))
    self.n = n
    self.mesh = Mesh(np.asarray(devices[:used], dtype=object), (AXIS,))
    self.per_device = n // used
    self.sharding = NamedSharding(self.mesh, P(AXIS))  # the lane axis over the devices
    self.shared = NamedSharding(self.mesh, P())  # the same array on every lane's device

  def __len__(self) -> int:
    return self.n

  @property
  def devices(self) -> list[jax.Device]:
    return list(self.mesh.devices.flat)

  def device_of(self, k: int) -> jax.Device:
    return self.devices[k // self.per_device]

  def describe(self) -> str:
    return (f"{self.n} lanes on {len(self.devices)} {self.devices[0].platform} devices"
            + (f", {self.per_device} per device (vmap)" if self.per_device > 1 else ""))

  # --- functions ---

  def map(self, fn: Callable, lane_args: Sequence[bool], donate: Sequence[int] = (),
          name: str | None = None):
    """jit(fn mapped over the lanes): argument i carries the lane axis when lane_args[i]
    (each lane's own value), else it is one value every lane reads (shared). Every output
    carries the lane axis. `fn` is a run's own function, as it runs alone."""
    lane_args = tuple(bool(a) for a in lane_args)
    in_specs = tuple(P(AXIS) if a else P() for a in lane_args)
    per = self.per_device

    def local(*args):
      if per == 1:  # one lane here: the run's own function on its own arrays
        mine = [jax.tree.map(lambda x: x[0], a) if lane else a
                for a, lane in zip(args, lane_args)]
        return jax.tree.map(lambda x: x[None], fn(*mine))
      return jax.vmap(fn, in_axes=tuple(0 if a else None for a in lane_args))(*args)

    local.__name__ = name or getattr(fn, "__name__", "lanes")
    mapped = jax.shard_map(local, mesh=self.mesh, in_specs=in_specs, out_specs=P(AXIS),
                           check_vma=False)
    return jax.jit(mapped, donate_argnums=tuple(donate),
                   in_shardings=tuple(self.sharding if a else self.shared for a in lane_args),
                   out_shardings=self.sharding)

  # --- arrays ---

  def stack(self, trees: Sequence[Any]) -> Any:
    """S trees of one structure (host or device arrays, one per lane) as one tree of
    lane-stacked arrays on the lanes' devices."""
    if len(trees) != self.n:
      raise ValueError(f"lanes.stack: {len(trees)} trees for {self.n} lanes")
    leaves = [jax.tree.leaves(t) for t in trees]
    treedef = jax.tree.structure(trees[0])
    out = [self._stack_leaf([ls[i] for ls in leaves]) for i in range(len(leaves[0]))]
    return jax.tree.unflatten(treedef, out)

  def _stack_leaf(self, values: list) -> jax.Array:
    per = self.per_device
    parts = []
    for d, device in enumerate(self.devices):
      mine = values[d * per:(d + 1) * per]
      if all(isinstance(v, jax.Array) for v in mine):
        block = jnp.stack([jax.device_put(v, device) for v in mine])
      else:
        block = np.stack([np.asarray(v) for v in mine])
      parts.append(jax.device_put(block, device))
    first = parts[0]
    return jax.make_array_from_single_device_arrays((self.n,) + tuple(first.shape[1:]),
                                                    self.sharding, parts)

  def broadcast(self, tree: Any) -> Any:
    """One tree (every lane starts from the same values) stacked S times."""
    return self.stack([tree] * self.n)

  def replicate(self, tree: Any) -> Any:
    """A tree every lane reads, on every lane's device."""
    return jax.device_put(tree, self.shared)

  def take(self, tree: Any, k: int) -> Any:
    """Lane k's arrays, as its run alone would hold them (on its lane's device)."""
    return jax.tree.map(functools.partial(self._take_leaf, k=k), tree)

  def _take_leaf(self, x, k: int):
    if not isinstance(x, jax.Array):
      return np.asarray(x)[k]
    start = (k // self.per_device) * self.per_device
    for shard in x.addressable_shards:
      if (shard.index[0].start or 0) == start:
        return shard.data[k - start]
    raise ValueError(f"lanes.take: lane {k} is not on this process")

  def host(self, tree: Any) -> Any:
    """The lane-stacked tree as numpy arrays [S, ...] (one fetch per array)."""
    return jax.tree.map(np.asarray, jax.device_get(tree))

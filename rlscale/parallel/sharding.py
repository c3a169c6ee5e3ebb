"""Device mesh, logical axis rules and the shardings derived from them.

Modules name only logical axes (`embed`, `mlp`, `kv_heads`, `vocab`, `batch`, ...). A rule table
from the config maps each logical axis to zero or more mesh axes (`data`, `fsdp`, `tensor`).
A logical axis whose size does not divide by its mesh axes is replicated instead, so one rule
table serves every model size (e.g. 2 KV heads on a tensor axis of 4).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# FSDP over `fsdp`, tensor parallelism over `tensor`, data parallelism over `data`.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("qkv", None),
    ("q_per_kv", None),
    ("norm", None),
    # activations
    ("batch", BATCH_AXES),
    ("seq", None),
    ("act_embed", None),
    ("act_mlp", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_vocab", "tensor"),
    ("cache_len", None),
)

Rules = Mapping[str, Any]


def resolve_shape(shape: Any, devices: int, field: str = "mesh.shape") -> tuple[int, ...]:
  """(data, fsdp, tensor) sizes over `devices` devices; the one -1 takes the remaining devices.

  The only place a -1 is resolved: the mesh, the config check and the batch plan call it.
  A shape that cannot be is a ValueError naming `field`.
  """
  try:
    s = [int(x) for x in shape]
  except (TypeError, ValueError):
    raise ValueError(f"{field}={shape!r} must be {len(MESH_AXES)} integer sizes {MESH_AXES}")
  if len(s) != len(MESH_AXES) or s.count(-1) > 1 or any(x == 0 or x < -1 for x in s):
    raise ValueError(f"{field}={tuple(s)} must be {len(MESH_AXES)} positive sizes "
                     f"(data, fsdp, tensor), at most one -1")
  known = math.prod(x for x in s if x != -1)
  if -1 in s and devices % known:
    raise ValueError(f"{field}={tuple(s)} does not fit {devices} devices: the sizes besides -1 "
                     f"multiply to {known}, which does not divide them")
  if -1 not in s and known != devices:
    raise ValueError(f"{field}={tuple(s)} does not fit {devices} devices: it needs {known}")
  if -1 in s:
    s[s.index(-1)] = devices // known
  return tuple(s)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None,
              field: str = "mesh.shape") -> Mesh:
  """A (data, fsdp, tensor) mesh; one entry may be -1 and takes the remaining devices (a
  ValueError naming `field` when the shape cannot be)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = resolve_shape(shape, len(devices), field)
  types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  try:
    return jax.make_mesh(tuple(shape), MESH_AXES, devices=devices, axis_types=types)
  except ValueError:  # a subset of the devices (mesh.roles='split') that the topology-aware
    # layout cannot place, e.g. part of a TPU slice: the devices in the order given
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES, axis_types=types)


def rules_from_config(rules: Iterable[Sequence[Any]] | None) -> dict[str, Any]:
  """Rule table as a dict; a config lists pairs (logical, mesh axis | tuple of axes | None)."""
  out = dict(DEFAULT_RULES)
  for pair in rules or ():
    logical, axes = pair
    if isinstance(axes, list):
      axes = tuple(axes)
    for a in (axes if isinstance(axes, tuple) else (axes,)):
      if a is not None and a not in MESH_AXES:
        raise ValueError(f"sharding rule {logical!r} -> {axes!r}: {a!r} is not a mesh axis {MESH_AXES}")
    out[logical] = axes
  return out


def _mesh_axes(rule: Any) -> tuple[str, ...]:
  if rule is None:
    return ()
  return tuple(rule) if isinstance(rule, (tuple, list)) else (rule,)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int] | None, mesh: Mesh,
                    rules: Rules) -> P:
  """PartitionSpec for an array with logical axes; non-divisible or reused axes replicate."""
  used: set[str] = set()
  spec = []
  for i, name in enumerate(logical):
    axes = tuple(a for a in _mesh_axes(rules.get(name)) if a not in used and mesh.shape[a] > 1)
    size = math.prod(mesh.shape[a] for a in axes)
    if not axes or (shape is not None and shape[i] % size):
      spec.append(None)
      continue
    used.update(axes)
    spec.append(axes if len(axes) > 1 else axes[0])
  return P(*spec)


def named_sharding(logical: Sequence[str | None], shape: Sequence[int] | None, mesh: Mesh,
                   rules: Rules) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(logical, shape, mesh, rules))


def state_shardings(abstract_state: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings for an nnx State whose Variables carry `axes` metadata."""

  def one(v):
    if isinstance(v, nnx.Variable):
      value = v.get_value()
      axes = v.get_metadata().get("axes")
      if axes is None:
        axes = (None,) * len(value.shape)
      if len(axes) != len(value.shape):
        raise ValueError(f"logical axes {axes} do not match shape {value.shape}")
      return v.replace(named_sharding(axes, value.shape, mesh, rules))
    return NamedSharding(mesh, P())

  return jax.tree.map(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, ndim: int, rules: Rules | None = None) -> NamedSharding:
  """Leading axis over the batch mesh axes, the rest replicated."""
  rules = rules or dict(DEFAULT_RULES)
  return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), None, mesh, rules))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_divisor(mesh: Mesh, rules: Rules | None = None) -> int:
  """How many shards the batch axis is split into."""
  rules = rules or dict(DEFAULT_RULES)
  return math.prod(mesh.shape[a] for a in _mesh_axes(rules.get("batch")))


# --- activation constraints, active while a function is traced under `activation_sharding` ---

_CONTEXT: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar(
    "rlscale_sharding", default=None)


@contextlib.contextmanager
def activation_sharding(mesh: Mesh | None, rules: Rules | None = None):
  """Within this block `constrain` pins activations to the mesh; outside it is a no-op."""
  token = _CONTEXT.set(None if mesh is None else (mesh, rules or dict(DEFAULT_RULES)))
  try:
    yield
  finally:
    _CONTEXT.reset(token)


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
  ctx = _CONTEXT.get()
  if ctx is None or ctx[0].size == 1:  # one device: nothing to place (and, inside runs side
    return x                           # by side, a lane's own mesh is not the program's)
  mesh, rules = ctx
  return jax.lax.with_sharding_constraint(x, named_sharding(logical, x.shape, mesh, rules))


def put_global(x: np.ndarray, mesh: Mesh, dim: int = 0, rules: Rules | None = None) -> jax.Array:
  """Place a host array that every process holds whole (the same on each, e.g. a plan all of
  them computed) with axis `dim` over the batch axes: each device receives its slice only."""
  rules = rules or dict(DEFAULT_RULES)
  logical = (None,) * dim + ("batch",) + (None,) * (np.ndim(x) - dim - 1)
  sharding = NamedSharding(mesh, logical_to_spec(logical, None, mesh, rules))
  return jax.make_array_from_callback(np.shape(x), sharding, lambda index: x[index])


def put_batch(x: np.ndarray | jax.Array, mesh: Mesh, rules: Rules | None = None) -> jax.Array:
  """Place a host batch (this process's share) on the mesh, sharded over the batch axes."""
  sharding = batch_sharding(mesh, np.ndim(x), rules)
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return jax.device_put(x, sharding)  # already a global array
  return jax.make_array_from_process_local_data(sharding, np.asarray(x))

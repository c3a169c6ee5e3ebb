"""The index arrays of a packed response stream and the gathers that read them, one batch shard
at a time (rl/packing.py plans them; models/shared_prompt.py runs the packed forward).

Every gather is batched over the shard axis S with indices local to the shard, so a shard
reads only its own rows: no row crosses a batch shard.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Packing(NamedTuple):
  """One micro-batch's packing, per batch shard s (indices local to the shard).

  src [S, R, C]: the response input each packed slot holds, as row * (n - 1) + position in the
  shard's [rows, n - 1] inputs, -1 for an empty slot; unpack [S, rows, n - 1]: where each
  response input went, as packed row * C + slot, -1 when it was not computed; row_group [S, R]:
  each packed row's group within the shard.
  """
  src: jax.Array
  unpack: jax.Array
  row_group: jax.Array


def pack(x_bxS, src_SxRxC) -> jax.Array:
  """[b, n - 1, ...] per-row response inputs -> [S * R, C, ...] packed (0 in empty slots)."""
  s, r, c = src_SxRxC.shape
  x = x_bxS.reshape((s, -1) + x_bxS.shape[2:])  # [S, rows * (n - 1), ...] per shard
  idx = src_SxRxC.reshape(s, r * c)
  out = jax.vmap(lambda a, i: jnp.take(a, jnp.maximum(i, 0), axis=0))(x, idx)
  keep = (idx >= 0).reshape(idx.shape + (1,) * (x.ndim - 2))
  return jnp.where(keep, out, jnp.zeros((), out.dtype)).reshape((s * r, c) + x.shape[2:])


def unpack(x_RxC, unpack_Sxbxn) -> jax.Array:
  """[S * R, C] packed -> [b, n - 1] per row, 0 where nothing was computed."""
  s, rows, n = unpack_Sxbxn.shape
  x = x_RxC.reshape(s, -1)
  idx = unpack_Sxbxn.reshape(s, rows * n)
  out = jax.vmap(lambda a, i: jnp.take(a, jnp.maximum(i, 0), axis=0))(x, idx)
  return jnp.where(idx >= 0, out, jnp.zeros((), out.dtype)).reshape(s * rows, n)


def groups(x_gx, row_group_SxR) -> jax.Array:
  """Each packed row's group's entry of a per-group array [g, ...] -> [S * R, ...]."""
  s, r = row_group_SxR.shape
  x = x_gx.reshape((s, -1) + x_gx.shape[1:])
  out = jax.vmap(lambda a, i: jnp.take(a, i, axis=0))(x, row_group_SxR)
  return out.reshape((s * r,) + x_gx.shape[1:])

"""The decode KV cache: a prompt segment plus fixed-size chunks for generated tokens.

Layout, per layer: keys transposed `[B, KV, D, T]` and values `[B, KV, T, D]`, so that both
attention products contract over a leading axis of the cache block and write the result with
`T` or `D` minor. Generated tokens go into chunks of `chunk` slots; the decode loop for chunk j
is a separate `while_loop` that attends over the prompt and chunks 0..j only, so attention reads
the part of the cache that is filled (rounded up to a chunk), not its full length. Every write
is a `dynamic_update_slice` at a scalar offset on a loop-carried buffer, which XLA performs in
place. All rows share the slot index: prompts are left-padded, so a slot is the same step for
every row; each row's rotary position is tracked separately.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlscale.models.layers import NEG_INF, c


class Segment(NamedTuple):
  k_BxKxDxT: jax.Array
  v_BxKxTxD: jax.Array


def prompt_segment(k_BxPxKxD: jax.Array, v_BxPxKxD: jax.Array) -> Segment:
  """The prompt's keys and values from the prefill, in cache layout."""
  return Segment(c(k_BxPxKxD.transpose(0, 2, 3, 1), "act_kv_heads", None, None),
                 c(v_BxPxKxD.transpose(0, 2, 1, 3), "act_kv_heads", None, None))


def empty_chunk(batch: int, kv_heads: int, head_dim: int, chunk: int, dtype) -> Segment:
  k = jnp.zeros((batch, kv_heads, head_dim, chunk), dtype)
  v = jnp.zeros((batch, kv_heads, chunk, head_dim), dtype)
  return Segment(c(k, "act_kv_heads", None, None), c(v, "act_kv_heads", None, None))


# decode_chunk='auto': rows per device from which short chunks pay. Measured on a 2-core CPU,
# the Qwen3-shaped 4-layer d=256 model, prompt 32 + 64 new, generated tokens/s of 16-slot
# chunks against 64-slot ones: -3% at 64 rows, +14% at 128, +2% at 256, +12% at 512 (8 and
# 32 slots at 512 rows: -4%, -3%); docs/performance.md.
SHORT_CHUNK_ROWS, SHORT_CHUNK, LONG_CHUNK = 128, 16, 64


def chunk_size(slots: int, decode_chunk: int | str, rows_per_device: int = 1) -> int:
  """Slots per chunk: `decode_chunk`, or `slots` rounded up to 16 when that is smaller.

  'auto': 16 from SHORT_CHUNK_ROWS rows per device, 64 below. A step attends to every slot of
  the chunks written so far, so short chunks attend to fewer empty slots; each chunk is a loop
  of its own, whose fixed cost a small batch does not hide. Matmul kernels favour multiples of
  16; a chunk one slot short of a power of two can cost twice as much as the full one.
  """
  if decode_chunk == "auto":
    decode_chunk = SHORT_CHUNK if rows_per_device >= SHORT_CHUNK_ROWS else LONG_CHUNK
  return max(1, min(decode_chunk, -(-slots // 16) * 16))


def num_chunks(slots: int, chunk: int) -> int:
  return max(1, math.ceil(slots / chunk))


def clear(seg: Segment) -> Segment:
  """Zeros in place of a reused (donated) chunk: stale slots are masked, but must be finite."""
  return Segment(jnp.zeros_like(seg.k_BxKxDxT), jnp.zeros_like(seg.v_BxKxTxD))


def write(seg: Segment, offset: jax.Array, k_BxKxD: jax.Array, v_BxKxD: jax.Array) -> Segment:
  """Store one token's key and value at slot `offset` of a chunk."""
  zero = jnp.zeros((), jnp.int32)
  k = jax.lax.dynamic_update_slice(seg.k_BxKxDxT, k_BxKxD[..., None].astype(seg.k_BxKxDxT.dtype),
                                   (zero, zero, zero, offset))
  v = jax.lax.dynamic_update_slice(seg.v_BxKxTxD, v_BxKxD[:, :, None].astype(seg.v_BxKxTxD.dtype),
                                   (zero, zero, offset, zero))
  return Segment(k, v)


def attend(q_BxKxGxD: jax.Array, segments: list[Segment], valid: list[jax.Array]) -> jax.Array:
  """Softmax attention of one query per row over the segments' valid slots -> [B, KV, G, D].

  `valid[i]` is a bool mask broadcastable to [B, T_i] for segment i.
  """
  q = q_BxKxGxD * jnp.asarray(1.0 / math.sqrt(q_BxKxGxD.shape[-1]), q_BxKxGxD.dtype)
  scores = []
  for seg, ok in zip(segments, valid):
    s = jnp.einsum("bkgd,bkdt->bkgt", q, seg.k_BxKxDxT, preferred_element_type=jnp.float32)
    scores.append(jnp.where(ok[:, None, None, :], s, NEG_INF))
  p = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(q.dtype)
  out = None
  start = 0
  for seg in segments:
    t = seg.v_BxKxTxD.shape[2]
    o = jnp.einsum("bkgt,bktd->bkgd", p[..., start:start + t], seg.v_BxKxTxD)
    out = o if out is None else out + o
    start += t
  return out

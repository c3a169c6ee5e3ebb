"""Choosing the next token: temperature, top-k, top-p, by inverse-CDF sampling.

One uniform number per row picks the token from the cumulative distribution, which is exact
categorical sampling and needs B random numbers per step instead of the B x V of Gumbel-max.
Each row's uniforms come from its own key (the call's key folded with the row's global index),
so a row's sample does not depend on the batch it is decoded in or on how it is sharded.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  max_new_tokens: int
  temperature: float = 1.0  # 0 is greedy
  top_k: int = 0  # 0 keeps every token
  top_p: float = 1.0  # 1 keeps every token
  eos_ids: tuple[int, ...] = ()
  pad_id: int = 0
  decode_chunk: int | str = 64  # KV-cache slots per chunk of generated tokens, or "auto"

  def __post_init__(self):
    errors = []
    if self.max_new_tokens < 1:
      errors.append(f"max_new_tokens={self.max_new_tokens} must be >= 1")
    if self.temperature < 0:
      errors.append(f"temperature={self.temperature} must be >= 0")
    if self.top_k < 0:
      errors.append(f"top_k={self.top_k} must be >= 0")
    if not 0 < self.top_p <= 1:
      errors.append(f"top_p={self.top_p} must be in (0, 1]")
    if self.decode_chunk != "auto" and (isinstance(self.decode_chunk, bool)
                                        or not isinstance(self.decode_chunk, int)
                                        or self.decode_chunk < 1):
      errors.append(f"decode_chunk={self.decode_chunk!r} must be >= 1 or 'auto'")
    if errors:
      raise ValueError("sampling: " + "; ".join(errors))
    object.__setattr__(self, "eos_ids", tuple(int(e) for e in self.eos_ids))


def row_keys(key: jax.Array, row_ids: jax.Array) -> jax.Array:
  return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, row_ids)


def row_uniforms(keys: jax.Array, steps: int) -> jax.Array:
  """[B, steps] numbers in (0, 1]: row r's draw for every decode step, made before the loop."""
  return jax.vmap(lambda k: 1.0 - jax.random.uniform(k, (steps,)))(keys)


def _pick(weights_BxV: jax.Array, u_B: jax.Array) -> jax.Array:
  """Smallest index whose cumulative weight reaches u * total; never a zero-weight index."""
  cdf = jnp.cumsum(weights_BxV, axis=-1)
  return jnp.sum(cdf < u_B[:, None] * cdf[:, -1:], axis=-1).astype(jnp.int32)


def sample(logits_BxV: jax.Array, u_B: jax.Array, p: SamplingParams):
  """(token, log-prob under the policy at temperature 1, log-prob under the sampler)."""
  logits = logits_BxV.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  if p.temperature == 0:
    tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return tok, jnp.take_along_axis(logp, tok[:, None], -1)[:, 0], jnp.zeros_like(u_B)
  z = logits if p.temperature == 1 else logits / p.temperature
  idx = None
  if p.top_k and p.top_k < z.shape[-1]:
    z, idx = jax.lax.top_k(z, p.top_k)
  if p.top_p < 1:
    if idx is None:
      z, idx = jax.lax.top_k(z, z.shape[-1])
    probs = jax.nn.softmax(z, axis=-1)
    keep = (jnp.cumsum(probs, axis=-1) - probs) < p.top_p
    z = jnp.where(keep, z, -jnp.inf)
  slogp = logp if (idx is None and p.temperature == 1) else jax.nn.log_softmax(z, axis=-1)
  j = _pick(jnp.exp(slogp), u_B)
  slp = jnp.take_along_axis(slogp, j[:, None], -1)[:, 0]
  tok = j if idx is None else jnp.take_along_axis(idx, j[:, None], -1)[:, 0].astype(jnp.int32)
  return tok, jnp.take_along_axis(logp, tok[:, None], -1)[:, 0], slp


def is_eos(tok: jax.Array, eos_ids: Sequence[int]) -> jax.Array:
  out = jnp.zeros(tok.shape, bool)
  for e in eos_ids:
    out = out | (tok == e)
  return out

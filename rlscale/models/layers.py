"""Building blocks of the decoder: RMSNorm, rotary embeddings, attention weights, SwiGLU MLP.

Weight layouts are chosen for speed and for tensor parallelism over KV heads:
  qkv      [embed, kv_heads, group_size + 2, head_dim]  (the G query heads of a KV head, then k, v)
  o        [kv_heads, group_size, head_dim, embed]
  gate, up [embed, mlp]
  down     [mlp, embed]
One matmul produces q, k and v; sharding `kv_heads` over `tensor` keeps every query head on
the shard that holds its KV head. Gate and up are two weights and two matmuls: one joint
[embed, 2, mlp] matmul whose output is sliced costs a pad, an add and a transpose of that
output in the backward pass.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rlscale.models.config import ModelConfig, YarnScaling
from rlscale.parallel.sharding import constrain

NEG_INF = float(np.finfo(np.float32).min)


def c(x: jax.Array, *trailing: str | None) -> jax.Array:
  """Constrain an activation: batch first, the named trailing axes last."""
  return constrain(x, ("batch",) + (None,) * (x.ndim - 1 - len(trailing)) + trailing)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return y.astype(x.dtype) * weight.astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [head_dim/2] in float32, scaled as `cfg.rope_scaling` says.

  Each scaling follows transformers' modeling_rope_utils step by step, in float32 where it
  computes in float32, so that imported checkpoints give transformers' logits.
  """
  dim = cfg.head_dim
  inv = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))
  inv = inv.astype(np.float32)
  s = cfg.rope_scaling
  if s is None:
    return inv
  if isinstance(s, YarnScaling):
    return _yarn_inv_freq(cfg.rope_theta, dim, s)
  low_wavelen = s.original_max_position / s.low_freq_factor
  high_wavelen = s.original_max_position / s.high_freq_factor
  wavelen = (2 * math.pi / inv).astype(np.float32)
  scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
  smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn_inv_freq(theta: float, dim: int, s: YarnScaling) -> np.ndarray:
  """YaRN: frequencies that turn fewer than beta_slow times over the original context are
  interpolated (divided by factor), those that turn more than beta_fast times are kept, and a
  linear ramp over dimensions blends the two in between."""
  def correction_dim(rotations):  # the dimension whose frequency turns `rotations` times
    return dim * math.log(s.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

  low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
  if s.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # transformers' guard against a zero-width ramp
  pos_freqs = np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
  extrapolation = np.float32(1.0) / pos_freqs
  interpolation = np.float32(1.0) / (np.float32(s.factor) * pos_freqs)
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
  keep = np.float32(1.0) - ramp
  return (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32)


def rope_attention_scale(cfg: ModelConfig) -> float:
  """The factor on cos and sin (so q·k grows by its square): YaRN's, which offsets the flatter
  attention of interpolated positions; 1 otherwise."""
  s = cfg.rope_scaling
  return s.attention_scale if isinstance(s, YarnScaling) else 1.0


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
  """cos and sin [..., head_dim/2] in float32 for integer positions [...]."""
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotate-half rotary embedding; cos/sin [..., head_dim/2] broadcast against x [..., head_dim].

  With x = (x1, x2) in halves: (x1 cos - x2 sin, x2 cos + x1 sin), computed as
  x * (cos, cos) + swap(x) * (-sin, sin) on x viewed as [..., 2, head_dim/2]: the swap of the
  halves is a reverse, which fuses into the elementwise loop, where splitting and concatenating
  the halves made a separate copy of q and k (and another in the backward pass).
  """
  half = x.shape[-1] // 2
  cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
  x2h = x.reshape(x.shape[:-1] + (2, half))
  cos2 = jnp.stack([cos, cos], axis=-2)
  sin2 = jnp.stack([-sin, sin], axis=-2)
  return (x2h * cos2 + jnp.flip(x2h, axis=-2) * sin2).reshape(x.shape)


def positions_from_mask(mask: jax.Array) -> jax.Array:
  """Positions of left-padded rows: 0 at the first real token, pads clamp to 0."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def dense(x: jax.Array, w: jax.Array, **dot_kw) -> jax.Array:
  """x [..., K] times w [K, ...] as one 2-D matmul over the flattened leading axes.

  A matmul with several free axes on one side (a [B, T, K] activation) compiles on the CPU
  to a slower kernel than the same matmul on [B*T, K] (its gradient took ~1.6x the time);
  the reshapes are free (bitcasts) on every backend.
  """
  k = x.shape[-1]
  y = jnp.dot(x.reshape(-1, k), w.reshape(k, -1), **dot_kw)
  return y.reshape(x.shape[:-1] + w.shape[1:])


def _param(rngs: nnx.Rngs | None, shape, dtype, axes, std: float | None):
  if std is None:
    value = jnp.ones(shape, dtype)
  elif std == 0.0:
    value = jnp.zeros(shape, dtype)
  else:
    value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, axes=axes)


class Block(nnx.Module):
  """One pre-norm decoder layer: attention with a residual, then the MLP with a residual."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    e, kv, g, d, f = cfg.d_model, cfg.num_kv_heads, cfg.group_size, cfg.head_dim, cfg.mlp_dim
    pd, std = cfg.weight_dtype, cfg.init_std
    self.attn_norm = _param(rngs, (e,), pd, ("norm",), None)
    self.qkv = _param(rngs, (e, kv, g + 2, d), pd, ("embed", "kv_heads", "qkv", "head_dim"), std)
    self.qkv_bias = (_param(rngs, (kv, g + 2, d), pd, ("kv_heads", "qkv", "head_dim"), 0.0)
                     if cfg.qkv_bias else None)
    self.q_norm = _param(rngs, (d,), pd, ("norm",), None) if cfg.qk_norm else None
    self.k_norm = _param(rngs, (d,), pd, ("norm",), None) if cfg.qk_norm else None
    self.o = _param(rngs, (kv, g, d, e), pd, ("kv_heads", "q_per_kv", "head_dim", "embed"), std)
    self.mlp_norm = _param(rngs, (e,), pd, ("norm",), None)
    self.gate = _param(rngs, (e, f), pd, ("embed", "mlp"), std)
    self.up = _param(rngs, (e, f), pd, ("embed", "mlp"), std)
    self.down = _param(rngs, (f, e), pd, ("mlp", "embed"), std)

  def _w(self, p: nnx.Param) -> jax.Array:
    return p[...].astype(self.cfg.compute_dtype)

  def project_qkv(self, h: jax.Array, cos: jax.Array, sin: jax.Array):
    """Normed hidden [..., E] -> q [..., KV, G, D], k and v [..., KV, D], rotated."""
    g = self.cfg.group_size
    # A plain 2-D matmul: the merged output axis keeps kv_heads outermost, so its sharding holds.
    qkv = dense(h, self._w(self.qkv))
    if self.qkv_bias is not None:
      qkv = qkv + self._w(self.qkv_bias)
    qkv = c(qkv, "act_kv_heads", None, None)
    q, k, v = qkv[..., :g, :], qkv[..., g, :], qkv[..., g + 1, :]
    if self.q_norm is not None:
      q = rms_norm(q, self.q_norm[...], self.cfg.rms_eps)
      k = rms_norm(k, self.k_norm[...], self.cfg.rms_eps)
    scale = rope_attention_scale(self.cfg)
    if scale != 1.0:  # on float32 cos and sin before their cast, where transformers applies it
      cos, sin = cos * scale, sin * scale
    q = apply_rope(q, cos[..., None, None, :], sin[..., None, None, :])
    k = apply_rope(k, cos[..., None, :], sin[..., None, :])
    return q, k, v

  def attn_out(self, o: jax.Array) -> jax.Array:
    w = self._w(self.o)
    return dense(o.reshape(o.shape[:-3] + (-1,)), w.reshape(-1, w.shape[-1]))

  def mlp(self, h: jax.Array) -> jax.Array:
    gate = c(dense(h, self._w(self.gate)), "act_mlp")
    up = c(dense(h, self._w(self.up)), "act_mlp")
    return dense(jax.nn.silu(gate) * up, self._w(self.down))

  def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask_BxSxT: jax.Array,
               last_only: bool = False):
    """Full-sequence layer. Returns the new residual stream and this layer's (k, v).

    With `last_only` keys and values cover every position but the output only the last one.
    """
    eps = self.cfg.rms_eps
    q, k, v = self.project_qkv(rms_norm(x, self.attn_norm[...], eps), cos, sin)
    if last_only:
      q, x, mask_BxSxT = q[:, -1:], x[:, -1:], mask_BxSxT[:, -1:]
    x = x + self.attn_out(attention(q, k, v, mask_BxSxT))
    x = c(x, "act_embed")
    x = x + self.mlp(rms_norm(x, self.mlp_norm[...], eps))
    return c(x, "act_embed"), (k, v)


def attention(q_BxSxKxGxD, k_BxTxKxD, v_BxTxKxD, mask_BxSxT) -> jax.Array:
  """Grouped-query softmax attention, scores and softmax in float32."""
  scale = 1.0 / math.sqrt(q_BxSxKxGxD.shape[-1])
  s = jnp.einsum("bskgd,btkd->bkgst", q_BxSxKxGxD, k_BxTxKxD,
                 preferred_element_type=jnp.float32) * scale
  s = jnp.where(mask_BxSxT[:, None, None], s, NEG_INF)
  p = jax.nn.softmax(s, axis=-1).astype(v_BxTxKxD.dtype)
  return jnp.einsum("bkgst,btkd->bskgd", p, v_BxTxKxD)

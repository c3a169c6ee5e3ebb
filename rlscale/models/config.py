"""Model shapes of the Llama / Qwen family, and the named sizes the configs refer to."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax.numpy as jnp

FAMILIES = ("llama", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama 3 frequency-dependent rope scaling (HF `rope_type: llama3`)."""

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position: int


@dataclasses.dataclass(frozen=True)
class YarnScaling:
  """YaRN rope scaling (HF `rope_type: yarn`, long-context Qwen); defaults are transformers'."""

  factor: float
  original_max_position: int
  beta_fast: float = 32.0  # rotations per original context above which a frequency is kept
  beta_slow: float = 1.0  # ... and below which it is divided by `factor`
  attention_factor: float | None = None  # cos and sin are scaled by it; None: 0.1 ln(factor) + 1
  truncate: bool = True  # round the ramp's ends to whole dimensions

  @property
  def attention_scale(self) -> float:
    return yarn_mscale(self.factor) if self.attention_factor is None else self.attention_factor


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
  """YaRN's attention temperature for a context `factor` times longer (transformers' get_mscale)."""
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """One decoder-only transformer. The family only decides the defaults below."""

  family: str
  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  rope_scaling: RopeScaling | YarnScaling | None = None
  rms_eps: float = 1e-6
  tie_embeddings: bool = True
  qkv_bias: bool = False  # Qwen2 / 2.5
  qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before rope
  dtype: str = "float32"  # activations and matmuls
  param_dtype: str = "float32"  # stored parameters
  init_std: float = 0.02
  # What a checkpoint says about its use, not its shape: carried from import to export so that
  # an exported policy generates as its source did.
  max_position: int | None = None  # HF max_position_embeddings; None: unknown
  bos_id: int | None = None
  eos_ids: tuple[int, ...] = ()
  pad_id: int | None = None
  generation_config: str | None = None  # the source's generation_config.json, as sorted JSON text

  def __post_init__(self):
    # A list (from JSON or a ConfigDict) would make the config unhashable, and nnx needs a hash.
    eos = (self.eos_ids,) if isinstance(self.eos_ids, int) else self.eos_ids
    object.__setattr__(self, "eos_ids", tuple(int(e) for e in eos))
    errors = []
    if self.family not in FAMILIES:
      errors.append(f"family={self.family!r} is not one of {FAMILIES}")
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "head_dim", "mlp_dim"):
      if getattr(self, name) <= 0:
        errors.append(f"{name}={getattr(self, name)} must be positive")
    if self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads:
      errors.append(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.max_position is not None and self.max_position <= 0:
      errors.append(f"max_position={self.max_position} must be positive")
    if self.head_dim % 2:
      errors.append(f"head_dim={self.head_dim} must be even for rotary embeddings")
    for name in ("dtype", "param_dtype"):
      try:
        jnp.dtype(getattr(self, name))
      except TypeError:
        errors.append(f"{name}={getattr(self, name)!r} is not a dtype")
    if errors:
      raise ValueError("model config: " + "; ".join(errors))

  @property
  def group_size(self) -> int:
    """Query heads per KV head (grouped-query attention)."""
    return self.num_heads // self.num_kv_heads

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)

  def num_params(self, with_embeddings: bool = True) -> int:
    e, f = self.d_model, self.mlp_dim
    attn = e * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim + self.num_heads * self.head_dim * e
    if self.qkv_bias:
      attn += (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    if self.qk_norm:
      attn += 2 * self.head_dim
    per_layer = attn + 3 * e * f + 2 * e
    n = self.num_layers * per_layer + e
    if with_embeddings:
      n += self.vocab_size * e * (1 if self.tie_embeddings else 2)
    return n

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)


def _llama(**kw) -> dict:
  return dict(family="llama", rms_eps=1e-5, rope_theta=500_000.0, **kw)


def _qwen2(**kw) -> dict:
  return dict(family="qwen2", rms_eps=1e-6, rope_theta=1_000_000.0, qkv_bias=True, **kw)


def _qwen3(**kw) -> dict:
  return dict(family="qwen3", rms_eps=1e-6, rope_theta=1_000_000.0, qk_norm=True, **kw)


# Real shapes from the published config.json files; `tiny` is the CPU default.
NAMED: dict[str, dict[str, Any]] = {
    "tiny": dict(
        family="llama", vocab_size=512, d_model=256, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=64, mlp_dim=704, rope_theta=10_000.0, rms_eps=1e-5, tie_embeddings=True),
    "qwen2.5-0.5b": _qwen2(
        vocab_size=151_936, d_model=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
        mlp_dim=4864, tie_embeddings=True, max_position=32_768),
    "qwen3-0.6b": _qwen3(
        vocab_size=151_936, d_model=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
        mlp_dim=3072, tie_embeddings=True, max_position=40_960),
    "qwen3-1.7b": _qwen3(
        vocab_size=151_936, d_model=2048, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
        mlp_dim=6144, tie_embeddings=True, max_position=40_960),
    "llama-3.2-1b": _llama(
        vocab_size=128_256, d_model=2048, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
        mlp_dim=8192, tie_embeddings=True, max_position=131_072,
        rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position=8192)),
    "llama-3-8b": _llama(
        vocab_size=128_256, d_model=4096, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
        mlp_dim=14_336, tie_embeddings=False, max_position=8192),
}


def named(name: str, **overrides) -> ModelConfig:
  """The named size `name` with `overrides` applied (e.g. dtype='bfloat16')."""
  if name not in NAMED:
    raise ValueError(f"model.name={name!r} is not a known size; known: {sorted(NAMED)}")
  fields = dict(NAMED[name])
  fields.update({k: v for k, v in overrides.items() if v is not None})
  return ModelConfig(**fields)


_OVERRIDABLE = {f.name for f in dataclasses.fields(ModelConfig)} - {"rope_scaling", "generation_config"}


def from_config_dict(cfg: Mapping[str, Any]) -> ModelConfig:
  """A ModelConfig from a config's `model` section: `name` plus any field overrides.

  A field left as None keeps the named size's value.
  """
  cfg = dict(cfg)
  name = cfg.pop("name", None)
  cfg.pop("hf_checkpoint", None)
  unknown = sorted(set(cfg) - _OVERRIDABLE)
  if unknown:
    raise ValueError(f"model: unknown field(s) {unknown}; known: {sorted(_OVERRIDABLE | {'name'})}")
  if name is None:
    return ModelConfig(**cfg)
  return named(name, **cfg)

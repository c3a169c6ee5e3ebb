"""Hugging Face checkpoints: config.json <-> ModelConfig, safetensors <-> sharded CausalLM.

Import reads one tensor at a time from memory-mapped files and places only each device's shard
on that device (`jax.make_array_from_callback`), so no device ever holds the whole model.
Export writes the same layout transformers reads (`*ForCausalLM`), one tensor at a time.
"""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Any, Callable, Iterator, Sequence

import jax
import ml_dtypes
import numpy as np
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from rlscale.parallel import sharding
from rlscale.checkpoints import safetensors_io
from rlscale.checkpoints.safetensors_io import CheckpointError
from rlscale.models import CausalLM, ModelConfig, RopeScaling, YarnScaling, abstract_model
from rlscale.models.config import yarn_mscale

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# What transformers' config classes assume for a field config.json leaves out.
_MAX_POSITION_DEFAULT = {"llama": 2048, "qwen2": 32_768, "qwen3": 32_768}
_DEFAULT_THETA = 10_000.0
_ROPE_TYPES = ("default", "llama3", "yarn")
_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _rope_parameters(hf: dict[str, Any], family: str, problems: list[str]) -> tuple[dict, str]:
  """The rope dict transformers 5 builds from config.json, and the name of its type field.

  Mirrors transformers' RotaryEmbeddingConfigMixin (convert_rope_params_to_dict,
  standardize_rope_params): a set legacy `rope_scaling` replaces `rope_parameters` whole, its
  rope_theta included; rope_theta then comes from that dict, else the top level, else 10000; the
  type from `rope_type`, else the legacy `type`; a scaled type's original context from a top-level
  original_max_position_embeddings (Phi-3 style), else the dict, else max_position_embeddings.
  """
  field = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
  rope = dict(hf.get(field) or {})
  nested = [k for k in rope if k in (hf.get("layer_types") or ())]
  if nested:
    problems.append(f"{field} per layer type ({nested})")
    return {"rope_type": "default", "rope_theta": _DEFAULT_THETA}, f"{field}.rope_type"
  type_field = f"{field}.{'rope_type' if 'rope_type' in rope else 'type'}"
  rope.setdefault("rope_theta", hf["rope_theta"] if "rope_theta" in hf else _DEFAULT_THETA)
  if hf.get("partial_rotary_factor") is not None:
    rope.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
  rope.setdefault("rope_type", rope.get("type", "default"))
  if rope["rope_type"] in ("llama3", "yarn", "longrope"):
    if "original_max_position_embeddings" in hf:
      rope["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
    else:
      rope.setdefault("original_max_position_embeddings", _max_position(hf, family))
  dropped = (hf.get("rope_parameters") or {}).get("rope_theta")
  if field == "rope_scaling" and dropped not in (None, rope["rope_theta"]):
    logging.warning("config.json: rope_scaling replaces rope_parameters, as in transformers, so "
                    "rope_parameters.rope_theta=%s is not used; rope_theta=%s is",
                    dropped, rope["rope_theta"])
  return rope, type_field


def _max_position(hf: dict[str, Any], family: str) -> int | None:
  if "max_position_embeddings" in hf:
    return hf["max_position_embeddings"]
  return _MAX_POSITION_DEFAULT[family]


def _rope_scaling(rope: dict, type_field: str, max_position: int | None, problems: list[str]):
  """RopeScaling, YarnScaling or None for a resolved rope dict; what is wrong goes to `problems`."""
  kind = rope["rope_type"]
  if kind not in _ROPE_TYPES:
    problems.append(f"{type_field}={kind!r} (supported: {', '.join(map(repr, _ROPE_TYPES))})")
    return None
  if rope.get("partial_rotary_factor", 1.0) != 1.0:
    problems.append(f"partial_rotary_factor={rope['partial_rotary_factor']} (rope turns the whole head)")
  required = {"llama3": ("factor", "low_freq_factor", "high_freq_factor"), "yarn": ("factor",)}
  missing = [k for k in required.get(kind, ()) if k not in rope]
  if kind != "default" and rope.get("original_max_position_embeddings") is None:
    missing.append("original_max_position_embeddings")
  if missing:
    field = type_field.split(".")[0]
    problems.append(f"{field}.{missing[0]} missing (rope_type {kind!r} needs {list(required[kind])})")
    return None
  original = rope.get("original_max_position_embeddings")
  if kind == "llama3":
    return RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                       float(rope["high_freq_factor"]), int(original))
  if kind == "yarn":
    return _yarn(rope, int(original), max_position)
  return None


def _yarn(rope: dict, original: int, max_position: int | None) -> YarnScaling:
  """transformers' _compute_yarn_parameters' reading of the dict, defaults and `or` included."""
  factor = rope["factor"]
  if factor is None:  # DeepSeek style: the context extension is implied by the two lengths
    factor = max_position / original
  attention = rope.get("attention_factor")
  mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
  if attention is None and mscale and mscale_all_dim:
    attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
  return YarnScaling(
      factor=float(factor), original_max_position=original,
      beta_fast=float(rope.get("beta_fast") or 32), beta_slow=float(rope.get("beta_slow") or 1),
      attention_factor=None if attention is None else float(attention),
      truncate=bool(rope.get("truncate", True)))


def config_from_hf(hf: dict[str, Any], generation: dict[str, Any] | None = None,
                   **overrides) -> ModelConfig:
  """Map a transformers config.json (and generation_config.json) to ModelConfig; refuse what this
  decoder does not implement, naming the field and its value."""
  family = hf.get("model_type")
  if family not in _ARCH:
    raise CheckpointError(
        f"config.json: model_type={family!r} (architectures={hf.get('architectures')}) is not "
        f"supported; supported: {sorted(_ARCH)}")
  problems = []
  if hf.get("hidden_act", "silu") != "silu":
    problems.append(f"hidden_act={hf['hidden_act']!r} (only 'silu')")
  if hf.get("mlp_bias"):
    problems.append("mlp_bias=true")
  if family != "qwen2" and hf.get("attention_bias"):
    problems.append("attention_bias=true")
  if hf.get("use_sliding_window"):
    problems.append("use_sliding_window=true")
  try:
    max_position = _max_position(hf, family)
    rope, type_field = _rope_parameters(hf, family, problems)
    scaling = _rope_scaling(rope, type_field, max_position, problems)
    if problems:
      raise CheckpointError(f"config.json ({family}) is not supported: " + "; ".join(problems))
    fields = _fields(hf, family, rope, scaling, max_position)
  except CheckpointError:
    raise
  except KeyError as e:
    raise CheckpointError(f"config.json ({family}) lacks the field {e.args[0]!r}") from None
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"config.json ({family}) has a field of the wrong type ({e})") from None
  fields["generation_config"] = None if generation is None else json.dumps(generation,
                                                                          sort_keys=True)
  fields.update({k: v for k, v in overrides.items() if v is not None})
  return ModelConfig(**fields)


def _fields(hf: dict[str, Any], family: str, rope: dict, scaling, max_position) -> dict[str, Any]:
  heads = int(hf["num_attention_heads"])
  eos = hf.get("eos_token_id")
  return dict(
      family=family, vocab_size=int(hf["vocab_size"]), d_model=int(hf["hidden_size"]),
      num_layers=int(hf["num_hidden_layers"]), num_heads=heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      head_dim=int(hf.get("head_dim") or hf["hidden_size"] // heads),
      mlp_dim=int(hf["intermediate_size"]), rope_theta=float(rope["rope_theta"]), rope_scaling=scaling,
      rms_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=family == "qwen2", qk_norm=family == "qwen3",
      max_position=None if max_position is None else int(max_position),
      # The ids as config.json has them: transformers generates with these (not its class
      # defaults) when there is no generation_config.json.
      bos_id=hf.get("bos_token_id"), pad_id=hf.get("pad_token_id"),
      eos_ids=() if eos is None else (eos,) if isinstance(eos, int) else tuple(eos))


def _eos_to_hf(eos_ids: tuple[int, ...]) -> int | list[int] | None:
  return None if not eos_ids else eos_ids[0] if len(eos_ids) == 1 else list(eos_ids)


def _special_ids(cfg: ModelConfig) -> dict[str, Any]:
  return dict(zip(_SPECIAL_IDS, (cfg.bos_id, _eos_to_hf(cfg.eos_ids), cfg.pad_id)))


def _rope_to_hf(cfg: ModelConfig) -> dict[str, Any]:
  rope: dict[str, Any] = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
  s = cfg.rope_scaling
  if isinstance(s, RopeScaling):
    rope.update(rope_type="llama3", factor=s.factor, low_freq_factor=s.low_freq_factor,
                high_freq_factor=s.high_freq_factor, original_max_position_embeddings=s.original_max_position)
  elif isinstance(s, YarnScaling):
    rope.update(rope_type="yarn", factor=s.factor, original_max_position_embeddings=s.original_max_position,
                beta_fast=s.beta_fast, beta_slow=s.beta_slow, truncate=s.truncate)
    if s.attention_factor is not None:
      rope["attention_factor"] = s.attention_factor
  return rope


def config_to_hf(cfg: ModelConfig, extra: dict[str, Any] | None = None) -> dict[str, Any]:
  rope = _rope_to_hf(cfg)
  out = {
      "architectures": [_ARCH[cfg.family]], "model_type": cfg.family, "vocab_size": cfg.vocab_size,
      "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim,
      "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
      "rms_norm_eps": cfg.rms_eps, "tie_word_embeddings": cfg.tie_embeddings,
      "rope_theta": cfg.rope_theta, "rope_parameters": rope, "attention_bias": False,
      # transformers 5 reads `dtype`, older versions `torch_dtype`.
      "dtype": cfg.param_dtype, "torch_dtype": cfg.param_dtype,
      # Unknown for a policy built from a size without one (tiny): transformers' Qwen default.
      "max_position_embeddings": cfg.max_position or 32_768,
      # Written even when None, so that LlamaConfig's defaults (1, 2) do not stand in for them.
      **_special_ids(cfg),
  }
  if cfg.rope_scaling is not None:
    out["rope_scaling"] = rope  # what transformers 4 reads; 5 lets it win over rope_parameters
  if cfg.family != "llama":
    out["use_sliding_window"] = False
  out.update(extra or {})
  return out


def generation_config_to_hf(cfg: ModelConfig, source: ModelConfig | None = None) -> dict[str, Any]:
  """generation_config.json: the source checkpoint's as it was, else the special ids (as
  transformers derives one from config.json). Ids that `source` (the config before save_policy
  filled it) lacked and `cfg` has are added to the copy too."""
  source = source or cfg
  if source.generation_config is None:
    return {k: v for k, v in _special_ids(cfg).items() if v is not None}
  gen = json.loads(source.generation_config)
  had = _special_ids(source)
  for key, value in _special_ids(cfg).items():
    if had[key] is None and value is not None and gen.get(key) is None:
      gen[key] = value
  return gen


def _read_json(path: str) -> dict[str, Any]:
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(out, dict):
    raise CheckpointError(f"{path}: holds a {type(out).__name__}, not a JSON object")
  return out


def read_config(folder: str) -> dict[str, Any]:
  path = os.path.join(folder, "config.json")
  if not os.path.exists(path):
    raise CheckpointError(f"{folder}: no config.json (expected a Hugging Face checkpoint folder)")
  return _read_json(path)


def read_generation_config(folder: str) -> dict[str, Any] | None:
  path = os.path.join(folder, "generation_config.json")
  return _read_json(path) if os.path.exists(path) else None


def config_from_folder(folder: str, **overrides) -> ModelConfig:
  """ModelConfig of a Hugging Face folder, with what its generation_config.json says to keep."""
  return config_from_hf(read_config(folder), read_generation_config(folder), **overrides)


# --- parameter layout: our path -> how to build it from HF tensors, and back ---

def _layer_index(path: tuple) -> int:
  return int(path[2])


def _from_hf(cfg: ModelConfig, path: tuple, get: Callable[[str], np.ndarray]) -> np.ndarray:
  """Our parameter at `path` assembled from the HF tensors (numpy, HF dtype)."""
  e, kv, g, d = cfg.d_model, cfg.num_kv_heads, cfg.group_size, cfg.head_dim
  if path == ("model", "embed"):
    return get("model.embed_tokens.weight")
  if path == ("model", "final_norm"):
    return get("model.norm.weight")
  if path == ("lm_head",):
    return get("lm_head.weight").T
  p = f"model.layers.{_layer_index(path)}."
  name = path[3]
  if name == "attn_norm":
    return get(p + "input_layernorm.weight")
  if name == "mlp_norm":
    return get(p + "post_attention_layernorm.weight")
  if name in ("q_norm", "k_norm"):
    return get(p + f"self_attn.{name}.weight")
  if name == "qkv":
    q = get(p + "self_attn.q_proj.weight").T.reshape(e, kv, g, d)
    k = get(p + "self_attn.k_proj.weight").T.reshape(e, kv, 1, d)
    v = get(p + "self_attn.v_proj.weight").T.reshape(e, kv, 1, d)
    return np.concatenate([q, k, v], axis=2)
  if name == "qkv_bias":
    q = get(p + "self_attn.q_proj.bias").reshape(kv, g, d)
    k = get(p + "self_attn.k_proj.bias").reshape(kv, 1, d)
    v = get(p + "self_attn.v_proj.bias").reshape(kv, 1, d)
    return np.concatenate([q, k, v], axis=1)
  if name == "o":
    return get(p + "self_attn.o_proj.weight").T.reshape(kv, g, d, e)
  if name in ("gate", "up"):
    return get(p + f"mlp.{name}_proj.weight").T
  if name == "down":
    return get(p + "mlp.down_proj.weight").T
  raise CheckpointError(f"no Hugging Face tensor maps to parameter {'/'.join(map(str, path))}")


def _to_hf(cfg: ModelConfig, path: tuple, x: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
  """The HF tensors that our parameter at `path` becomes."""
  e, g = cfg.d_model, cfg.group_size
  if path == ("model", "embed"):
    yield "model.embed_tokens.weight", x
    return
  if path == ("model", "final_norm"):
    yield "model.norm.weight", x
    return
  if path == ("lm_head",):
    yield "lm_head.weight", x.T
    return
  p = f"model.layers.{_layer_index(path)}."
  name = path[3]
  simple = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
            "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight"}
  if name in simple:
    yield p + simple[name], x
  elif name == "qkv":
    yield p + "self_attn.q_proj.weight", x[:, :, :g].reshape(e, -1).T
    yield p + "self_attn.k_proj.weight", x[:, :, g].reshape(e, -1).T
    yield p + "self_attn.v_proj.weight", x[:, :, g + 1].reshape(e, -1).T
  elif name == "qkv_bias":
    yield p + "self_attn.q_proj.bias", x[:, :g].reshape(-1)
    yield p + "self_attn.k_proj.bias", x[:, g].reshape(-1)
    yield p + "self_attn.v_proj.bias", x[:, g + 1].reshape(-1)
  elif name == "o":
    yield p + "self_attn.o_proj.weight", x.reshape(-1, e).T
  elif name in ("gate", "up"):
    yield p + f"mlp.{name}_proj.weight", x.T
  elif name == "down":
    yield p + "mlp.down_proj.weight", x.T
  else:
    raise ValueError(f"parameter {'/'.join(map(str, path))} has no Hugging Face name")


def _path(p: tuple) -> tuple:
  return tuple(k if isinstance(k, str) else int(k) for k in p)


_NOT_IN_HF = ("value_head", "value_bias")  # the critic's head: initialized, not loaded


def load_policy(folder: str, mesh: Mesh, rules: sharding.Rules, **overrides):
  """(CausalLM with sharded parameters, its ModelConfig) from a Hugging Face checkpoint folder.

  `overrides` set ModelConfig fields that are ours to choose (dtype, param_dtype).
  """
  return load_model(folder, CausalLM, mesh, rules, **overrides)


def load_model(folder: str, model_cls, mesh: Mesh, rules: sharding.Rules,
               key: jax.Array | None = None, **overrides):
  """`model_cls` (CausalLM or ValueModel) with its backbone from a Hugging Face folder.

  Tensors are read one at a time and each device receives only its shard. Parameters the
  checkpoint does not have (a critic's value head) are initialized from `key`.
  """
  cfg = config_from_folder(folder, **overrides)
  tensors = safetensors_io.SafetensorsFolder(folder)
  graphdef, abs_state = abstract_model(model_cls, cfg)
  shardings = sharding.state_shardings(abs_state, mesh, rules)
  flat_abs = dict(nnx.to_flat_state(abs_state))
  flat_sh = dict(nnx.to_flat_state(shardings))
  fresh = [p for p in flat_abs if p[0] in _NOT_IN_HF]
  leaves = {}
  if fresh:
    @partial(jax.jit, out_shardings=[flat_sh[p].get_value() for p in fresh])
    def init(key):
      state = dict(nnx.to_flat_state(nnx.state(model_cls(cfg, rngs=nnx.Rngs(params=key)))))
      return [state[p].get_value() for p in fresh]
    for p, value in zip(fresh, init(jax.random.key(0) if key is None else key)):
      leaves[p] = flat_abs[p].replace(value)
  for path, var in flat_abs.items():
    if path in leaves:
      continue
    want = var.get_value()
    host = _from_hf(cfg, _path(path), tensors.get)
    if host.shape != want.shape:
      raise CheckpointError(f"{folder}: {'/'.join(map(str, path))} built from the checkpoint has "
                            f"shape {host.shape}, config.json implies {want.shape}")
    host = np.asarray(host, dtype=want.dtype)
    if not np.isfinite(np.sum(host, dtype=np.float32)):  # one reduction: a NaN or inf anywhere
      raise CheckpointError(f"{folder}: tensor {_not_finite(cfg, path, want, tensors)} holds NaN "
                            "or inf values")
    arr = jax.make_array_from_callback(want.shape, flat_sh[path].get_value(), lambda idx: host[idx])
    leaves[path] = var.replace(arr)
  return nnx.merge(graphdef, nnx.from_flat_state(leaves)), cfg


def _not_finite(cfg: ModelConfig, path: tuple, want, tensors) -> str:
  """The name of the HF tensor behind our parameter `path` that holds a NaN or an inf."""
  for name, _ in _hf_shapes(cfg, path, want):
    if not np.isfinite(np.asarray(tensors.get(name), np.float32)).all():
      return repr(name)
  return "/".join(map(str, path))


def _to_host(x: jax.Array) -> np.ndarray:
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _out_dtype(name: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _fill_special_ids(cfg: ModelConfig, bos_id, eos_ids, pad_id) -> ModelConfig:
  eos = (eos_ids,) if isinstance(eos_ids, int) else tuple(eos_ids or ())
  return cfg.replace(bos_id=cfg.bos_id if cfg.bos_id is not None else bos_id,
                     eos_ids=cfg.eos_ids or eos,
                     pad_id=cfg.pad_id if cfg.pad_id is not None else pad_id)


def save_policy(model: CausalLM, folder: str, *, dtype: str | None = None,
                max_shard_bytes: int = 4 << 30, extra_config: dict | None = None,
                bos_id: int | None = None, eos_ids: Sequence[int] | int | None = None,
                pad_id: int | None = None) -> None:
  """Write `model` as a transformers-loadable folder (config.json, generation_config.json,
  safetensors [+ index]).

  The special ids, context length, rope scaling and generation config come from the model's
  config, so an imported checkpoint is written back with its own. `bos_id`, `eos_ids` and `pad_id`
  (a tokenizer's) fill only the ids that config lacks, as for a policy built from a named size.
  Parameters are gathered to the host one at a time and streamed into the files; on many hosts
  every process takes part in each gather and process 0 writes.
  """
  source: ModelConfig = model.cfg
  cfg = _fill_special_ids(source, bos_id, eos_ids, pad_id)
  out_dtype = _out_dtype(dtype or cfg.param_dtype)
  plan, files = _file_plan(cfg, list(nnx.to_flat_state(nnx.state(model))), out_dtype,
                           max_shard_bytes)
  writer = jax.process_index() == 0
  names = (["model.safetensors"] if len(files) == 1 else
           [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))])

  def tensors():
    for path, var in plan:
      host = _to_host(var.get_value())
      for _, t in _to_hf(cfg, _path(path), host):
        yield t.astype(out_dtype)

  stream = tensors()
  if writer:
    os.makedirs(folder, exist_ok=True)
  for fname, specs in zip(names, files):
    arrays = (next(stream) for _ in specs)
    if writer:
      safetensors_io.write_stream(os.path.join(folder, fname), specs, arrays, {"format": "pt"})
    else:
      for _ in arrays:
        pass
  if writer:
    _write_metadata(folder, cfg, source, extra_config, out_dtype, names, files)


def _file_plan(cfg: ModelConfig, params, out_dtype, max_shard_bytes: int):
  """(the (path, variable) pairs in the order their tensors are written, and per file the
  (HF name, shape, dtype) of its tensors), files cut at `max_shard_bytes`."""
  plan = []
  files: list[list[tuple[str, tuple, np.dtype]]] = [[]]
  size = 0
  for path, var in params:
    shapes = _hf_shapes(cfg, path, var.get_value())
    plan.append((path, var))
    nbytes = sum(int(np.prod(shape)) * out_dtype.itemsize for _, shape in shapes)
    if size and size + nbytes > max_shard_bytes:
      files.append([])
      size = 0
    files[-1].extend((n, shape, out_dtype) for n, shape in shapes)
    size += nbytes
  return plan, files


def _hf_shapes(cfg: ModelConfig, path: tuple, value) -> list[tuple[str, tuple[int, ...]]]:
  """(HF name, shape) of the tensors our parameter at `path` (an array or its shape) becomes."""
  names: list[str] = []

  def hf_tensors(x):
    pairs = list(_to_hf(cfg, _path(path), x))
    names[:] = [n for n, _ in pairs]
    return [t for _, t in pairs]

  outs = jax.eval_shape(hf_tensors, jax.ShapeDtypeStruct(value.shape, value.dtype))
  return [(n, tuple(o.shape)) for n, o in zip(names, outs)]


def expected_tensors(model_cls, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
  """The Hugging Face tensors (name -> shape) a folder must hold to load `model_cls` of `cfg`:
  every parameter but a critic's value head, computed from shapes alone."""
  _, abs_state = abstract_model(model_cls, cfg)
  out = {}
  for path, var in nnx.to_flat_state(abs_state):
    if path[0] not in _NOT_IN_HF:
      out.update(_hf_shapes(cfg, path, var.get_value()))
  return out


def _write_metadata(folder, cfg, source, extra_config, out_dtype, names, files) -> None:
  """config.json, generation_config.json and (for several files) the index."""
  hf_cfg = config_to_hf(cfg, extra_config)
  hf_cfg["dtype"] = hf_cfg["torch_dtype"] = str(out_dtype)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
  with open(os.path.join(folder, "generation_config.json"), "w") as f:
    json.dump(generation_config_to_hf(cfg, source), f, indent=2)
  if len(files) > 1:
    weight_map = {n: fname for fname, specs in zip(names, files) for n, _, _ in specs}
    total = sum(int(np.prod(shape)) * out_dtype.itemsize for specs in files for _, shape, _ in specs)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# What a checkpoint's tokenizer is made of (transformers, vLLM and rlscale read these).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "vocab.json", "merges.txt", "added_tokens.json")


def copy_tokenizer(source: str, folder: str) -> list[str]:
  """Copy the tokenizer files of checkpoint `source` into an exported policy `folder` (process
  0 writes), so that the export loads and chats as its source did; the names copied."""
  import shutil
  names = [n for n in TOKENIZER_FILES if os.path.isfile(os.path.join(source, n))]
  if jax.process_index() == 0:
    os.makedirs(folder, exist_ok=True)
    for n in names:
      shutil.copyfile(os.path.join(source, n), os.path.join(folder, n))
  return names

"""The model-shape flags the benchmarks share, and the config they describe (a random model)."""

from __future__ import annotations

from absl import flags

flags.DEFINE_string("family", "llama", "llama | qwen2 | qwen3 (qwen2 adds qkv bias, qwen3 qk-norm)")
flags.DEFINE_integer("layers", 4, "decoder layers")
flags.DEFINE_integer("d_model", 256, "model width")
flags.DEFINE_integer("heads", 4, "query heads")
flags.DEFINE_integer("kv_heads", 2, "key/value heads")
flags.DEFINE_integer("head_dim", 64, "width of one head")
flags.DEFINE_integer("mlp_dim", 704, "SwiGLU hidden width")
flags.DEFINE_integer("vocab", 512, "vocabulary size")
flags.DEFINE_bool("tied", True, "tie the output head to the embedding")
FLAGS = flags.FLAGS


def model_config(dtype: str, param_dtype: str = ""):
  """The ModelConfig of the shape flags: activations in `dtype`, parameters in `param_dtype`
  (empty: `dtype`)."""
  from rlscale import models
  return models.ModelConfig(
      family=FLAGS.family, vocab_size=FLAGS.vocab, d_model=FLAGS.d_model,
      num_layers=FLAGS.layers, num_heads=FLAGS.heads, num_kv_heads=FLAGS.kv_heads,
      head_dim=FLAGS.head_dim, mlp_dim=FLAGS.mlp_dim, tie_embeddings=FLAGS.tied,
      qkv_bias=FLAGS.family == "qwen2", qk_norm=FLAGS.family == "qwen3", dtype=dtype,
      param_dtype=param_dtype or dtype)

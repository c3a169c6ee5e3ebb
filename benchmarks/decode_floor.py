"""What a decode step cannot go below on this machine: its matmuls and its KV-cache reads alone.

    python benchmarks/decode_floor.py --batch 64
    python benchmarks/decode_floor.py --batch 64 --prompt_len 128 --new_tokens 512

For the model shape of benchmarks/decode.py (the same flags), times in one process, each in a
jitted loop of --steps iterations (medians of --repeats):
- `dots_ms`: one step's weight matmuls, chained as the decode chains them ([rows, d] through
  every layer's qkv, output, gate, up and down projections, then the logits); nothing else.
- `attention_ms`: one step's attention products over the mean context (prompt + new_tokens / 2
  keys) in the cache's layout (rlscale/sampling/kv_cache.py), with the softmax; nothing else.
- `floor_ms`: their sum. A decode step of benchmarks/decode.py (`decode_step_s`) also embeds,
  norms, rotates, writes the cache, samples and records; `floor_ms` is the least it could take
  with XLA's kernels for these two parts on this machine.
Prints one JSON line; compare against decode.py's `decode_step_s` measured right before or after.
"""

from __future__ import annotations

import json
import statistics
import time

from absl import app, flags

import model_shape  # the shape flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 64, "rows")
flags.DEFINE_integer("prompt_len", 32, "prompt tokens per row")
flags.DEFINE_integer("new_tokens", 64, "tokens generated per row")
flags.DEFINE_string("dtype", "float32", "activation and parameter dtype")
flags.DEFINE_integer("steps", 50, "iterations per timed loop")
flags.DEFINE_integer("repeats", 5, "timed loops (median reported)")


def per_step(fn, carry, *args) -> float:
  """Median seconds of one iteration of `fn` in a jitted loop that chains its output."""
  import jax
  loop = jax.jit(lambda c, *a: jax.lax.fori_loop(0, FLAGS.steps, lambda i, x: fn(x, *a), c))
  jax.block_until_ready(loop(carry, *args))
  times = []
  for _ in range(FLAGS.repeats):
    t = time.perf_counter()
    jax.block_until_ready(loop(carry, *args))
    times.append(time.perf_counter() - t)
  return statistics.median(times) / FLAGS.steps


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  cfg = model_shape.model_config(FLAGS.dtype)
  dt = jnp.dtype(FLAGS.dtype)
  b, e, f, v, L = FLAGS.batch, cfg.d_model, cfg.mlp_dim, cfg.vocab_size, cfg.num_layers
  kv, g, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
  keys = jax.random.split(jax.random.key(0), 8)
  w = lambda k, shape: (0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dt)
  layers = [dict(qkv=w(keys[0], (e, kv * (g + 2) * d)), o=w(keys[1], (kv * g * d, e)),
                 gate=w(keys[2], (e, f)), up=w(keys[3], (e, f)), down=w(keys[4], (f, e)))
            for _ in range(L)]
  head = w(keys[5], (e, v))

  def dots(x, layers, head):
    for p in layers:
      qkv = x @ p["qkv"]  # used whole: the output projection reads a sum over its slices
      x = x + (qkv[:, :kv * g * d] + jnp.sum(qkv[:, kv * g * d:], axis=-1, keepdims=True)) @ p["o"]
      x = x + ((x @ p["gate"]) * (x @ p["up"])) @ p["down"]
    return x + jnp.sum(x @ head, axis=-1, keepdims=True)  # every logit used: none dropped

  t = FLAGS.prompt_len + FLAGS.new_tokens // 2
  cache_keys = jax.random.split(keys[6], 2 * L)  # each layer its own cache, as in the decode
  k_cache = [w(cache_keys[2 * i], (b, kv, d, t)) for i in range(L)]
  v_cache = [w(cache_keys[2 * i + 1], (b, kv, t, d)) for i in range(L)]

  def attention(q, k_caches, v_caches):
    for k_cache, v_cache in zip(k_caches, v_caches):
      s = jnp.einsum("bkgd,bkdt->bkgt", q, k_cache, preferred_element_type=jnp.float32)
      p = jax.nn.softmax(s, axis=-1).astype(dt)
      q = q + jnp.einsum("bkgt,bktd->bkgd", p, v_cache)
    return q

  x = w(keys[0], (b, e))
  q = w(keys[1], (b, kv, g, d))
  dots_s = per_step(dots, x, layers, head)
  attention_s = per_step(attention, q, k_cache, v_cache)
  print(json.dumps(dict(
      benchmark="decode_floor", backend=jax.default_backend(), family=FLAGS.family, layers=L,
      d_model=e, mlp_dim=f, vocab=v, dtype=FLAGS.dtype, batch=b, prompt_len=FLAGS.prompt_len,
      new_tokens=FLAGS.new_tokens, mean_context=t, dots_ms=round(dots_s * 1e3, 3),
      attention_ms=round(attention_s * 1e3, 3), floor_ms=round((dots_s + attention_s) * 1e3, 3))))


if __name__ == "__main__":
  app.run(main)

"""Decode throughput of the KV-cache sampler; prints one JSON line.

    python benchmarks/decode.py --batch 64
    python benchmarks/decode.py --batch 256 --layers 4 --d_model 256 --heads 4 --kv_heads 2 \
        --head_dim 64 --mlp_dim 704 --vocab 512 --prompt_len 32 --new_tokens 64 --dtype float32

Samples at temperature 1 with EOS disabled, so every row runs the full token budget.
`gen_tokens_per_s` is generated tokens over the whole call (prefill included);
`decode_tokens_per_s` leaves the prefill out. Times are medians over --repeats calls;
`compile_s` is the first call's time less the median.

Roofline, per device: a decode step must read every weight once and each row's keys and
values so far, so `decode_bytes_per_step` = the device's parameter bytes (less the input
embedding when it is not tied) + its rows x KV bytes per token x the mean context
(prompt + new_tokens / 2). `decode_step_s` is the decode's time (the call less the prefill) over
its new_tokens - 1 steps. `bandwidth_gb_per_s` is the same process's jitted in-place `x + 1`
over --bandwidth_mb MiB (bytes read and written), the machine's reference;
`decode_fraction_of_bandwidth` is the bytes a step must read per second of a step over it, and
`decode_fraction_of_hbm` over the datasheet bandwidth of the device kind (rlscale/metrics/flops.py
HBM_BW), where known. Where the call's median is not above the prefill's (a few new tokens on a
busy machine), the decode's time is not resolved: `decode_step_s`, `decode_tokens_per_s` and
the fractions are null, and `decode_note` says so.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time

from absl import app, flags

import model_shape  # the shape flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 64, "rows per compiled call")
flags.DEFINE_integer("prompt_len", 32, "prompt tokens per row")
flags.DEFINE_integer("new_tokens", 64, "tokens generated per row")
flags.DEFINE_string("dtype", "float32", "activation and parameter dtype")
flags.DEFINE_string("decode_chunk", "auto", "KV-cache slots per chunk of generated tokens, or "
                    "'auto' (rollout.decode_chunk's default: from the rows per device)")
flags.DEFINE_integer("repeats", 11, "timed calls (median reported)")
flags.DEFINE_list("mesh", ["-1", "1", "1"], "data,fsdp,tensor")
flags.DEFINE_integer("bandwidth_mb", 256, "MiB of the memory-bandwidth reference (0: skip it)")


def chunk_flag():
  return FLAGS.decode_chunk if FLAGS.decode_chunk == "auto" else int(FLAGS.decode_chunk)


def chunk_slots(mesh, rules) -> int:
  """The slots per chunk the sampler uses (what 'auto' chose)."""
  from rlscale.parallel import sharding
  from rlscale.sampling import kv_cache
  rows = FLAGS.batch // sharding.batch_divisor(mesh, rules)
  return kv_cache.chunk_size(FLAGS.new_tokens - 1, chunk_flag(), rows)


def bandwidth(mb: int) -> float:
  """Median bytes/s of a jitted x + 1 over mb MiB of float32 on the first device (read and
  write counted), in place: the input is donated, so that no call allocates (on the CPU a
  fresh 256 MiB output's page faults made the figure 10x lower: 5 against 53 GB/s)."""
  import jax
  import jax.numpy as jnp
  x = jnp.zeros((mb * 2**18,), jnp.float32)
  nbytes = x.nbytes
  f = jax.jit(lambda x: x + 1, donate_argnums=0)
  x = jax.block_until_ready(f(x))
  times = []
  for _ in range(7):
    t = time.perf_counter()
    x = jax.block_until_ready(f(x))
    times.append(time.perf_counter() - t)
  return 2 * nbytes / statistics.median(times)


def roofline(cfg, state, batch: int, step_s: float | None, bw: float | None, kind: str, mesh,
             rules) -> dict:
  """The bytes a decode step must read on one device (its parameter shards, its rows' keys
  and values) and the fraction of one device's bandwidth the step reached (None where the
  step's time `step_s` is not resolved)."""
  import jax
  import numpy as np
  from rlscale.metrics import flops
  def read(path) -> bool:  # an untied input embedding: only the rows' own entries are read
    keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return cfg.tie_embeddings or keys[:2] != ["model", "embed"]

  param_bytes = sum(x.addressable_shards[0].data.nbytes
                    for path, x in jax.tree_util.tree_leaves_with_path(state) if read(path))
  from rlscale.parallel import sharding
  shape = (batch, cfg.num_kv_heads, cfg.head_dim, 1)  # a token's keys, sharded as the cache's
  rows, heads, dim, _ = sharding.named_sharding(("batch", "act_kv_heads", None, None), shape,
                                                mesh, rules).shard_shape(shape)
  kv_per_token = 2 * cfg.num_layers * heads * dim * np.dtype(cfg.compute_dtype).itemsize
  context = FLAGS.prompt_len + FLAGS.new_tokens / 2
  need = param_bytes + rows * kv_per_token * context
  out = dict(decode_step_s=None if step_s is None else round(step_s, 6),
             decode_bytes_per_step=int(need), param_bytes=int(param_bytes))
  if step_s is None:
    out["decode_note"] = ("not resolved: the call's median time is not above the prefill's "
                          "(raise --new_tokens or --repeats)")
  if bw:
    out["bandwidth_gb_per_s"] = round(bw / 1e9, 1)
    out["decode_fraction_of_bandwidth"] = None if step_s is None else round(need / step_s / bw, 4)
  if kind in flops.HBM_BW:
    out["decode_fraction_of_hbm"] = (None if step_s is None
                                     else round(need / step_s / flops.HBM_BW[kind], 4))
  return out


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from rlscale import models
  from rlscale.parallel import sharding
  from rlscale.sampling import Sampler, SamplingParams

  cfg = model_shape.model_config(FLAGS.dtype)
  mesh = sharding.make_mesh([int(s) for s in FLAGS.mesh])
  rules = sharding.rules_from_config(None)
  policy = models.create_sharded(models.CausalLM, cfg, mesh, rules, jax.random.key(0))
  graphdef, state = nnx.split(policy)
  params = SamplingParams(max_new_tokens=FLAGS.new_tokens, temperature=1.0, eos_ids=(),
                          decode_chunk=chunk_flag())
  sampler = Sampler(graphdef, params, mesh, rules)

  b, plen = FLAGS.batch, FLAGS.prompt_len
  rng = np.random.default_rng(0)
  tokens = sharding.put_batch(rng.integers(0, cfg.vocab_size, (b, plen)).astype(np.int32), mesh, rules)
  mask = sharding.put_batch(np.ones((b, plen), bool), mesh, rules)
  key = jax.random.key(1)

  @jax.jit
  def prefill(state, tokens, mask):
    with sharding.activation_sharding(mesh, rules):
      return nnx.merge(graphdef, state).model.prefill(tokens, mask)

  def timed(fn, *args):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))  # compiles
    first = time.perf_counter() - t
    times = []
    for _ in range(FLAGS.repeats):
      t = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times.append(time.perf_counter() - t)
    return first, statistics.median(times), min(times)

  first, gen_s, gen_best = timed(lambda k: sampler(state, tokens, mask, k), key)
  compile_s = first - gen_s  # the first call compiles, then runs once
  _, pre_s, _ = timed(prefill, state, tokens, mask)
  out = sampler(state, tokens, mask, key)
  generated = int(jnp.sum(out.lengths))
  assert generated == b * FLAGS.new_tokens, (generated, b * FLAGS.new_tokens)
  assert sampler.traces == 1, sampler.traces

  dev = jax.devices()[0]
  stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
  peak_dev = stats.get("peak_bytes_in_use") if stats else None
  result = dict(
      benchmark="decode", backend=jax.default_backend(), devices=jax.device_count(),
      mesh=dict(mesh.shape), family=FLAGS.family, layers=FLAGS.layers, d_model=FLAGS.d_model,
      heads=FLAGS.heads, kv_heads=FLAGS.kv_heads, head_dim=FLAGS.head_dim, mlp_dim=FLAGS.mlp_dim,
      vocab=FLAGS.vocab, dtype=FLAGS.dtype, batch=b, prompt_len=plen, new_tokens=FLAGS.new_tokens,
      decode_chunk=FLAGS.decode_chunk, decode_chunk_slots=chunk_slots(mesh, rules),
      repeats=FLAGS.repeats,
      gen_tokens_per_s=round(b * FLAGS.new_tokens / gen_s, 1),
      gen_tokens_per_s_best=round(b * FLAGS.new_tokens / gen_best, 1),
      decode_tokens_per_s=(round(b * FLAGS.new_tokens / (gen_s - pre_s), 1) if gen_s > pre_s
                           else None),
      prefill_tokens_per_s=round(b * plen / pre_s, 1),
      call_s=round(gen_s, 4), prefill_s=round(pre_s, 4), compile_s=round(compile_s, 2),
      peak_device_mb=None if peak_dev is None else round(peak_dev / 2**20, 1),
      peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
      device_kind=dev.device_kind,
      **roofline(cfg, state, b,
                 (gen_s - pre_s) / max(FLAGS.new_tokens - 1, 1) if gen_s > pre_s else None,
                 bandwidth(FLAGS.bandwidth_mb) if FLAGS.bandwidth_mb else None, dev.device_kind,
                 mesh, rules),
  )
  print(json.dumps(result))
  sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)

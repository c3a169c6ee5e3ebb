"""Generation throughput against the generation batch on the default model; a JSON line each.

    python benchmarks/generation_scaling.py
    python benchmarks/generation_scaling.py --batches=64,256,1024 --new_tokens=64

The model is the shape of configs/grpo.py (random weights), prompts are as long as the task's,
EOS is disabled so every row runs the full budget. One call decodes `generation_batch` rows;
tokens/s grows with the batch until the chip saturates: the critical generation batch is the
smallest batch within 10% of the plateau (DESIGN.md). Times are medians over --repeats calls.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "configs/grpo.py", "experiment config whose model shape is used")
flags.DEFINE_list("batches", ["16", "32", "64", "128", "256", "512", "1024", "2048"],
                  "generation batches to measure")
flags.DEFINE_integer("new_tokens", 0, "tokens per response (0: the config's max_new_tokens)")
flags.DEFINE_integer("prompt_len", 0, "prompt tokens (0: the config task's max_prompt_len)")
flags.DEFINE_integer("repeats", 5, "timed calls per batch")


def main(argv):
  del argv
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  import numpy as np
  from flax import nnx

  from rlscale import config_files, experiment, models
  from rlscale.sampling import Sampler, SamplingParams

  cfg = config_files.load(FLAGS.config)
  env = experiment.setup(cfg)
  new_tokens = FLAGS.new_tokens or cfg.rollout.max_new_tokens
  plen = FLAGS.prompt_len or env.task.max_prompt_len
  policy = models.create_sharded(models.CausalLM, env.model_cfg, env.mesh, env.rules,
                                 jax.random.key(0))
  graphdef, state = nnx.split(policy)
  sampler = Sampler(graphdef, SamplingParams(max_new_tokens=new_tokens, eos_ids=(),
                                             decode_chunk=cfg.rollout.decode_chunk),
                    env.mesh, env.rules)
  rng = np.random.default_rng(0)
  results = []
  for b in (int(x) for x in FLAGS.batches):
    tokens = rng.integers(3, env.model_cfg.vocab_size, (b, plen)).astype(np.int32)
    mask = np.ones_like(tokens, bool)
    jax.block_until_ready(sampler(state, tokens, mask, jax.random.key(0)))  # compile
    times = []
    for i in range(FLAGS.repeats):
      t = time.perf_counter()
      jax.block_until_ready(sampler(state, tokens, mask, jax.random.key(i + 1)))
      times.append(time.perf_counter() - t)
    s = statistics.median(times)
    results.append(dict(benchmark="generation_scaling", backend=jax.default_backend(),
                        devices=jax.device_count(), params=env.model_cfg.num_params(),
                        generation_batch=b, prompt_len=plen, new_tokens=new_tokens,
                        call_s=round(s, 5), gen_tokens_per_s=round(b * new_tokens / s, 1),
                        s_per_response=round(s / b, 7)))
    print(json.dumps(results[-1]), flush=True)
    sampler.release()
  plateau = max(r["gen_tokens_per_s"] for r in results)
  critical = min(r["generation_batch"] for r in results if r["gen_tokens_per_s"] >= 0.9 * plateau)
  print(json.dumps(dict(benchmark="generation_scaling_summary", plateau_tokens_per_s=plateau,
                        critical_generation_batch=critical, tolerance=0.1)), flush=True)


if __name__ == "__main__":
  app.run(main)

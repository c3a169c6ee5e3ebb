"""Generation throughput against the generation batch on the default model; a JSON line each.

    python benchmarks/generation_scaling.py
    python benchmarks/generation_scaling.py --batches=64,256,1024 --new_tokens=64

The model is the shape of configs/grpo.py (random weights), prompts are as long as the task's,
EOS is disabled so every row runs the full budget. One call decodes `generation_batch` rows;
tokens/s grows with the batch until the chip saturates: the critical generation batch is the
smallest batch within 10% of the plateau. Times are medians over --repeats calls.

The summary line sets it beside what `rollout.generation_batch=auto` would choose for the
config's step (P x G responses, G copies of a prompt prefilled once) on this device: the
largest call whose compiled decode fits the device memory (rlscale/sampling/memory_fit.py),
with the bound that decided it, its bytes per device and the budget; and beside the batch
plan's heuristic (rlscale/plan/batch.py).
"""

from __future__ import annotations

import json
import statistics
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
  import jax
  import numpy as np
  from flax import nnx

  from rlscale import models
  from rlscale.config import files as config_files
  from rlscale.resolve import experiment
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
                        critical_generation_batch=critical, tolerance=0.1,
                        **_auto_fields(cfg, env, sampler, state, plen, critical))), flush=True)


def _auto_fields(cfg, env, sampler, state, plen: int, critical: int) -> dict:
  """What `rollout.generation_batch=auto` chooses for the config's step on this device (the
  memory fit), beside the measured critical generation batch and the plan's heuristic."""
  import jax

  from rlscale.plan import batch
  from rlscale.parallel import sharding
  from rlscale.sampling import memory_fit

  responses = cfg.rl.num_prompts * cfg.rl.group_size
  unit = sharding.batch_divisor(env.mesh, env.rules) * jax.process_count()
  fit = memory_fit.fit_generation_batch(sampler, state, plen, responses, unit, cfg.rl.group_size)
  heuristic = (batch.plan_for(cfg, env).generation_batch
               if cfg.rollout.generation_batch == "auto" else None)
  return dict(responses_per_step=responses, auto_generation_batch=fit.generation_batch,
              auto_bound=fit.bound, auto_at_least_critical=fit.generation_batch >= critical,
              auto_bytes_per_device=fit.bytes_per_device, auto_next_batch=fit.next_batch,
              auto_next_bytes_per_device=fit.next_bytes_per_device,
              auto_budget_bytes=fit.budget_bytes, auto_budget_source=fit.budget_source,
              auto_compilations=fit.compilations, auto_compile_s=round(fit.compile_s, 2),
              auto_bytes_by_batch=fit.describe()["measured"],
              heuristic_generation_batch=heuristic)


if __name__ == "__main__":
  app.run(main)

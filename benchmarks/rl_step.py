"""One RL step of the shipped trainer on a random model; prints one JSON line.

    python benchmarks/rl_step.py                       # GRPO, P=64 x G=8, the reference shape
    python benchmarks/rl_step.py --algorithm=ppo --microbatch=128
    python benchmarks/rl_step.py --family=qwen2 --layers=24 --d_model=896 --heads=14 \
        --kv_heads=2 --head_dim=64 --mlp_dim=4864 --vocab=151936 --dtype=bfloat16   # 0.5B

The step is the trainer's own (rlscale/trainer/rl_trainer.py driven by rlscale/trainer/loop.py, as
`launch/main.py` runs it): the decode on the mesh, scoring, the algorithm's `prepare` and
`update`, the metrics fetch. Only the model and the task are the benchmark's: a random model
of the shape the flags give (saved as the run's base checkpoint), and prompts of exactly
--prompt_len random tokens whose responses run --new_tokens tokens (no EOS) and score the
fraction of even ids (the peers' reward).

Sizes come from the batch plan: --microbatch 0 (the default) leaves rl.microbatch (and the
critic's) 'auto', what users get, and the line says what it chose. Times are medians over
--steps steps after two warm-up steps (compilation); `spread` gives min and max.
`update_tflops_per_s` is the update's model FLOPs (rlscale/metrics/flops.py, the trainer's own
count) over its time, `update_executed_tflops_per_s` the FLOPs its layout computes (each
group's prompt once under shared-prompt training), `matmul_tflops_per_s` a jitted 2048x2048
matmul of --dtype measured in the same process, the machine's reference, and
`update_fraction_of_matmul` the executed rate over it; `update_mfu` is the executed rate over
the trainer's devices' datasheet bf16 peak (rlscale/metrics/flops.py), where known. The counts are
of the fixed shape, so none of these is given with --length_mean.

Lengths: by default every response runs --new_tokens tokens. --length_mean=M cuts each
decoded response at a lognormal length of mean M tokens (--length_sigma of log length) before
it is scored and trained, as an EOS would: `update_us_per_real_token` (the update's seconds
over the prompt and response tokens it trained, padding left out) beside
`update_us_per_shape_token` (over rows x (prompt + new tokens)) says what padding costs.

Memory: --remat, --logprob_chunk, --param_dtype and --state_dtype set train.remat,
train.logprob_chunk, model.param_dtype and optim.state_dtype (the critic's too). `memory`
gives per phase (generate, logprobs, actor_update, critic_update) XLA's analysis of the
phase's compiled call per device (arguments, outputs, temporaries, total) and, over the timed
steps, the host's peak RSS during the phase and the device's running peak at its end where the
backend reports one (rlscale/metrics/memory_report.py). The generate phase runs from the decode's
dispatch to its results (the trainer awaits them first when it completes the step); to measure
the others on their own, each blocks until its results are ready (--phase_memory, the
default), as all but the actor's update already do; its time is counted as before.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import tempfile
import time

from absl import app, flags, logging

import model_shape  # (the shape flags)

FLAGS = flags.FLAGS
FLAGS.set_default("family", "qwen3")  # the shape flags are model_shape.py's
flags.DEFINE_string("algorithm", "grpo", "grpo | ppo (configs/grpo.py or configs/ppo.py)")
flags.DEFINE_integer("prompts", 64, "P: prompts per step")
flags.DEFINE_integer("group", 8, "G: responses per prompt")
flags.DEFINE_integer("prompt_len", 32, "tokens per prompt")
flags.DEFINE_integer("new_tokens", 64, "tokens per response (EOS never ends one)")
flags.DEFINE_integer("microbatch", 0, "rows per forward/backward pass; 0: the plan's auto")
flags.DEFINE_string("dtype", "float32", "activation and parameter dtype")
flags.DEFINE_integer("steps", 3, "timed steps (after two warm-up steps)")
flags.DEFINE_list("mesh", ["-1", "1", "1"], "data,fsdp,tensor (the trainer's, when split)")
flags.DEFINE_enum("roles", "colocated", ["colocated", "split"], "mesh.roles")
flags.DEFINE_integer("sampler_devices", 0, "split: devices that sample (mesh.sampler_devices)")
flags.DEFINE_list("sampler_mesh", ["-1", "1", "1"], "split: the sampler's data,fsdp,tensor")
flags.DEFINE_integer("max_staleness", 0, "rollout.max_staleness: the sampler runs up to k "
                     "steps ahead of the trainer (1: step N+1 generates while step N trains)")
flags.DEFINE_integer("matmul", 2048, "side of the reference matmul (0: skip it)")
flags.DEFINE_enum("remat", None, ["none", "full", "dots"], "train.remat (default: the config's)")
flags.DEFINE_integer("logprob_chunk", None, "train.logprob_chunk: vocabulary columns per chunk, "
                     "0 the whole vocabulary (default: the config's)")
flags.DEFINE_string("param_dtype", "", "model.param_dtype (empty: --dtype)")
flags.DEFINE_string("state_dtype", "", "optim.state_dtype: Adam's moments ('' the parameters')")
flags.DEFINE_bool("phase_memory", True, "per-phase memory figures (each phase blocks at its end)")
flags.DEFINE_float("length_mean", 0.0, "> 0: responses end at lognormal lengths of this mean "
                   "(tokens; clipped to [1, --new_tokens]) instead of all running --new_tokens")
flags.DEFINE_float("length_sigma", 0.6, "the lognormal's sigma (of log length)")
flags.DEFINE_enum("shared_prompt", "auto", ["auto", "true", "false"], "train.shared_prompt")
flags.DEFINE_bool("pack_responses", True, "train.pack_responses (with shared-prompt training)")


def bench_task(vocab: int, prompt_len: int, num_eval: int = 8):
  """Prompts of exactly `prompt_len` random ids in [3, vocab); a response scores the fraction
  of its even ids. The tokenizer has no EOS, so every response runs the full budget."""
  import numpy as np
  from rlscale.tasks.base import Problem, Score, Task

  class Tokenizer:
    eos_ids, pad_id = (), 0
    vocab_size = vocab

    def encode(self, text, add_special_tokens=False):
      return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens=True):
      return " ".join(str(int(i)) for i in ids)

  class RandomPrompts(Task):
    tokenizer = Tokenizer()
    max_prompt_len, max_answer_len = prompt_len, 1

    def problem(self, index):
      ids = np.random.default_rng(index).integers(3, vocab, prompt_len)
      return Problem(" ".join(map(str, ids)), "")

    def eval_problems(self):
      return [self.problem(10**9 + i) for i in range(num_eval)]

    def prompt_ids(self, problem):
      return self.tokenizer.encode(problem.question)

    def demonstration(self, problem):
      return ""

    def verify(self, response, problem):
      return Score(0.0, False)

    def score(self, response_ids, finished, problem):
      ids = np.asarray(response_ids)
      return Score(float(np.mean(ids % 2 == 0)) if ids.size else 0.0, False)

  return RandomPrompts()


def run_config(workdir: str):
  """The shipped config of --algorithm with the benchmark's shape, sizes and base checkpoint."""
  from rlscale.config import files as config_files
  cfg = config_files.load(f"configs/{FLAGS.algorithm}.py")
  cfg.model.update(vocab_size=FLAGS.vocab, d_model=FLAGS.d_model, num_layers=FLAGS.layers,
                   num_heads=FLAGS.heads, num_kv_heads=FLAGS.kv_heads, head_dim=FLAGS.head_dim,
                   mlp_dim=FLAGS.mlp_dim, dtype=FLAGS.dtype,
                   param_dtype=FLAGS.param_dtype or FLAGS.dtype)
  if FLAGS.remat is not None:
    cfg.train.remat = FLAGS.remat
  if FLAGS.logprob_chunk is not None:
    cfg.train.logprob_chunk = FLAGS.logprob_chunk
  cfg.optim.state_dtype = FLAGS.state_dtype
  if "critic" in cfg:
    cfg.critic.optim.state_dtype = FLAGS.state_dtype
  cfg.mesh.shape = [int(s) for s in FLAGS.mesh]
  cfg.mesh.roles, cfg.mesh.sampler_devices = FLAGS.roles, FLAGS.sampler_devices
  cfg.mesh.sampler_shape = [int(s) for s in FLAGS.sampler_mesh]
  cfg.rollout.max_staleness = FLAGS.max_staleness
  cfg.train.shared_prompt = {"auto": "auto", "true": True, "false": False}[FLAGS.shared_prompt]
  cfg.train.pack_responses = FLAGS.pack_responses
  cfg.init.hf_checkpoint = os.path.join(workdir, "base")
  cfg.rollout.max_new_tokens = FLAGS.new_tokens
  cfg.rl.num_prompts, cfg.rl.group_size = FLAGS.prompts, FLAGS.group
  cfg.rl.kl_coef = 0.0  # beta = 0, as the peers run
  if FLAGS.microbatch:
    cfg.rl.microbatch = FLAGS.microbatch
    if "critic" in cfg:
      cfg.critic.microbatch = FLAGS.microbatch
  cfg.train.num_steps = FLAGS.steps + 3  # two warm-up steps, the timed ones, the final one
  cfg.train.eval_every, cfg.train.checkpoint_every, cfg.train.tensorboard = 0, 0, False
  cfg.train.log_every = 10**6
  return cfg


def base_checkpoint(cfg, env, folder: str) -> None:
  """A random policy of the config's shape, written where the run loads its base from."""
  import jax
  from rlscale import models
  from rlscale.checkpoints import hf
  policy = models.create_sharded(models.CausalLM,
                                 model_shape.model_config(FLAGS.dtype, FLAGS.param_dtype),
                                 env.mesh, env.rules, jax.random.key(0))
  hf.save_policy(policy, folder, pad_id=0)


def make_trainer(workdir: str):
  """The shipped trainer on the benchmark's config, task and random base, in workdir/run."""
  from rlscale.resolve import experiment
  from rlscale.trainer import rl_trainer as rl_loop
  from rlscale.parallel import roles
  from rlscale.parallel import sharding
  from rlscale.resolve import resolved
  cfg = run_config(workdir)
  meshes = roles.make_meshes(cfg.mesh)
  rules = sharding.rules_from_config(cfg.mesh.rules)
  env = experiment.Setup(meshes.trainer, rules, bench_task(FLAGS.vocab, FLAGS.prompt_len),
                         experiment.model_config(cfg), meshes.sampler if meshes.split else None)
  base_checkpoint(cfg, env, cfg.init.hf_checkpoint)
  run = resolved.resolve(cfg, os.path.join(workdir, "run"), setup=env)
  return rl_loop.RLTrainer(run.with_base(cfg.init.hf_checkpoint))


def matmul_tflops(n: int, dtype: str) -> float:
  """Median TFLOP/s of a jitted n x n matmul on the first device."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a, b: a @ b)
  jax.block_until_ready(f(a, a))
  times = []
  for _ in range(7):
    t = time.perf_counter()
    jax.block_until_ready(f(a, a))
    times.append(time.perf_counter() - t)
  return 2 * n**3 / statistics.median(times) / 1e12


def peak_memory() -> dict[str, float]:
  import jax
  from rlscale.metrics import memory_report
  out = {"host_peak_rss_gb": max(memory_report.host_peak_rss(),
                                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30}
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    out["device_peak_gb"] = stats["peak_bytes_in_use"] / 2**30
  return out


def memory_settings(trainer) -> dict:
  """What sets the run's memory, and the plan's line (which says what bound the micro-batch)."""
  cfg = trainer.cfg
  return {"remat": cfg.train.remat, "logprob_chunk": cfg.train.logprob_chunk,
          "param_dtype": cfg.model.param_dtype, "state_dtype": cfg.optim.state_dtype,
          "plan": trainer.plan.summary_line()}


def response_lengths(rows: int, step: int, new_tokens: int) -> "np.ndarray":
  """--length_mean > 0: each row's response length, lognormal with mean --length_mean and
  sigma --length_sigma of log length, clipped to [1, new_tokens], drawn per step (seeded)."""
  import numpy as np
  sigma = FLAGS.length_sigma
  mu = np.log(FLAGS.length_mean) - sigma**2 / 2  # E[exp(N(mu, sigma^2))] = mean
  draw = np.random.default_rng(step).lognormal(mu, sigma, rows)
  return np.clip(np.round(draw), 1, new_tokens).astype(np.int32)


def end_responses(trainer, lengths_of):
  """Responses of a real task end at varying lengths: each step's decoded rows are cut at
  `lengths_of(rows, step)` (the rest padding, as after an EOS) before the step is scored and
  trained. The decode itself ran the full budget (a random model emits no EOS); what a varying
  length changes, and what this measures, is the training of padded rows."""
  import jax.numpy as jnp
  complete = trainer.complete
  pad = trainer.env.task.tokenizer.pad_id

  def cut(step, b, t_start):
    r = b.rollout
    n = r.tokens.shape[1]
    lengths = jnp.asarray(lengths_of(r.tokens.shape[0], step, n))
    live = jnp.arange(n)[None] < lengths[:, None]
    b.rollout = r._replace(tokens=jnp.where(live, r.tokens, pad),
                           logprobs=jnp.where(live, r.logprobs, 0.0),
                           sample_logprobs=jnp.where(live, r.sample_logprobs, 0.0),
                           mask=live & r.mask, lengths=jnp.minimum(lengths, r.lengths))
    return complete(step, b, t_start)

  trainer.complete = cut


def instrument(trainer, skip: int = 2):
  """Make each phase of the trainer's steps a measured one (memory_report.PhaseMemory, the
  `skip` warm-up steps left out) and keep what the compiled calls' analysis needs: the last
  batch the algorithm prepared, and each trained model's update call wrapped in a Recorder."""
  import jax
  from rlscale.metrics import memory_report
  phases = memory_report.PhaseMemory(skip=skip)
  seen = {}
  begin, complete = trainer.begin, trainer.complete

  def begin_generate(step):  # the decode is dispatched here and awaited first in `complete`
    phases.start("generate")
    return begin(step)

  def complete_after_generate(step, b, t_start):
    jax.block_until_ready(b.rollout)
    phases.stop("generate")
    return complete(step, b, t_start)

  trainer.begin, trainer.complete = begin_generate, complete_after_generate
  prepare = trainer.algo.prepare

  def keep_batch(batch, *args):
    seen["batch"] = batch
    return prepare(batch, *args)

  trainer.algo.prepare = keep_batch
  phases.wrap(trainer.algo, "prepare", "logprobs")
  for name, model in trainer.algo.models.items():
    step = model.step

    def recorded(*args, model=model, step=step):
      out = step(*args)
      if not isinstance(model.update._jitted, memory_report.Recorder):
        model.update._jitted = memory_report.Recorder(model.update._jitted)
      return out

    model.step = recorded
    phases.wrap(model, "step", f"{name}_update", block=lambda out, m=model: (out, m.state))
  return phases, seen


def phase_memory(trainer, phases, seen) -> dict[str, dict[str, float]]:
  """Per phase: the compiled call's memory analysis (GiB per device) beside the runtime peaks."""
  from rlscale.metrics import memory_report
  from rlscale.parallel import sharding
  from rlscale.sampling import decode, memory_fit
  gib = memory_report.GIB
  out = {name: dict(figs) for name, figs in phases.figures().items()}
  n, sampler = trainer.plan.generation_batch, trainer.sampler
  group = decode.shared_prefill(trainer.plan.group_size, n, n,
                                sharding.batch_divisor(sampler.mesh, sampler.rules))
  call = memory_fit.call_bytes(sampler, trainer.sampler_params, FLAGS.prompt_len, n, group)
  compiled = {"generate": {"arguments": call.arguments, "outputs": call.outputs,
                           "temp": call.temp, "total": call.total}}
  logprobs = getattr(trainer.algo, "logprobs", None)
  if "batch" in seen and hasattr(logprobs, "lower"):  # run or not, what the forward needs
    compiled["logprobs"] = memory_report.compiled_memory(
        logprobs.lower(trainer.actor.params, seen["batch"]).compile())
  for name, model in trainer.algo.models.items():
    if isinstance(model.update._jitted, memory_report.Recorder):
      compiled[f"{name}_update"] = model.update._jitted.memory()
  for name, m in compiled.items():
    row = out.setdefault(name, {"ran": False})
    row.update({f"compiled_{k}_gb": m[k] / gib for k in ("arguments", "outputs", "temp", "total")
                if k in m})
  return {k: {f: round(v, 4) if isinstance(v, float) else v for f, v in row.items()}
          for k, row in out.items()}


def executed_update_flops(trainer, plen, rlen) -> float:
  """The update's FLOPs as its layout computes them: each group's prompt once under
  shared-prompt training (flops.shared_prompt_train_flops), else the trainer's model FLOPs."""
  from rlscale.metrics import flops
  total = 0.0
  for m in trainer.algo.models.values():
    g = m.batch.shared_prompt
    per = (flops.shared_prompt_train_flops(trainer.model_cfg, plen, rlen, g) if g > 1
           else flops.train_flops(trainer.model_cfg, plen + rlen))
    total += per * m.batch.num_epochs
  return total


def med(rows, key):
  vals = [r.get(key, 0.0) for r in rows]
  return statistics.median(vals), [min(vals), max(vals)]


def main(argv):
  del argv
  import jax
  import numpy as np
  from rlscale.metrics import flops
  from rlscale.run import logs
  from rlscale.trainer.loop import Loop
  logs.quiet_libraries()
  logging.set_verbosity(logging.WARNING)
  with tempfile.TemporaryDirectory() as workdir:
    trainer = make_trainer(workdir)
    cfg, run_dir = trainer.cfg, trainer.workdir
    if FLAGS.length_mean > 0:
      end_responses(trainer, response_lengths)
    phases = instrument(trainer) if FLAGS.phase_memory else None
    Loop(trainer, cfg, run_dir, cfg.train.num_steps, eval_at_start=False,
         written=trainer.run.raw).run()
    memory = phase_memory(trainer, *phases) if phases else None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f][2:-1]  # no compilation, no final eval and save
    rows_n = trainer.plan.responses
    plen = np.full(rows_n, FLAGS.prompt_len)
    step_flops = trainer.step_flops(plen, np.full(rows_n, FLAGS.new_tokens))
    executed = executed_update_flops(trainer, plen, np.full(rows_n, FLAGS.new_tokens))
    plan = trainer.plan.describe()
    trainer_epochs = sum(m.batch.num_epochs for m in trainer.algo.models.values())
    trainer_devices = trainer.meshes.trainer.size
  step_s, step_spread = med(rows, "time/step")
  update_keys = [k for k in rows[0] if k.endswith("_update")]
  update_times = [sum(r[k] for k in update_keys) for r in rows]
  update_s = statistics.median(update_times)
  out = {"benchmark": "rl_step", "algorithm": FLAGS.algorithm, "family": FLAGS.family,
         "dtype": FLAGS.dtype, "P": FLAGS.prompts, "G": FLAGS.group,
         "prompt_len": FLAGS.prompt_len, "new_tokens": FLAGS.new_tokens,
         "microbatch": {m: plan[m]["microbatch"] for m in ("actor", "critic") if m in plan},
         "microbatch_auto": not FLAGS.microbatch, "generation_batch": plan["generation_batch"],
         "step_s": step_s, "spread": {"step_s": step_spread},
         "responses_per_s": rows_n / step_s, "update_s": update_s,
         "update_tflops_per_s": step_flops["update"] / update_s / 1e12,
         "update_executed_tflops_per_s": executed / update_s / 1e12,
         "steps": len(rows), "devices": jax.device_count(), "roles": FLAGS.roles,
         "sampler_devices": FLAGS.sampler_devices if FLAGS.roles == "split" else None,
         "max_staleness": FLAGS.max_staleness, **memory_settings(trainer),
         "device_kind": jax.devices()[0].device_kind}
  for k in ["time/generate", "time/reward", "time/logprobs", "time/weight_sync",
            "time/other"] + update_keys:
    if k in rows[0]:
      name = k.split("/")[1] + "_s"
      out[name], out["spread"][name] = med(rows, k)
  out["spread"]["update_s"] = [min(update_times), max(update_times)]
  # Per trained token: the update's seconds over the rows' real tokens (prompt and response
  # tokens, padding left out), and over the tokens of the fixed shape (rows x (prompt + new)).
  epochs = trainer_epochs  # each epoch trains every token once more
  real = [r["train_tokens"] * epochs for r in rows]
  out["real_tokens_per_step"] = statistics.median(real)
  out["update_us_per_real_token"] = 1e6 * statistics.median(
      t / n for t, n in zip(update_times, real))
  out["update_us_per_shape_token"] = 1e6 * update_s / (
      rows_n * (FLAGS.prompt_len + FLAGS.new_tokens) * epochs)
  if FLAGS.length_mean > 0:  # the FLOP counts above are of the fixed shape
    for k in ("update_tflops_per_s", "update_executed_tflops_per_s"):
      out.pop(k)
    out["length_mean"], out["length_sigma"] = FLAGS.length_mean, FLAGS.length_sigma
    out["response_length_mean"] = statistics.median(r["response/length_mean"] for r in rows)
  peak = flops.peak(0, jax.devices()[0].device_kind)
  if peak and "update_executed_tflops_per_s" in out:  # over the trainer's devices' bf16 peak
    out["update_mfu"] = (out["update_executed_tflops_per_s"] * 1e12
                         / (peak * trainer_devices))
  if FLAGS.matmul:
    out["matmul_tflops_per_s"] = matmul_tflops(FLAGS.matmul, FLAGS.dtype)
    if "update_executed_tflops_per_s" in out:
      out["update_fraction_of_matmul"] = (out["update_executed_tflops_per_s"]
                                          / out["matmul_tflops_per_s"])
  out.update(peak_memory(), **({"memory": memory} if memory else {}))
  out["pack_responses"] = FLAGS.pack_responses
  packed = [r[k] for r in rows for k in r if k.endswith("/packed_rows_frac")]
  if packed:  # the packed rows over the padded rows, per shard (rl/packing.py)
    out["packed_rows_frac"] = statistics.median(packed)
  out["update_traces"] = {n: m.update.traces for n, m in trainer.algo.models.items()}
  out["loadavg_1m_at_end"] = os.getloadavg()[0]
  out["spread"] = {k: [round(v, 4) for v in vs] for k, vs in out["spread"].items()}
  print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}))


if __name__ == "__main__":
  app.run(main)

"""A real run at a real size: configs/grpo_math.py on a local Hugging Face folder; one JSON line.

    python -m tests.support.policy_folder /tmp/qwen05b --real_vocab     # Qwen2.5-0.5B-shaped, random
    python benchmarks/real_run.py --checkpoint=/tmp/qwen05b --remat=full --logprob_chunk=8192
    python benchmarks/real_run.py --checkpoint=/tmp/qwen05b --remat=none --logprob_chunk=0

Unlike benchmarks/rl_step.py (a random model and random-token prompts under the trainer),
this is the whole path a user's first run takes, as `launch/main.py` runs it: the checkpoint
and its tokenizer and chat template loaded from the folder, the committed GSM8K-style prompt
files, math-verify grading, an evaluation before the first step and after the last, the final
checkpoint and the export. It runs --steps steps (2) of --prompts x --group (4 x 4) responses
of --new_tokens (256) tokens after prompts left-padded to --prompt_len (128) tokens.

Per phase it reports the seconds of each step, and the memory rl_step.py reports (XLA's
analysis of the phase's compiled call, the host's peak RSS during the phase, the device's
peak where the backend gives one); `host_peak_rss_gb` is the whole process's peak, loading,
evaluation, checkpoint and export included. The shape, batch and memory flags are rl_step's.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import app, flags, logging

HERE = os.path.dirname(os.path.abspath(__file__))
import rl_step  # (its flags and its per-phase instruments)

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "a Hugging Face policy folder (tests/support/policy_folder.py)")
flags.DEFINE_integer("num_eval", 4, "held-out problems of each evaluation (greedy only)")
for name, value in (("prompts", 4), ("group", 4), ("prompt_len", 128), ("new_tokens", 256),
                    ("steps", 2), ("matmul", 0)):
  FLAGS.set_default(name, value)


def run_config(workdir: str):
  """configs/grpo_math.py on --checkpoint with the benchmark's sizes and memory settings."""
  from rlscale.config import files as config_files
  cfg = config_files.load(os.path.join(os.path.dirname(HERE), "configs", "grpo_math.py"))
  cfg.model.hf_checkpoint = FLAGS.checkpoint
  cfg.model.dtype, cfg.model.param_dtype = FLAGS.dtype, FLAGS.param_dtype or FLAGS.dtype
  if FLAGS.remat is not None:
    cfg.train.remat = FLAGS.remat
  if FLAGS.logprob_chunk is not None:
    cfg.train.logprob_chunk = FLAGS.logprob_chunk
  cfg.optim.state_dtype = FLAGS.state_dtype
  cfg.task.max_prompt_len, cfg.task.num_eval = FLAGS.prompt_len, FLAGS.num_eval
  cfg.rollout.max_new_tokens = FLAGS.new_tokens
  cfg.rl.num_prompts, cfg.rl.group_size = FLAGS.prompts, FLAGS.group
  if FLAGS.microbatch:
    cfg.rl.microbatch = FLAGS.microbatch
  cfg.train.num_steps, cfg.train.eval_every, cfg.train.checkpoint_every = FLAGS.steps, 0, 0
  cfg.train.tensorboard, cfg.train.log_every = False, 1
  cfg.eval.sampled, cfg.eval.generation_batch = False, FLAGS.num_eval
  return cfg


def run(workdir: str) -> dict:
  """Build, run and finish the trainer with per-phase instruments; the measured figures."""
  from rlscale.run import logs
  from rlscale.resolve import resolved
  from rlscale.run import base_policy
  from rlscale.trainer import rl_trainer as rl_loop
  from rlscale.trainer.loop import Loop
  logs.quiet_libraries()
  cfg = run_config(workdir)
  t0 = time.time()
  run = resolved.resolve(cfg, workdir)
  trainer = rl_loop.RLTrainer(run.with_base(base_policy.find_or_build(run)))
  build_s = time.time() - t0
  phases, seen = rl_step.instrument(trainer, skip=0)
  trainer.finish(*Loop(trainer, run.cfg, workdir, trainer.plan.num_steps,
                       eval_at_start=True, written=run.raw).run())
  memory = rl_step.phase_memory(trainer, phases, seen)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  steps = [r for r in rows if r["step"] > 0]
  times = {k: [round(r[k], 2) for r in steps] for k in sorted(steps[0]) if k.startswith("time/")}
  exported = sorted(os.listdir(os.path.join(workdir, "policy")))
  return {"build_s": round(build_s, 1), "wall_s": round(time.time() - t0, 1), "per_step": times,
          "eval_s": [round(r["time/eval"], 1) for r in rows if "time/eval" in r],
          "host_peak_gb_per_step": [round(r["memory/host_peak_gb"], 2) for r in steps],
          "batch": summary["batch"], "exported": exported, "memory": memory,
          **rl_step.memory_settings(trainer)}


def main(argv):
  del argv
  if not FLAGS.checkpoint:
    raise app.UsageError("--checkpoint=DIR: a policy folder (python -m tests.support.policy_folder DIR "
                         "--real_vocab writes a Qwen2.5-0.5B-shaped one)")
  import jax
  logging.set_verbosity(logging.WARNING)
  with tempfile.TemporaryDirectory() as workdir:
    out = {"benchmark": "real_run", "checkpoint": FLAGS.checkpoint, "P": FLAGS.prompts,
           "G": FLAGS.group, "prompt_len": FLAGS.prompt_len, "new_tokens": FLAGS.new_tokens,
           "dtype": FLAGS.dtype, "steps": FLAGS.steps, **run(os.path.join(workdir, "run")),
           "devices": jax.device_count(), "device_kind": jax.devices()[0].device_kind}
  out.update(rl_step.peak_memory())
  out["loadavg_1m_at_end"] = os.getloadavg()[0]
  print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}))


if __name__ == "__main__":
  app.run(main)

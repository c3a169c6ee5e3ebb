"""What measuring the gradient noise scale costs the default GRPO step; one JSON line.

    python benchmarks/noise_scale_overhead.py [--steps=30]

Runs configs/grpo.py from its cached base policy for --steps steps three times: with the noise
scale (rl.microbatch as the batch plan chooses it, 'auto' by default), without it at the same micro-batch (the
measurement's own cost: one squared norm per micro-batch), and without it with the whole
mini-batch in one micro-batch (the setting without any small batch). Overheads are differences
of median step times over the median step time without the measurement.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 30, "RL steps per measurement (the first 5 are not timed)")
flags.DEFINE_string("config", "configs/grpo.py", "the RL config to measure")
flags.DEFINE_string("cache_dir", None, "where the base policy is cached (default: the config's)")


def main(argv):
  del argv
  from rlscale.config import files as config_files
  from rlscale.run import logs
  from rlscale.run import train
  from rlscale.resolve import resolved
  logs.quiet_libraries()
  logging.set_verbosity(logging.WARNING)
  out = {}
  for name, noise, split in (("with_noise_scale", True, True), ("without", False, True),
                             ("without_one_microbatch", False, False)):
    cfg = config_files.load(FLAGS.config)
    if FLAGS.cache_dir:
      cfg.init.cache_dir = FLAGS.cache_dir
    plan = resolved.resolve(cfg, None).plan  # the run's own sizes: the auto micro-batch with the noise scale on
    cfg.noise.enabled = noise
    cfg.rl.microbatch = plan.main.microbatch if split else plan.main.minibatch
    cfg.train.num_steps, cfg.train.eval_every, cfg.train.checkpoint_every = FLAGS.steps, 0, 0
    cfg.train.tensorboard = False
    with tempfile.TemporaryDirectory() as workdir:
      train.main(cfg, workdir, FLAGS.config.partition(":")[0])
      with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][1:-1]  # steps, without the final evaluation
      rows = rows[5:] if len(rows) > 10 else rows[1:]  # steady state: no compilation
    out[name] = {k: statistics.median(r[k] for r in rows)
                 for k in ("time/step", "time/actor_update", "time/generate")}
    out[name]["microbatch"] = cfg.rl.microbatch
  with_ = out["with_noise_scale"]["time/step"]
  same, single = out["without"]["time/step"], out["without_one_microbatch"]["time/step"]
  print(json.dumps(dict(benchmark="noise_scale_overhead", steps=FLAGS.steps, **out,
                        overhead_of_step=round((with_ - same) / same, 4),
                        overhead_vs_one_microbatch=round((with_ - single) / single, 4))))


if __name__ == "__main__":
  app.run(main)

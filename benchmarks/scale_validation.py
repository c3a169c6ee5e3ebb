"""Validation of the throughput model (analysis/throughput/model.py); one JSON line per point.

    python benchmarks/scale_validation.py                       # 1, 2, 4, 8 simulated devices
    python benchmarks/scale_validation.py --devices=1,8 --steps=5 --calibrate_on=1
    python benchmarks/scale_validation.py --reuse --calibrate_on=1,8  # re-read, no new runs
    python benchmarks/scale_validation.py --published_only      # the published table only

Runs the RL main job (launch/main.py --config=configs/grpo.py, short: no periodic eval or
checkpoint) once per device count in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=N (a run directory already there is deleted
and measured again; --reuse re-reads it instead), calibrates the model on the counts of
--calibrate_on and predicts the step time of the others from their own configs. The simulated
devices share the host's cores: the `cpu` row gives them one shared compute rate, so N devices
add no compute. One count: the single-run calibration. Two or more (e.g. 2,4): each phase
also gets the host's per-device cost a + b·N, fitted to them (exact with two), so 1 and 8 are
extrapolations. Prints one line per count (calibration points marked) and a summary with the
largest error among the predicted counts. Times are medians of the steps past compilation;
run it on an idle machine for figures.

Then the published strong-scaling table (rlscale/data/published_scaling.json): the model is
calibrated on each model's smallest chip count (one factor on its datasheet efficiencies) and
predicts the larger ones.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

flags.DEFINE_list("devices", ["1", "2", "4", "8"], "simulated device counts")
flags.DEFINE_list("calibrate_on", ["1"], "the device counts the model is calibrated on "
                  "(one: single-run calibration; two or more: plus a per-device cost a + b·N)")
flags.DEFINE_bool("reuse", False, "re-read the run directories under --workdir, run nothing")
flags.DEFINE_integer("steps", 16, "RL steps per run (the first two compile; with 8 the "
                     "medians were noisy enough to move a prediction by 15%)")
flags.DEFINE_string("config", "configs/grpo.py", "the RL config")
flags.DEFINE_string("workdir", "/tmp/scale_validation", "run directories go here")
flags.DEFINE_bool("published_only", False, "only the published table")
FLAGS = flags.FLAGS
PHASES = ("generate", "train", "fixed")


def run_job(devices: int) -> str:
  """One short RL run on `devices` simulated devices; its run directory."""
  out = os.path.join(FLAGS.workdir, f"d{devices}")
  if FLAGS.reuse:
    if not os.path.exists(os.path.join(out, "summary.json")):
      raise SystemExit(f"error: --reuse: {out} has no summary.json; run without --reuse "
                       f"to measure it")
    return out
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  cmd = [sys.executable, os.path.join(REPO, "launch", "main.py"), f"--config={FLAGS.config}",
         f"--workdir={out}", f"--config.train.num_steps={FLAGS.steps}",
         "--config.train.eval_every=0", "--config.train.checkpoint_every=0",
         "--config.train.tensorboard=False"]
  shutil.rmtree(out, ignore_errors=True)  # a fresh run: a restarted one would resume
  before = os.getloadavg()[0]
  subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, timeout=1800)
  with open(os.path.join(out, "loadavg.json"), "w") as f:  # how busy the host was
    json.dump({"before": before, "after": os.getloadavg()[0]}, f)
  return out


def loadavg(run_dir: str) -> dict:
  p = os.path.join(run_dir, "loadavg.json")
  if not os.path.exists(p):
    return {}
  with open(p) as f:
    return json.load(f)


def point(n: int, run, p, on: list[int], loadavg_1m: dict) -> dict:
  """One device count's JSON line: measured and predicted step and phases."""
  m = run.measured
  return {"benchmark": "scale_validation", "devices": n, "calibrated_on": on,
          "calibration_point": n in on, "measured_step_s": round(m.step, 4),
          "predicted_step_s": round(p.step, 4), "rel_error": round(p.step / m.step - 1, 4),
          "measured": {"generate": round(m.generate, 4), "train": round(m.train, 4),
                       "fixed": round(m.reward + m.other, 4)},
          "predicted": {"generate": round(p.generate, 4), "train": round(p.train, 4),
                        "fixed": round(p.fixed, 4)},
          "loadavg_1m": loadavg_1m}


def summary(rows: list[dict], cal, on: list[int]) -> dict:
  """The largest error among the predicted (non-calibration) counts, and the fitted b."""
  pred = [r for r in rows if not r["calibration_point"]]
  worst = max(pred, key=lambda r: abs(r["rel_error"])) if pred else None
  per = cal.per_device
  return {"benchmark": "scale_validation_summary", "calibrated_on": on,
          "calibration": cal.source, "predicted_devices": [r["devices"] for r in pred],
          "max_abs_rel_error": worst and abs(worst["rel_error"]),
          "at_devices": worst and worst["devices"], "rel_error": worst and worst["rel_error"],
          "per_device_s": {k: round(getattr(per, k)[1], 5) for k in PHASES}}


def simulated() -> None:
  from analysis.throughput import accelerators
  from analysis.throughput import calibration as tc
  from analysis.throughput import model as tm
  on = sorted({int(n) for n in FLAGS.calibrate_on})
  counts = sorted({int(n) for n in FLAGS.devices} | set(on))
  runs = {n: tc.load_run(run_job(n)) for n in counts}
  tc.same_config(list(runs.values()))
  pairs = [(runs[n].workload, runs[n].measured) for n in on]
  cal, acc = tc.calibrate_runs(pairs, accelerators.get("cpu"))
  rows = []
  for n, run in runs.items():
    m = run.measured
    p = tm.predict(run.workload, acc, cal, m.chips, m.layout, m.sampler, m.staleness)
    rows.append(point(n, run, p, on, loadavg(run.path)))
    print(json.dumps(rows[-1]))
  print(json.dumps(summary(rows, cal, on)))


def main(argv):
  del argv
  from analysis.throughput.published import published
  if not FLAGS.published_only:
    simulated()
  for row in published():
    print(json.dumps({"benchmark": "scale_validation_published", **row}))
  assert all(math.isfinite(r["predicted_hours"]) for r in published())


if __name__ == "__main__":
  app.run(main)

"""Predicted step time and time to target of a run's RL step against the number of chips.

    python analysis/scale.py RUN_DIR --chips 1,8,64,512,1024 --accelerator h200 \
        [--layout colocated|split|both] [--overlap] [--prompts P --group G] \
        [--bcrit B --smin S] [--run_accelerator cpu] [--out DIR]

The model (rlscale/throughput_model.py) is calibrated (rlscale/throughput_calibration.py) on RUN_DIR's median step past compilation
on the accelerator it ran on (--run_accelerator, default cpu), then applied to --accelerator.
Prints a table (chips, layout, generate/train/sync/fixed/step seconds, speedup and efficiency
against the first chip count, time to target, what bounds the point), the calibration point's
prediction against its measurement, and writes scale.csv, scale.png and scale.pdf under --out
(default RUN_DIR/scale): speedup vs chips, log-log, the ideal line, bends annotated.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rlscale
import figures  # noqa: E402  (Agg backend, deterministic PDFs)
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from rlscale import accelerators  # noqa: E402
from rlscale import throughput_calibration as tc  # noqa: E402
from rlscale import throughput_model as tm  # noqa: E402

COLUMNS = ["chips", "layout", "sampler", "trainer", "generate", "train", "allreduce", "sync",
           "fixed", "step", "speedup", "efficiency", "steps_to_target", "time_to_target",
           "gen_rows_per_chip", "critical_gen_batch", "train_rows_per_chip", "bend", "reason"]


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("run_dir")
  p.add_argument("--chips", default="1,8,64,512,1024", help="comma-separated chip counts")
  p.add_argument("--accelerator", default="h200", help="a row of rlscale/data/accelerators.json")
  p.add_argument("--run_accelerator", default="cpu", help="where RUN_DIR ran")
  p.add_argument("--layout", default="both", choices=["colocated", "split", "both"])
  p.add_argument("--overlap", action="store_true", help="split: generation overlaps training")
  p.add_argument("--prompts", type=int, default=0, help="P (default: the run's)")
  p.add_argument("--group", type=int, default=0, help="G (default: the run's)")
  p.add_argument("--bcrit", type=float, default=0.0, help="B_crit, responses per optimizer step")
  p.add_argument("--smin", type=float, default=0.0, help="S_min, optimizer steps")
  p.add_argument("--out", default="", help="folder for scale.csv/png/pdf (default RUN_DIR/scale)")
  return p.parse_args(argv)


def calibrated(run: tc.Run, run_acc: str, target: str):
  """(calibration on the run's accelerator, that accelerator, the target's calibration and
  accelerator)."""
  cal, racc = tc.calibrate(run.workload, run.measured, accelerators.get(run_acc))
  tacc = accelerators.get(target)
  if tacc.peak_flops is None:  # the cpu row as the target: the run's calibrated host
    tacc = tacc.with_peak(racc.peak_flops) if tacc.name == racc.name else None
    if tacc is None:
      raise ValueError(f"accelerator {target!r} has no peak; calibrate it from a run on it")
  return cal, racc, tc.transfer(cal, racc, tacc, run.workload), tacc


def table(run: tc.Run, w: tm.Workload, cal, acc, chips: list[int], layouts: list[str],
          overlap: bool, steps: float | None) -> pd.DataFrame:
  rows = []
  base = tm.predict(w, acc, cal, chips[0], "colocated")  # every layout's speedup is against it
  for layout in layouts:
    preds = [tm.predict(w, acc, cal, n, layout, overlap=overlap) for n in chips
             if layout == "colocated" or n >= 2]
    if not preds:
      continue
    bent = set(tm.bends(preds))
    for i, p in enumerate(preds):
      r = p.row()
      sp = base.step / p.step
      r.update(speedup=sp, efficiency=sp / (p.chips / base.chips), bend=i in bent,
               steps_to_target=steps, time_to_target=steps * p.step if steps else None)
      rows.append(r)
  return pd.DataFrame(rows, columns=COLUMNS)


def figure(df: pd.DataFrame, out: str, title: str) -> list[str]:
  fig, ax = plt.subplots(figsize=(7.5, 5))
  lo, hi = df.chips.min(), df.chips.max()
  for k, (layout, g) in enumerate(df.groupby("layout", sort=False)):
    ax.plot(g.chips, g.speedup, marker="o", ms=4, label=layout)
    for _, r in g[g.bend].iterrows():  # colocated's reasons below the curve, split's above
      ax.annotate(f"{layout}: {r.reason[:70]}", (r.chips, r.speedup), fontsize=6,
                  xytext=(4, -12 if k == 0 else 10), textcoords="offset points")
  ax.plot([lo, hi], [1, hi / lo], color="black", ls="--", lw=1, label="ideal")
  ax.set(xscale="log", yscale="log", xlabel="chips",
         ylabel=f"speedup of the RL step vs colocated on {lo} chip(s)",
         title=title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  data = df.assign(panel="speedup", series=df.layout, x=df.chips, y=df.speedup)
  return figures.save(fig, data, out, "scale")


def _fmt(df: pd.DataFrame) -> str:
  show = df[["chips", "layout", "sampler", "trainer", "generate", "train", "sync", "fixed",
             "step", "speedup", "efficiency", "time_to_target", "bend", "reason"]]
  return show.to_string(index=False, float_format=lambda v: f"{v:.4g}",
                        formatters={"reason": lambda s: f"{s}"})


def main(argv=None) -> int:
  a = parse(argv)
  run = tc.load_run(a.run_dir)
  w = run.workload
  if a.prompts or a.group:
    p = a.prompts or run.summary.get("num_prompts") or w.responses
    g = a.group or run.summary.get("group_size") or 1
    w = w.with_responses(p * g)
  cal, racc, tcal, tacc = calibrated(run, a.run_accelerator, a.accelerator)
  m = run.measured
  own = tm.predict(run.workload, racc, cal, m.chips, m.layout, m.sampler, m.overlap)
  err = own.step / m.step - 1
  print(f"calibration on {run.path}: {m.chips} {racc.name} device(s), {m.layout}; measured "
        f"step {m.step:.4g} s, predicted {own.step:.4g} s ({err:+.1%})")
  if abs(err) > 0.25:
    print(f"warning: the prediction of the measured layout is off by {err:+.0%} (> 25%): the "
          f"phases' medians do not add up to the step's (time outside the logged phases)")
  print(f"  e_train {cal.e_train:.3g}, e_flops {cal.e_flops:.3g}, e_bw {cal.e_bw:.3g}, "
        f"t_lat {cal.t_lat:.3g} s/decode step, reward {cal.reward_per_response:.3g} s/response, "
        f"other {cal.other:.3g} s")
  print(f"on {tacc.name}: efficiencies from {tcal.source} (e_train {tcal.e_train:.3g}, e_flops "
        f"{tcal.e_flops:.3g}, e_bw {tcal.e_bw:.3g}, t_lat {tcal.t_lat:.3g} s); host costs as "
        f"measured")
  batch = run.batch * w.responses / run.workload.responses
  steps, how = tm.steps_to_target(run.summary.get("responses_to_target"), w.responses, batch,
                                  w.optimizer_steps, a.bcrit, a.smin)
  print(f"steps to target at {w.responses} responses/step: "
        f"{'n/a' if steps is None else f'{steps:.4g}'} ({how})")
  layouts = ["colocated", "split"] if a.layout == "both" else [a.layout]
  chips = sorted({int(c) for c in a.chips.split(",")})
  df = table(run, w, tcal, tacc, chips, layouts, a.overlap, steps)
  print(_fmt(df))
  out = a.out or os.path.join(a.run_dir, "scale")
  os.makedirs(out, exist_ok=True)
  paths = figure(df, out, f"{tacc.name}: {w.responses} responses/step")
  print("wrote " + ", ".join(paths))
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except ValueError as e:  # a user's mistake: one line
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)

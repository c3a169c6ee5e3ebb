"""Compare runs of different batch sizes: sample efficiency, system efficiency, time-to-target.

    python analysis/compare_runs.py runs/p16 runs/p64 --reference runs/p16 [--plot curves.png]
    python analysis/compare_runs.py runs/bi --only='lr_scaling=sqrt,seed=0$' \
        --reference='runs/bi/p=64,lr_scaling=sqrt,seed=0'       # a sweep's done points

For each run: B (responses per optimizer step, also in prompts; rlscale/batch.py), effective lr, responses_to_target, time_to_target (and both
relative to the reference), mean throughput, final B_simple. A run is *invariant* when its
responses_to_target is within --rtt_tolerance (default 20%) of the reference's and its
evaluation curve stays within --band (default 0.05) of the reference's at equal responses_seen
(DESIGN.md); the critical training batch is the largest invariant B. With three or more runs that reached
the target, the steps-samples trade-off S = S_min + E_min / B is fitted, with S the actor's
optimizer steps to target and B responses per optimizer step (the batch the LR rules and
B_simple use), and B_crit = E_min / S_min printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rlscale
from runs import Run, expand, load  # noqa: E402


def band_gap(run: Run, ref: Run, metric: str) -> float | None:
  """Largest |run - ref| of `metric` at the responses_seen both evaluated at."""
  a, b = dict(run.curve(metric)), dict(ref.curve(metric))
  common = sorted(set(a) & set(b))
  return max(abs(a[x] - b[x]) for x in common) if common else None


def fit_tradeoff(batches, steps):
  """(S_min, E_min, B_crit) from S = S_min + E_min / B by least squares."""
  x = 1.0 / np.asarray(batches, float)
  A = np.stack([np.ones_like(x), x], axis=1)
  (s_min, e_min), *_ = np.linalg.lstsq(A, np.asarray(steps, float), rcond=None)
  return float(s_min), float(e_min), float(e_min / s_min) if s_min > 0 else float("inf")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("runs", nargs="+", help="run directories, or sweep directories (sweep.json)")
  ap.add_argument("--only", help="only the runs whose directory name matches this regex")
  ap.add_argument("--reference", help="the run the others are compared with (default: first)")
  ap.add_argument("--metric", default=None, help="curve metric (default: the runs' target)")
  ap.add_argument("--band", type=float, default=0.05)
  ap.add_argument("--rtt_tolerance", type=float, default=0.2)
  ap.add_argument("--plot", help="write the curves to this PNG (needs matplotlib)")
  args = ap.parse_args(argv)
  paths = expand(args.runs, args.only)
  if not paths:
    ap.error(f"no runs in {args.runs}" + (f" match --only={args.only!r}" if args.only else ""))
  runs = [load(p) for p in paths]
  ref = load(args.reference) if args.reference else runs[0]
  metric = args.metric or ref.summary.get("target", {}).get("metric", "eval/accuracy_greedy")
  rows = []
  for run in sorted(runs, key=lambda r: r.batch):
    s = run.summary
    rtt, ttt = s.get("responses_to_target"), s.get("time_to_target")
    ref_rtt, ref_ttt = ref.summary.get("responses_to_target"), ref.summary.get("time_to_target")
    gap = band_gap(run, ref, metric)
    invariant = (rtt is not None and ref_rtt and abs(rtt / ref_rtt - 1) <= args.rtt_tolerance
                 and gap is not None and gap <= args.band)
    rows.append(dict(
        run=run.name, batch=run.batch, batch_prompts=run.plan.batch_prompts,
        responses_per_step=run.responses_per_step, lr=run.last("actor/lr"),
        optimizer_steps_to_target=run.optimizer_steps(rtt) if rtt else None,
        responses_to_target=rtt, time_to_target=ttt,
        rtt_vs_ref=rtt / ref_rtt if rtt and ref_rtt else None,
        ttt_vs_ref=ttt / ref_ttt if ttt and ref_ttt else None,
        final=run.last(metric), curve_gap=gap, invariant=bool(invariant),
        responses_per_s=s.get("responses_per_s"),
        gen_tokens_per_s=run.mean("throughput/gen_tokens_per_s"),
        grad_norm=run.mean("actor/grad_norm"),
        b_simple_responses=run.last("actor/noise_responses/b_simple"),
        b_simple_prompts=run.last("actor/noise_prompts/b_simple")))
    print(json.dumps(rows[-1]))
  inv = [r["batch"] for r in rows if r["invariant"]]
  out = dict(metric=metric, band=args.band, rtt_tolerance=args.rtt_tolerance,
             critical_training_batch=max(inv) if inv else None)
  reached = [(r["batch"], r["optimizer_steps_to_target"]) for r in rows
             if r["responses_to_target"]]
  if len(reached) >= 3:
    s_min, e_min, b_crit = fit_tradeoff(*zip(*reached))
    out.update(s_min=s_min, e_min=e_min, b_crit=b_crit)
  print(json.dumps(out))
  if args.plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for run in sorted(runs, key=lambda r: r.batch):
      x, y = zip(*run.curve(metric)) if run.curve(metric) else ((), ())
      ax.plot(x, y, marker="o", label=f"B={run.batch} responses/optimizer step")
    ax.set_xlabel("responses seen")
    ax.set_ylabel(metric)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
  main()

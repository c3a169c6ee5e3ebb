"""Compare a few runs of different batch sizes: sample efficiency, system efficiency, time to
target, as report.py measures them, without a study around them.

    python analysis/compare_runs.py runs/p16 runs/p64 --reference runs/p16 [--plot curves.png]
    python analysis/compare_runs.py runs/bi --only='lr_scaling=sqrt,seed=0$' \\
        --reference='runs/bi/p=64,lr_scaling=sqrt,seed=0'
    python analysis/compare_runs.py runs/ds --x trained   # responses that entered an update

For each run: B (responses per optimizer step, also in prompts; rlscale/plan/batch.py), effective lr,
responses to target (the first crossing of its evaluations, rlscale/metrics/crossing.py:
it does not depend on how often the run evaluates) and time to target (that over the run's
responses per second), both relative to the reference, its optimizer steps to target, and its
final B_simple. A run is *invariant* (one-sided) when it needs at most
(1 + --rtt_tolerance) x the reference's responses and its curve is nowhere more than --band
below the reference's at equal responses seen; the critical training batch is the largest
invariant B. With three or more batches that reached the target, E(B) = E_min (1 + B/B_crit) is
fitted (analysis/fits.py) and printed with its diagnostics. One run per batch has no seeds to
give intervals: use analysis/report.py on a sweep for those.

--x is the sample axis every count of responses is on (curves, responses, steps and time to
target, the plot): `generated` (default; responses_seen, every response sampled) or `trained`
(responses_trained, those that entered an update; responses_seen for runs without it). Each
printed line says it (sample_axis). Each run's line also gives its dynamic sampling setting
(rollout.dynamic_sampling: groups whose rewards are all equal dropped and refilled; "filtered"
in the plot) and its effective batch (the mean of rollout/effective_batch up to its crossing;
null when not logged). Runs with and without dynamic sampling are compared as given: label
them apart with --only.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from analysis import fits
from analysis.arguments import at_least
from analysis import study_table as st
from analysis.runs import AXES, GENERATED, axis_label, expand


def shortfall(run, ref, metric: str, x: str = GENERATED) -> float | None:
  """How far `run`'s curve falls below `ref`'s at equal responses on axis `x` (negative:
  above)."""
  import pandas as pd
  def curve(r):
    at, y = st.eval_curve(r, metric, x)
    return pd.DataFrame({"responses": at, "median": y})
  gap = st.curve_shortfall(curve(run), curve(ref))
  return None if np.isnan(gap) else gap


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("runs", nargs="+", help="run directories, or sweep directories (sweep.json)")
  ap.add_argument("--only", help="only the runs whose directory name matches this regex")
  ap.add_argument("--reference", help="the run the others are compared with (default: first)")
  ap.add_argument("--metric", default=None, help="curve metric (default: the runs' target)")
  ap.add_argument("--target", type=float, default=None, help="default: the reference's target")
  ap.add_argument("--band", type=at_least(0), default=0.05,
                  help="how far below the reference's curve an invariant run may fall")
  ap.add_argument("--rtt_tolerance", type=at_least(0), default=0.2,
                  help="how many more responses to target than the reference's, as a fraction")
  ap.add_argument("--x", choices=sorted(AXES), default=GENERATED,
                  help="the sample axis: responses generated (responses_seen; default) or "
                  "trained (responses_trained)")
  ap.add_argument("--plot", help="write the curves to this PNG (needs matplotlib)")
  args = ap.parse_args(argv)
  paths = expand(args.runs, args.only)
  if not paths:
    ap.error(f"no runs in {args.runs}" + (f" match --only={args.only!r}" if args.only else ""))
  runs = []
  for p in paths:
    run, warnings = st.load_run(p)
    for w in warnings:  # a run that cannot be read is named and left out, not fatal
      print(f"warning: {w}" + ("; left out" if run is None else ""), file=sys.stderr)
    if run is not None:
      runs.append(run)
  if not runs:
    ap.error(f"no run with a config.json in {args.runs}")
  ref, why = st.load_run(args.reference) if args.reference else (runs[0], [])
  if ref is None:
    ap.error(f"--reference={args.reference}: {'; '.join(why)}")
  metric = args.metric or ref.config.get("target", {}).get("metric", "eval/accuracy_greedy")
  target = ref.config.get("target", {}).get("value", 0.6) if args.target is None else args.target
  ax = args.x
  ref_rtt = st.responses_to_target(ref, metric, target, ax)
  ref_ttt = ref_rtt / st.steady_throughput(ref, ax)
  rows = []
  for run in sorted(runs, key=lambda r: r.batch):
    rtt = st.responses_to_target(run, metric, target, ax)
    ttt = rtt / st.steady_throughput(run, ax)
    gap = shortfall(run, ref, metric, ax)
    b_eff = st.effective_batch(run, rtt + st.warmup_responses(run, ax), ax)
    reached = np.isfinite(rtt) and np.isfinite(ref_rtt)
    invariant = bool(reached and rtt / ref_rtt <= 1 + args.rtt_tolerance
                     and (gap is None or gap <= args.band))
    rows.append(dict(
        run=run.name, dynamic_sampling=run.dynamic_sampling, sample_axis=ax, batch=run.batch,
        effective_batch=b_eff if np.isfinite(b_eff) else None,
        batch_prompts=run.plan.batch_prompts,
        responses_per_step=run.responses_per_step, lr=st.lr_of(run),
        optimizer_steps_to_target=run.optimizer_steps(rtt, ax) if np.isfinite(rtt) else None,
        responses_to_target=rtt if np.isfinite(rtt) else None,
        time_to_target=ttt if np.isfinite(ttt) else None,
        rtt_vs_ref=rtt / ref_rtt if reached else None,
        ttt_vs_ref=ttt / ref_ttt if reached else None,
        final=run.last(metric), curve_shortfall=gap, invariant=invariant,
        responses_per_s=run.summary.get("responses_per_s"),
        gen_tokens_per_s=run.mean("throughput/gen_tokens_per_s"),
        grad_norm=run.mean("actor/grad_norm"),
        b_simple_responses=run.last("actor/noise_responses/b_simple"),
        b_simple_prompts=run.last("actor/noise_prompts/b_simple")))
    print(json.dumps(rows[-1]))
  # The largest B reached from the reference's through invariant batches only.
  largest = ref.batch if any(r["invariant"] for r in rows) else None
  for r in rows:
    if r["batch"] > ref.batch:
      if not r["invariant"]:
        break
      largest = r["batch"]
  out = dict(metric=metric, target=target, sample_axis=ax, band=args.band,
             rtt_tolerance=args.rtt_tolerance, critical_training_batch=largest)
  reached: dict[int, list] = {}
  for r in rows:
    if r["responses_to_target"] is not None:
      reached.setdefault(r["batch"], []).append(r["responses_to_target"])
  if len(reached) >= 3:
    f = fits.critical_batch(reached, reps=200, min_seeds=1)
    out.update({k: f.get(k) for k in ("b_crit", "e_min", "s_min", "residual", "identified")},
               reasons=f["reasons"])
  print(json.dumps(out))
  if args.plot:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(figsize=(6, 4))
    for run in sorted(runs, key=lambda r: r.batch):
      x, y = zip(*run.curve(metric, ax)) if run.curve(metric, ax) else ((), ())
      axes.plot(x, y, marker="o", label=f"B={run.batch} responses/optimizer step"
                + (" filtered" if run.dynamic_sampling else ""))
    axes.set_xlabel(axis_label(ax))
    axes.set_ylabel(metric)
    axes.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)


if __name__ == "__main__":
  main()

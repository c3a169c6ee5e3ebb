"""Predicted step time and time to target of a run's RL step against the number of chips.

    python analysis/scale.py RUN_DIR [RUN_DIR ...] --chips 1,8,64,512,1024 --accelerator h200 \
        [--model NAME|HF_FOLDER|config.json] [--dtype bfloat16] [--prompts P --group G] \
        [--max_new_tokens T --prompt_len L --response_len R] \
        [--layout colocated|split|both] [--max_staleness 0,1,4] [--gen_cv CV] \
        [--bcrit B --smin S] \
        [--run_accelerator cpu] [--out DIR]

The model (analysis/throughput/model.py) is calibrated (analysis/throughput/calibration.py) on
RUN_DIR's median step past compilation on the accelerator it ran on (--run_accelerator, default
cpu), then applied to --accelerator. Several RUN_DIRs of one config at different device
counts on the shared host (cpu) add its per-device cost, a + b·N seconds per phase fitted to
them (exact with two): the host's, kept for a cpu target and dropped for a GPU/TPU one; the
first RUN_DIR gives the workload, steps to target and the default --out. The efficiencies,
decode latency and host costs (reward per response, other per step) come from the run (with
several: the one with the fewest devices); the FLOPs and bytes from --model (default the run's)
at the sequence lengths given (default the run's), with the run's training passes per response
(update epochs, extra forwards) and optimizer steps per RL step.
Split, each --max_staleness k gives a series: k = 0 decodes and trains in turn, k >= 1 lets
the sampler run up to k steps ahead of the trainer (rollout.max_staleness), the step then
max(generate, train + sync) when decode time is constant and, when it varies from step to step
(--gen_cv, default the run's own sd / mean of time/generate; 0 for a run that was itself stale
or refilled, whose time/generate is a wait), a pipeline simulated step by step whose step falls
toward that bound as k grows (model.pipelined). Colocated is one series at any k.
Prints a table (chips, layout, generate/train/sync/fixed/step seconds, speedup and efficiency
against the first chip count, time to target, what bounds the point), the calibration point's
prediction against its measurement, and writes scale.csv, scale.png and scale.pdf under --out
(default RUN_DIR/scale): speedup vs chips, log-log, the ideal line, bends annotated.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap

from analysis.arguments import at_least
from analysis import figures  # (Agg backend, deterministic PDFs)
import matplotlib.pyplot as plt
import pandas as pd

from analysis.throughput import accelerators
from analysis.throughput import calibration as tc
from analysis.throughput import model as tm

COLUMNS = ["chips", "layout", "sampler", "trainer", "generate", "train", "allreduce", "sync",
           "fixed", "step", "speedup", "efficiency", "steps_to_target", "time_to_target",
           "gen_rows_per_chip", "critical_gen_batch", "train_rows_per_chip", "bend", "reason"]


def _chip_counts(text: str) -> list[int]:
  """--chips: positive whole numbers, comma-separated (argparse names the flag on an error)."""
  out = []
  for part in text.split(","):
    try:
      n = int(part)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{part.strip()!r} in {text!r} is not a whole number of "
                                       "chips") from None
    if n < 1:
      raise argparse.ArgumentTypeError(f"{n} in {text!r}: a chip count is at least 1")
    out.append(n)
  return sorted(set(out))


def _staleness(text: str) -> list[int]:
  try:
    ks = [int(v) for v in text.split(",")]
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers >= 0") from None
  if not ks or min(ks) < 0:
    raise argparse.ArgumentTypeError(f"{text!r}: comma-separated integers >= 0")
  return ks


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                 help="a run directory; several of one config at different device counts fit "
                 "the shared host's per-device cost")
  p.add_argument("--chips", default="1,8,64,512,1024", type=_chip_counts,
                 help="comma-separated chip counts")
  p.add_argument("--accelerator", default="h200", help="a row of analysis/throughput/accelerators.json")
  p.add_argument("--run_accelerator", default="cpu", help="where RUN_DIR ran")
  p.add_argument("--layout", default="both", choices=["colocated", "split", "both"])
  p.add_argument("--max_staleness", default="0", type=_staleness,
                 help="comma-separated k of rollout.max_staleness: a split series each")
  p.add_argument("--overlap", action="store_true", help="the same as --max_staleness=1")
  p.add_argument("--gen_cv", type=at_least(0.0, float), default=None,
                 help="the decode time's sd / mean over steps (default: the run's)")
  p.add_argument("--prompts", type=at_least(0, int), default=0,
                 help="P (default: the run's)")
  p.add_argument("--group", type=at_least(0, int), default=0,
                 help="G (default: the run's)")
  p.add_argument("--model", default="", help="a named size (rlscale.models.NAMED) or a Hugging "
                 "Face folder or config.json to predict for (default: the run's model)")
  p.add_argument("--dtype", default="", help="the model's parameters and activations (default: "
                 "bfloat16 for --model, else the run's)")
  p.add_argument("--max_new_tokens", type=at_least(0, int), default=0,
                 help="decode steps per call (default: "
                 "the run's); responses run to it unless --response_len")
  p.add_argument("--prompt_len", type=at_least(0, float), default=0,
                 help="mean prompt tokens (default: the "
                 "run's)")
  p.add_argument("--response_len", type=at_least(0, float), default=0,
                 help="mean response tokens (default: "
                 "--max_new_tokens if given, else the run's)")
  p.add_argument("--bcrit", type=at_least(0, float), default=0.0,
                 help="B_crit, responses per optimizer step")
  p.add_argument("--smin", type=at_least(0, float), default=0.0,
                 help="S_min, optimizer steps")
  p.add_argument("--out", default="", help="folder for scale.csv/png/pdf (default: the first "
                 "RUN_DIR/scale)")
  return p.parse_args(argv)


def calibrated(runs: list[tc.Run], run_acc: str, target: str):
  """(calibration on the runs' accelerator, that accelerator, the target accelerator)."""
  pairs = [(r.workload, r.measured) for r in runs]
  cal, racc = tc.calibrate_runs(pairs, accelerators.get(run_acc))
  tacc = accelerators.get(target)
  if tacc.peak_flops is None:  # the cpu row as the target: the run's calibrated host
    tacc = tacc.with_peak(racc.peak_flops) if tacc.name == racc.name else None
    if tacc is None:
      raise ValueError(f"accelerator {target!r} has no peak; calibrate it from a run on it")
  return cal, racc, tacc


def target(a: argparse.Namespace, run: tc.Run) -> tuple[tm.Workload, str]:
  """The workload to predict (the model, sequence lengths and P x G asked for) and its name."""
  w, name = run.workload, "the run's model"
  if a.model or a.dtype or a.max_new_tokens or a.prompt_len or a.response_len:
    dtype = a.dtype or ("bfloat16" if a.model else run.model.param_dtype)
    cfg = (tc.model_config(a.model, dtype) if a.model else
           run.model.replace(dtype=dtype, param_dtype=dtype))
    w = tc.for_model(w, cfg, a.prompt_len, a.max_new_tokens, a.response_len)
    name = f"{_label(a.model) if a.model else name} ({dtype})"
  if a.prompts or a.group:
    p = a.prompts or run.summary.get("num_prompts") or run.workload.responses
    g = a.group or run.summary.get("group_size") or 1
    w = w.with_responses(p * g)
  return w, name


def table(run: tc.Run, w: tm.Workload, cal, acc, chips: list[int], layouts: list[str],
          staleness: list[int], steps: float | None) -> pd.DataFrame:
  rows = []
  base = tm.predict(w, acc, cal, chips[0], "colocated")  # every layout's speedup is against it
  series = [(layout, k) for layout in layouts
            for k in ([0] if layout == "colocated" else staleness)]
  for layout, k in series:
    preds = [tm.predict(w, acc, cal, n, layout, staleness=k) for n in chips
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


def _kinds(reason: str) -> dict[str, str]:
  """The bounds a reason names, by kind ('decode latency-bound', 'gradient all-reduce over
  inter-node links', ...); a bare 'train 75% of step' names none."""
  parts = [q.strip() for q in reason.split(";")]
  return {q.split(":")[0]: q for q in parts if ":" in q or "bound" in q}


def marks(df: pd.DataFrame) -> pd.Series:
  """What to write at each point: at a bend its reason, elsewhere a bound first named there."""
  out = pd.Series("", index=df.index)
  for _, g in df.groupby("layout", sort=False):
    seen: set[str] = set()
    for i, r in g.iterrows():
      kinds = _kinds(r.reason)
      new = [v for k, v in kinds.items() if k not in seen]
      if r.bend or new:
        out[i] = ("bends: " + r.reason) if r.bend else "; ".join(new)
      seen |= set(kinds)
  return out


def figure(df: pd.DataFrame, out: str, title: str) -> list[str]:
  fig, ax = plt.subplots(figsize=(8, 6))
  lo, hi = df.chips.min(), df.chips.max()
  notes, lines = marks(df), []
  for k, (layout, g) in enumerate(df.groupby("layout", sort=False)):
    (line,) = ax.plot(g.chips, g.speedup, marker="o", ms=4, label=layout)
    for i, r in g[notes[g.index] != ""].iterrows():
      lines.append(f"{len(lines) + 1}. {layout}, {r.chips} chips, {r.efficiency:.0%} efficient: "
                   f"{notes[i]}")
      ax.annotate(str(len(lines)), (r.chips, r.speedup), xytext=(-4, 7 if k == 0 else -13),
                  textcoords="offset points", fontsize=7, color=line.get_color(),
                  fontweight="bold")
  ax.plot([lo, hi], [1, hi / lo], color="black", ls="--", lw=1, label="ideal")
  ax.text(0.99, 0.01, "\n".join(textwrap.fill(t, 72, subsequent_indent="    ") for t in lines),
          transform=ax.transAxes, ha="right", va="bottom", fontsize=6.5, multialignment="left",
          bbox=dict(facecolor="white", alpha=0.9, edgecolor="0.8"))
  ax.set(xscale="log", yscale="log", xlabel="chips",
         ylabel=f"speedup of the RL step vs colocated on {lo} chip(s)")
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="upper left")
  fig.tight_layout()
  data = df.assign(panel="speedup", series=df.layout, x=df.chips, y=df.speedup, note=notes)
  return figures.save(fig, data, out, "scale")


def _fmt(df: pd.DataFrame) -> str:
  show = df[["chips", "layout", "sampler", "trainer", "generate", "train", "sync", "fixed",
             "step", "speedup", "efficiency", "time_to_target", "bend", "reason"]]
  return show.to_string(index=False, float_format=lambda v: f"{v:.4g}",
                        formatters={"reason": lambda s: f"{s}"})


def _label(model: str) -> str:
  """A named size as is; a Hugging Face folder or config.json by its folder's name."""
  path = os.path.normpath(model)
  return os.path.basename(os.path.dirname(path) if path.endswith("config.json") else path)


def report_calibration(runs: list[tc.Run], cal, racc) -> None:
  for run in runs:
    report_run(run, cal, racc)
  print(f"  e_train {cal.e_train:.3g}, e_flops {cal.e_flops:.3g}, e_bw {cal.e_bw:.3g}, "
        f"t_lat {cal.t_lat:.3g} s/decode step, reward {cal.reward_per_response:.3g} s/response, "
        f"other {cal.other:.3g} s/step, weight sync x{cal.sync_scale:.3g} of modelled")
  d = cal.per_device
  how = ("one run: no per-device cost (b = 0)" if len(runs) == 1 else
         f"{cal.source}; the shared host's cost on N devices, s: " + ", ".join(
             f"{k} {getattr(d, k)[0]:+.3g} {getattr(d, k)[1]:+.3g}·N" for k in tm.PHASES))
  print(f"  calibrated from {how}")


def report_run(run: tc.Run, cal, racc) -> None:
  m = run.measured
  own = tm.predict(run.workload, racc, cal, m.chips, m.layout, m.sampler, m.staleness)
  err = own.step / m.step - 1
  where = f"{m.layout} {m.sampler}+{m.chips - m.sampler}" if m.layout == "split" else m.layout
  print(f"calibration on {run.path}: {m.chips} {racc.name} device(s), {where}"
        f"{f', max_staleness {m.staleness}' if m.staleness else ''}; measured step {m.step:.4g} s (generate "
        f"{m.generate:.3g}, train {m.train:.3g}, sync {m.sync:.3g}, reward+other "
        f"{m.reward + m.other:.3g}), predicted {own.step:.4g} s ({err:+.1%})")
  if abs(err) > 0.25:
    print(f"warning: the prediction of the measured layout is off by {err:+.0%} (> 25%): the "
          f"phases' medians do not add up to the step's (time outside the logged phases)")


def report_target(w: tm.Workload, name: str, cal, tcal, tacc) -> None:
  n = f"{w.params / 1e9:.4g}B" if w.params >= 1e9 else f"{w.params / 1e6:.4g}M"
  print(f"predicting for model {name}: {n} parameters ({w.param_bytes} B "
        f"each), {w.layers} layers; {w.responses} responses/step, prompt {w.prompt_len:.4g} + "
        f"response {w.response_len:.4g} tokens, {w.decode_steps} decode steps; "
        f"{tc.training_passes(w):.3g} training forward passes/response, "
        f"{w.optimizer_steps} optimizer step(s)/RL step")
  print(f"on {tacc.name}: efficiencies from {tcal.source} (e_train {tcal.e_train:.3g}, e_flops "
        f"{tcal.e_flops:.3g}, e_bw {tcal.e_bw:.3g}, t_lat {tcal.t_lat:.3g} s/decode step)")
  print(f"host costs carried over from the run: reward scoring per response "
        f"({tcal.reward_per_response:.3g} s x {w.responses} = "
        f"{tcal.reward_per_response * w.responses:.3g} s), the rest of the host time per step "
        f"({tcal.other:.3g} s); neither shrinks with chips")
  if cal.per_device.zero:
    return
  if tacc.shared_host and not tcal.per_device.zero:
    print(f"the shared host's per-device cost is kept: {tacc.name}'s devices share its cores")
  else:
    print(f"the shared host's per-device cost is dropped on {tacc.name}: each device has its "
          f"own compute")


def main(argv=None) -> int:
  a = parse(argv)
  runs = [tc.load_run(d) for d in a.run_dirs]
  tc.same_config(runs)
  run = runs[0]
  w, name = target(a, run)
  cal, racc, tacc = calibrated(runs, a.run_accelerator, a.accelerator)
  tcal = tc.transfer(cal, racc, tacc, w)
  if a.gen_cv is not None:
    tcal = dataclasses.replace(tcal, gen_cv=a.gen_cv)
  report_calibration(runs, cal, racc)
  report_target(w, name, cal, tcal, tacc)
  batch = run.batch * w.responses / run.workload.responses
  steps, how = tm.steps_to_target(run.summary.get("responses_to_target"), w.responses, batch,
                                  w.optimizer_steps, a.bcrit, a.smin)
  print(f"steps to target at {w.responses} responses/step: "
        f"{'n/a' if steps is None else f'{steps:.4g}'} ({how})")
  layouts = ["colocated", "split"] if a.layout == "both" else [a.layout]
  staleness = sorted(set(a.max_staleness) | ({1} if a.overlap else set()))
  if "split" in layouts and any(staleness):
    print(f"split with the sampler up to k steps ahead (k = {', '.join(map(str, staleness))}):"
          f" decode time varying by {tcal.gen_cv:.3g} (sd / mean) from step to step"
          f"{' (--gen_cv)' if a.gen_cv is not None else ' (the run' + chr(39) + 's)'}")
  df = table(run, w, tcal, tacc, a.chips, layouts, staleness, steps)
  print(_fmt(df))
  out = a.out or os.path.join(run.path, "scale")
  os.makedirs(out, exist_ok=True)
  title = (f"{name} on {tacc.name}: {w.responses} responses/step, "
           f"{w.prompt_len:.4g}+{w.decode_steps} tokens")
  print("wrote " + ", ".join(figure(df, out, title)))
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except ValueError as e:  # a user's mistake: one line
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)

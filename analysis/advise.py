"""Which P x G, learning rate and layout reach the target soonest on N chips.

    python analysis/advise.py STUDY_DIR --run=RUN_DIR --chips=1,8,64,512 --accelerator=h200 \\
        [--model=NAME|HF_FOLDER|config.json] [--kind=grpo] [--out=DIR]
    python analysis/advise.py RUN_DIR/probe --run=RUN_DIR ...     # from a critical-batch probe
    python analysis/advise.py STUDY_DIR --run=RUN_DIR --max_staleness=0,1,4 \
        --staleness=STALENESS_REPORT_DIR ...                     # the split layout at k too

It combines two things measured on the user's own runs:

(a) Responses to target E(B), B = P x G responses per optimizer step (G: the study's), from
    - a study (its directory, or its report directory with runs.csv and study.json): at every B
      the study ran, the median over seeds of its best-lr configuration (the report's choice:
      the rate a study stage chose for that P, else the fewest median responses) with the
      median's interval; beyond the batches run, E = E_min (1 + B/B_crit) from the study's fit
      (analysis.fits.critical_batch) with its bootstrap interval, or, where the fit gives only a
      lower bound b on B_crit, E(B) <= E(B_max) (1 + B/b) / (1 + B_max/b): the pessimistic end
      is used and the row says so;
    - a probe (launch/cbs_probe.py): the run's own E at its batch, carried to other batches by
      E(B) = E_run (1 + B/B_crit) / (1 + B_run/B_crit) with the B_crit measured at the probe
      point nearest the run's crossing (its interval from the probe's bootstrap).
(b) Seconds per RL step at P x G, chips and layout (colocated, or the best sampler:trainer
    split) from the throughput model (analysis/throughput), calibrated on RUN_DIR and
    transferred to --accelerator (scale.py's calibration; "uncalibrated" when the accelerator
    is not the one RUN_DIR ran on).

(c) With --max_staleness=0,1,... and --staleness=REPORT_DIR, the split layout also at each
    k > 0 of rollout.max_staleness: the step pipelined (the sampler up to k steps ahead,
    analysis/throughput/model.py pipelined) and E(B) times what k cost in responses to target
    at that B, E(B, k) / E(B, 0) with its interval, as a staleness sweep's report measured it
    (its Staleness section's CSV; at the nearest B it ran, said so). k > 0 without that
    measurement is refused: its sample cost is not assumed.

Time to target = E(B) / B x seconds per step. For each chip count the table gives the candidate
with the least predicted time, its interval (from E's; the step-time model adds its own error,
not in the interval), the seeds behind it, and the runner-up. A figure draws the best time
against chips, one line per layout, with linear speedup from the first chip count.

It refuses, in one line, when the inputs cannot support a recommendation: no batch whose
median reached the target, fewer than two batches, a probe without an identified (or bounded)
B_crit near the run's crossing, a run that never reached its target.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import types

import numpy as np
import pandas as pd

from analysis import fits, report_md, stats
from rlscale.rl import optim

GRID = 2  # candidate batches beyond the largest measured: x2, x4, ... up to x2**EXTEND
EXTEND = 6


class Refusal(ValueError):
  """The inputs cannot support a recommendation (one line)."""


@dataclasses.dataclass
class Estimate:
  """E at one B: the point, its interval and where it comes from."""
  b: int
  e: float
  lo: float
  hi: float
  seeds: int
  how: str  # "measured" | "fit" | "bound (pessimistic)" | "probe"
  lr: str  # the learning rate the row stands for

  @property
  def extrapolated(self) -> bool:
    return self.how != "measured"


# --- (a) responses to target -------------------------------------------------------------------

def study_runs(path: str) -> tuple[pd.DataFrame, dict]:
  """A study's per-run table (report/runs.csv, or read from its run directories) and its
  study.json."""
  record = {}
  for where in (path, os.path.dirname(os.path.normpath(path))):
    p = os.path.join(where, "study.json")
    if os.path.exists(p):
      with open(p) as f:
        record = json.load(f)
      break
  csv = os.path.join(path, "runs.csv")
  if os.path.exists(csv):
    return pd.read_csv(csv), record
  from analysis import study_table
  study = study_table.read_study([path], study_table.Options(), stream=open(os.devnull, "w"))
  return study.runs, record


def best_lr_points(runs: pd.DataFrame, record: dict, kind: str = ""
                   ) -> tuple[dict[int, np.ndarray], dict[int, str], int, int]:
  """{B: seeds' responses to target}, {B: its lr and how it was chosen} of the best-lr
  configuration per B of `kind`'s verdict runs at its main G and mini-batches per step, that G
  and that number of mini-batches. The rate a study stage chose for a P wins (study.json);
  else the configuration with the fewest median responses."""
  d = runs[(runs.get("role", "verdict") == "verdict") & (runs.get("status", "done") == "done")]
  if d.empty:
    raise Refusal("the study has no finished verdict runs")
  kind = kind or ("grpo" if "grpo" in set(d.kind) else sorted(set(d.kind))[0])
  d = d[d.kind == kind]
  if d.empty:
    raise Refusal(f"the study has no {kind!r} runs; it has {', '.join(sorted(set(runs.kind)))}")
  g = int(d.G.mode().iloc[0])
  d = d[(d.G == g) & (d.num_minibatches == d.num_minibatches.mode().iloc[0])]
  chosen = {}
  for c in record.get("chosen", {}).values():
    stage = runs[runs.stage == c.get("stage")]
    if c.get("per") == ["p"] and set(stage.kind) == {kind} and set(stage.lr_rule) == {"none"}:
      chosen.update({int(k.split("=")[1]): float(v) for k, v in c.get("values", {}).items()})
  points, lrs = {}, {}
  for b, at_b in d.groupby("B"):
    p = int(at_b.P.iloc[0])
    pick = at_b[np.isclose(at_b.lr, chosen[p], rtol=1e-3)] if p in chosen else at_b.iloc[:0]
    how = "the study's choice"
    if pick.empty:
      med = at_b.groupby("config").responses_to_target.median()
      pick = at_b[at_b.config == med.idxmin()]
      how = "fewest median responses on these seeds: optimistic"
    points[int(b)] = pick.responses_to_target.astype(float).replace(np.nan, np.inf).to_numpy()
    lrs[int(b)] = f"{float(pick.lr.iloc[0]):.3g} ({how})"
  return points, lrs, g, int(d.num_minibatches.mode().iloc[0])


def largest_working_rate(runs: pd.DataFrame, kind: str = "") -> float:
  """The largest rate any of `kind`'s runs (scan or verdict) reached the target at in the
  median over its seeds: rates above it failed or were never tried (inf: no runs to say)."""
  d = runs[runs.get("status", "done") == "done"] if "status" in runs else runs
  if kind:
    d = d[d.kind == kind]
  if d.empty or "lr" not in d:
    return math.inf
  med = d.groupby(["B", "lr"]).responses_to_target.median()
  ok = [lr for (_, lr), v in med.items() if np.isfinite(v)]
  return float(max(ok)) if ok else math.inf


def _beyond_rate(lr: float, top: int, max_lr: float) -> str:
  """The rate a batch beyond those run gets: the sqrt rule from the largest, flagged, and
  never above the largest rate that reached the target (`max_lr`)."""
  if lr > max_lr:
    return (f"{max_lr:.3g} (sqrt rule from B={top} gives {lr:.3g}, above the largest rate "
            f"that reached the target ({max_lr:.3g}): capped; not run)")
  return f"{lr:.3g} (sqrt rule from B={top}: beyond the batches measured, not run)"


def from_study(points: dict[int, np.ndarray], lrs: dict[int, str], extend: int = EXTEND,
               reps: int = 1000, seed: int = 0, max_lr: float = math.inf
               ) -> tuple[list[Estimate], dict]:
  """E at every measured B and at B_max x 2, 4, ... (fit or bound), and the fit; the rates
  beyond the batches run capped at `max_lr` (largest_working_rate)."""
  reached = {b: v for b, v in points.items() if np.isfinite(np.median(v))}
  if len(reached) < 2:
    raise Refusal(f"{len(reached)} batch(es) whose median reached the target: E(B) needs 2 or "
                  "more (run longer, or lower the target)")
  out = []
  for b in sorted(reached):
    iv = stats.median_interval(reached[b])
    out.append(Estimate(b, iv.point, iv.lo, iv.hi, iv.n, "measured", lrs[b]))
  fit = (fits.critical_batch(reached, reps=reps, seed=seed) if len(reached) >= 3 else
         {"identified": False, "reasons": ["2 batches"]})
  top = max(reached)
  top_e = next(e for e in out if e.b == top)
  lr_top = float(lrs[top].split()[0])
  for k in range(1, extend + 1):
    b = top * GRID ** k
    lr = _beyond_rate(lr_top * math.sqrt(b / top), top, max_lr)
    if fit.get("identified"):
      draws = fit["e_min_draws"] * (1 + b / fit["b_crit_draws"])
      lo, hi = np.quantile(draws, [0.025, 0.975])
      out.append(Estimate(b, fit["e_min"] * (1 + b / fit["b_crit"]), float(lo), float(hi),
                          min(fit["n"]), "fit", lr))
    elif fit.get("bound", ("", 0))[0] == "lower":
      # E can grow past B_max by at most (1 + B/b)/(1 + B_max/b), b = B_crit's lower bound:
      # E(B_max)'s interval carried by that factor, both ends alike, and the row stands for its
      # upper end (the most the data allow), not its median.
      grow = (1 + b / fit["bound"][1]) / (1 + top / fit["bound"][1])
      out.append(Estimate(b, top_e.hi * grow, top_e.lo * grow, top_e.hi * grow,
                          top_e.seeds, "bound (pessimistic: the upper end)", lr))
  return out, fit


def from_probe(run_e: float, run_b: int, run_lr: float, b_crit: float, lo: float, hi: float,
               seeds: int, batches: list[int], rate=None, rule: str = "",
               probed: tuple[int, ...] = ()) -> list[Estimate]:
  """E(B) = E_run (1 + B/B_crit) / (1 + B_run/B_crit) at each B, interval over B_crit's;
  `rate(B)` the rate the probe's rule gives B (default: the run's, by the sqrt rule)."""
  def e(b, bc):
    return run_e * (1 + b / bc) / (1 + run_b / bc)
  rate = rate or (lambda b: run_lr * math.sqrt(b / run_b))
  rule = rule or "sqrt rule from the run's"
  out = []
  for b in sorted(set(batches)):
    ends = sorted([e(b, lo), e(b, hi)])
    ran = "run in the probe's branches" if b in probed else "not run"
    if b == run_b:  # one run: its E, without an interval
      out.append(Estimate(b, run_e, math.nan, math.nan, 1, "measured (one run)",
                          f"{run_lr:.3g}"))
      continue
    out.append(Estimate(b, e(b, b_crit), ends[0], ends[1], seeds, "probe",
                        f"{rate(b):.3g} ({rule}, {ran})"))
  return out


def probe_estimates(probe_dir: str, run_dir: str, g: int) -> tuple[list[Estimate], str]:
  """The probe's B_crit at the point nearest the run's crossing, applied to the run's E."""
  from analysis import probe, runs as runs_lib
  run = runs_lib.load(run_dir)
  e_run = run.summary.get("responses_to_target")
  if not isinstance(e_run, (int, float)):
    raise Refusal(f"{run_dir} did not reach its target: no E to carry to other batches")
  result = probe.analyse(probe_dir, run_dir)
  if not result["points"]:
    raise Refusal(f"no finished branch under {probe_dir}")
  at = e_run / run.plan.responses
  step = min(result["points"], key=lambda s: abs(s - at))
  p = result["points"][step]
  if not p.get("identified"):
    raise Refusal(f"the probe at step {step} (nearest the run's crossing at step {at:.3g}): "
                  f"{p['text']}")
  # The interval spans the seeds' and the gains' (analysis/probe.py SENSITIVITY): where B_crit
  # moves with the gain it is read at, the seeds' interval alone understates what is known.
  lo, hi, used = p["span_lo"], p["span_hi"], sorted(p["identified_gains"], key=float)
  lr = optim.scale(run.config["optim"], run.batch).lr
  rate, rule = _probe_rule(probe_dir, step, p)
  top = max(run.batch * GRID ** EXTEND, max(int(b) for b in p["batches"]))
  batches = [int(b) for b in p["batches"]] + [run.batch]
  b = g
  while b <= top:
    batches.append(b)
    b *= GRID
  est = from_probe(float(e_run), run.batch, lr, p["b_crit"], lo, hi, min(p["n"]),
                   [x for x in batches if x % g == 0], rate, rule,
                   tuple(int(b) for b in p["batches"]))
  return est, (f"probe at step {step}: {p['text']}; the interval used spans the gains where it "
               f"is identified ({', '.join(used)}): {lo:.3g}-{hi:.3g}. The run's E "
               f"({e_run:g} responses to its own target, {run.config['target']['metric']}) is "
               f"carried by a B_crit measured on {result['metric']} over short branches")


def _probe_rule(probe_dir: str, step: int, point: dict):
  """The rate for a batch, and how it was had: after a rate scan, a probed batch's best rate
  (the point's `lr`), else the rule the probe's rates were centred on (the middle of its
  branches' anchors, read from their configs), in words."""
  from analysis import probe, runs as runs_lib
  configs = [c["optim"] for c in (runs_lib.load(d).config for d in probe.branch_dirs(probe_dir))
             if c["init"]["branch_step"] == step]
  anchors = sorted({c["lr"] for c in configs})
  o = dict(configs[0], lr=anchors[len(anchors) // 2])
  best = {int(b): lr for b, lr in point.get("lr", {}).items()} if len(anchors) > 1 else {}
  rule = f"the {o['lr_scaling']} rule from {o['lr']:.3g} at B={o['reference_batch']}"
  rule = (f"the best of the probe's rate scan where it ran, else {rule} (the scan's centre)"
          if best else f"the probe's {rule[4:]}")
  return (lambda b: best.get(b, optim.scale(o, b).lr), rule)


# --- (b) time per step and the choice ----------------------------------------------------------

def throughput(run_dir: str, model: str, dtype: str, accelerator: str, run_accelerator: str):
  """(seconds per step as f(responses, chips, layout), what it is calibrated on)."""
  from analysis import scale
  from analysis.throughput import calibration as tc, model as tm
  run = tc.load_run(run_dir)
  a = types.SimpleNamespace(model=model, dtype=dtype, max_new_tokens=0, prompt_len=0,
                            response_len=0, prompts=0, group=0)
  w, name = scale.target(a, run)
  cal, racc, tacc = scale.calibrated([run], run_accelerator, accelerator)
  tcal = tc.transfer(cal, racc, tacc, w)
  note = (f"{name} on {tacc.name}, calibrated on {run_dir} ({racc.name})"
          + ("" if racc.name == tacc.name else
             f": uncalibrated on {tacc.name} (the run's {racc.name} efficiencies do not carry; "
             "the model's defaults are used)"))

  def step(responses: int, chips: int, layout: str, staleness: int = 0) -> float:
    return tm.predict(w.with_responses(responses), tacc, tcal, chips, layout,
                      staleness=staleness).step
  if tcal.gen_cv:
    note += f"; decode time varying by {tcal.gen_cv:.2g} (sd / mean) from step to step"
  return step, note


# --- (c) what k steps of staleness cost in responses ------------------------------------------

STALENESS_CSV = "9_rtt_vs_staleness.csv"  # the report's Staleness section (its figure's data)


@dataclasses.dataclass(frozen=True)
class Cost:
  """E(B, k) / E(B, 0) measured at one B: the ratio and its interval."""
  b: int
  ratio: float
  lo: float
  hi: float
  seeds: int


def staleness_costs(path: str, kind: str, correction: str) -> dict[int, list[Cost]]:
  """Per k > 0, the ratios a staleness sweep's report measured (its STALENESS_CSV, in `path`
  or `path` itself), for `kind` without dynamic sampling and with `correction`."""
  csv = path if path.endswith(".csv") else os.path.join(path, STALENESS_CSV)
  if not os.path.isfile(csv):
    raise Refusal(f"--staleness={path}: no {STALENESS_CSV} (the report of a sweep over "
                  "rollout.max_staleness writes it)")
  d = pd.read_csv(csv)
  axes = set(d.get("sample_axis", pd.Series(dtype=str)).dropna())
  from analysis import runs as runs_lib
  if axes and axes != {runs_lib.GENERATED}:  # the report's CSVs name the axis by its key
    raise Refusal(f"--staleness={path}: its ratios count {', '.join(sorted(axes))}; the "
                  "advisor's E counts responses generated (report it with the default axis)")
  d = d[(d.kind == kind) & ~d.dynamic_sampling.astype(bool) & (d.correction == correction)
        & (d.k > 0)]
  if d.empty:
    raise Refusal(f"--staleness={path}: no {kind} runs with k > 0 and correction "
                  f"{correction!r} there")
  out: dict[int, list[Cost]] = {}
  for r in d.itertuples():
    # A ratio whose upper end is unbounded (a censored seed) or that never reached the target
    # (inf) is kept as it is: dropping it would let a smaller B's finite ratio stand in.
    if r.ratio_n and not np.any(np.isnan([r.ratio_to_k0, r.ratio_lo, r.ratio_hi])):
      out.setdefault(int(r.k), []).append(Cost(int(r.B), float(r.ratio_to_k0), float(r.ratio_lo),
                                               float(r.ratio_hi), int(r.ratio_n)))
  return out


def cost_at(costs: list[Cost], b: int) -> tuple[Cost, bool]:
  """The measured ratio at the B nearest `b` (in log B; of two as near, the costlier: staleness
  costs more at a larger batch here), and whether it was measured at b."""
  near = min(costs, key=lambda c: (round(abs(math.log(c.b / b)), 9), -c.ratio, c.b))
  return near, near.b == b


def usable(n: int) -> list[int]:
  """Chip counts a run on n chips may use: n, and the powers of two below it (a small batch
  on many chips can be slower than on a few: the rest stay idle, or run other jobs)."""
  return sorted({n} | {2 ** k for k in range(n.bit_length()) if 2 ** k < n})


def choose(estimates: list[Estimate], step, chips: list[int], layouts: list[str],
           minibatches: int = 1, costs: dict[int, list[Cost]] | None = None) -> pd.DataFrame:
  """One row per chip count and candidate (B, layout, k, chips used), ranked by predicted time
  to target: E(B) / (B x `minibatches`) RL steps (an RL step of P x G = B x minibatches
  responses, as in the study or run that measured E) x seconds per step. Split, each k of
  `costs` too: E(B) x its measured E(B, k) / E(B, 0) (at the nearest B measured; the interval
  the product of the two intervals' ends) and the pipelined step of k."""
  rows, ks = [], sorted(costs or {})
  series = [(layout, k) for layout in layouts for k in [0] + (ks if layout == "split" else [])]
  for n in chips:
    for est, (layout, k), used in itertools.product(estimates, series, usable(n)):
      if layout == "split" and used < 2:
        continue
      e, lo, hi, how = est.e, est.lo, est.hi, est.how
      if k:
        c, exact = cost_at(costs[k], est.b)
        e, lo, hi = e * c.ratio, lo * c.lo, hi * c.hi
        how += f"; x{c.ratio:.3g} for k = {k}" + ("" if exact else f" (measured at B = {c.b})")
      t = step(est.b * minibatches, used, layout, k)
      steps = e / est.b / minibatches
      rows.append(dict(chips=n, used=used, B=est.b, layout=f"{layout} k={k}" if k else layout,
                       k=k, lr=est.lr, how=how, seeds=est.seeds, responses=e, step_s=t,
                       steps=steps, time_s=steps * t, time_lo=lo / est.b / minibatches * t,
                       time_hi=hi / est.b / minibatches * t))
  df = pd.DataFrame(rows)
  df["rank"] = df.groupby("chips").time_s.rank(method="first").astype(int)
  return df.sort_values(["chips", "rank"]).reset_index(drop=True)


def table(df: pd.DataFrame, g: int, minibatches: int = 1, transfer: bool = False
          ) -> pd.DataFrame:
  """Per chip count: the best candidate and the runner-up (the best of another B or layout);
  with `transfer` (E measured on another model), E relative to the smallest batch's and the
  step time beside the product, which is labelled as resting on the transfer."""
  out = []
  e_first = df.loc[df.B.idxmin()].responses if len(df) else math.nan
  for n, d in df.groupby("chips"):
    best = d.iloc[0]
    others = d[(d.B != best.B) | (d.layout != best.layout)]
    second = others.iloc[0] if len(others) else None
    tie = second is not None and second.time_lo <= best.time_hi
    out.append({
        "chips": n, "P x G": f"{best.B * minibatches // g} x {g}", "B": best.B, "lr": best.lr,
        "layout": best.layout, "chips used": best.used, "time to target (s)": _iv(best),
        "seeds": best.seeds, "E from": best.how,
        "runner-up": "—" if second is None else
        f"{second.B * minibatches // g} x {g} {second.layout} on {second.used}, {_iv(second)}, "
        f"E {second.how}"
        + (" (overlaps)" if tie else ""),
    })
    if transfer:
      row = out[-1]
      row["E / E(smallest B)"] = f"{best.responses / e_first:.2g}"
      row["step (s, model)"] = seconds(best.step_s, 2)
      row["time to target (s, assumed transfer)"] = row.pop("time to target (s)")
  return pd.DataFrame(out)


def digits(point: float, lo: float, hi: float) -> int:
  """Significant digits an estimate with this interval justifies: one more than the place of
  the interval's width (a width of 40% of the point: 2 digits; of 4%: 3), 1 at least, 3 at
  most."""
  if not all(map(math.isfinite, (point, lo, hi))) or point <= 0 or hi <= lo:
    return 2
  width = (hi - lo) / point
  return int(min(3, max(1, 1 - math.floor(math.log10(width)))))


def seconds(v: float, n: int) -> str:
  if not math.isfinite(v):
    return "∞" if v > 0 else "—"
  return f"{float(f'{v:.{n}g}'):g}"


def _iv(r) -> str:
  if math.isnan(r.time_lo):
    return f"{seconds(r.time_s, 2)} (one run: no interval)"
  n = digits(r.time_s, r.time_lo, r.time_hi)
  return f"{seconds(r.time_s, n)} [{seconds(r.time_lo, n)}, {seconds(r.time_hi, n)}]"


def figure(df: pd.DataFrame, out: str, title: str) -> list[str]:
  from analysis import figures
  rows = []
  for layout, d in df.groupby("layout"):
    best = d.loc[d.groupby("chips").time_s.idxmin()]
    for _, r in best.iterrows():
      rows.append(dict(panel="", series=layout, x=r.chips, y=r.time_s, lo=r.time_lo,
                       hi=r.time_hi, style="line"))
  first = df[df.chips == df.chips.min()].time_s.min()
  for n in sorted(df.chips.unique()):
    rows.append(dict(panel="", series="linear speedup", x=n, y=first * df.chips.min() / n,
                     style="ref"))
  data = pd.DataFrame(rows)
  fig = figures.lines(data, "chips", "predicted time to target (s)", logx=True, logy=True)
  fig.suptitle(title, fontsize=8)
  return figures.save(fig, data, out, "advice")


def parse(argv=None) -> argparse.Namespace:
  from analysis.scale import _chip_counts, _staleness
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("dir", help="a study's directory or report directory, or a probe's")
  ap.add_argument("--run", required=True, help="a finished run of the task to calibrate the "
                  "step time on (and, for a probe, the run it branched)")
  ap.add_argument("--chips", default="1,8,64,512", type=_chip_counts)
  ap.add_argument("--accelerator", default="h200")
  ap.add_argument("--run_accelerator", default="cpu", help="where --run ran")
  ap.add_argument("--model", default="", help="the model to predict for (default: the run's)")
  ap.add_argument("--assume_transfer", action="store_true",
                  help="allow --model other than the run's: E(B) measured on the run's model "
                  "is assumed to hold for it (the output says so)")
  ap.add_argument("--dtype", default="")
  ap.add_argument("--kind", default="", help="the study's algorithm (default: grpo if run)")
  ap.add_argument("--layout", default="both", choices=["colocated", "split", "both"])
  ap.add_argument("--max_staleness", default="0", type=_staleness,
                  help="comma-separated k of rollout.max_staleness to weigh on the split "
                  "layout (k > 0 needs --staleness)")
  ap.add_argument("--staleness", default="", help="the report directory of a sweep over "
                  "rollout.max_staleness (or its 9_rtt_vs_staleness.csv): what k costs in "
                  "responses to target")
  ap.add_argument("--correction", default="none",
                  help="the off-policy correction whose staleness runs to read")
  ap.add_argument("--out", default="", help="default: DIR/advice")
  return ap.parse_args(argv)


def advise(a: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame, list[str], int]:
  """(ranked candidates, the table, notes, G)."""
  if not os.path.isdir(a.dir):
    raise Refusal(f"{a.dir}: not a directory")
  is_probe = any(d.startswith("step_") for d in os.listdir(a.dir))
  notes = []
  if is_probe:
    with open(os.path.join(a.run, "config.json")) as f:
      rl = json.load(f)["rl"]
    g, nm = int(rl["group_size"]), int(rl.get("num_minibatches", 1))
    estimates, what = probe_estimates(a.dir, a.run, g)
    notes.append(f"E(B) from the {what}; the run's own E at its batch")
  else:
    runs, record = study_runs(a.dir)
    points, lrs, g, nm = best_lr_points(runs, record, a.kind)
    kind = a.kind or ("grpo" if "grpo" in set(runs.kind) else sorted(set(runs.kind))[0])
    max_lr = largest_working_rate(runs, kind)  # the algorithm best_lr_points read
    estimates, fit = from_study(points, lrs, max_lr=max_lr)
    t = record.get("target", {})
    notes.append(f"E(B): the study's best-lr runs to {t.get('metric', 'its target')} = "
                 f"{t.get('value', '?')} at B = {', '.join(map(str, sorted(points)))}; beyond "
                 f"B = {max(points)}: " + (
                     f"the fit's B_crit {fit['b_crit']:.3g} [{fit['b_crit_lo']:.3g}, "
                     f"{fit['b_crit_hi']:.3g}]" if fit.get("identified") else
                     f"B_crit not identified ({'; '.join(fit.get('reasons', []))})" +
                     (f"; B_crit > {fit['bound'][1]:.3g}: E extrapolated pessimistically"
                      if fit.get("bound", ("",))[0] == "lower" else ": not extrapolated")))
  own = run_model(a.run)
  transfer = bool(a.model) and a.model != own
  if transfer and not a.assume_transfer:
    raise Refusal(f"E(B) was measured on {own} and this task; --model={a.model} predicts for "
                  "another model, which needs --assume_transfer (its output then shows E "
                  "relative to the smallest batch's and the step-time model apart)")
  step, note = throughput(a.run, a.model, a.dtype, a.accelerator, a.run_accelerator)
  notes.append("step time: " + note)
  if transfer:
    notes.append(f"**assumed transfer**: E(B) was measured on {own} and is assumed to hold "
                 f"for {a.model}; nothing here measured that it does. The table gives E "
                 "relative to the smallest batch's (what the study measured) and the step "
                 "time (the throughput model's) apart from their product")
  layouts = ["colocated", "split"] if a.layout == "both" else [a.layout]
  ks = sorted(set(a.max_staleness) - {0})
  costs = None
  if ks:
    if "split" not in layouts:
      raise Refusal("--max_staleness > 0 pays on the split layout only (colocated, one set of "
                    "chips decodes and trains in turn at any k): add --layout=split or both")
    if not a.staleness:
      raise Refusal(f"--max_staleness={','.join(map(str, a.max_staleness))}: what k costs in "
                    "responses to target is measured, not assumed: pass --staleness=REPORT_DIR "
                    "(the report of a sweep over rollout.max_staleness, e.g. configs/"
                    "grpo_chain_sum.py's `staleness`)")
    measured = staleness_costs(a.staleness, kind if not is_probe else (a.kind or "grpo"),
                               a.correction)
    missing = [k for k in ks if k not in measured]
    if missing:
      raise Refusal(f"--staleness={a.staleness}: no {a.correction!r} runs at k = "
                    f"{', '.join(map(str, missing))} (it has k = "
                    f"{', '.join(map(str, sorted(measured)))})")
    costs = {k: measured[k] for k in ks}
    notes.append(f"k > 0 (split): E(B) times E(B, k) / E(B, 0) as {a.staleness} measured it "
                 f"(correction {a.correction}; " + "; ".join(
                     f"k = {k}: " + ", ".join(f"x{c.ratio:.3g} at B = {c.b} ({c.seeds} seeds)"
                                              for c in sorted(costs[k], key=lambda c: c.b))
                     for k in ks) + "); the step pipelined, the sampler up to k steps ahead")
  df = choose(estimates, step, a.chips, layouts, nm, costs)
  tab = table(df, g, nm, transfer)
  largest = max(e.b for e in estimates)
  if (tab.B == largest).any():
    notes.append(f"B = {largest}, the largest candidate, is the best at "
                 f"{', '.join(str(c) for c in tab[tab.B == largest].chips)} chips: larger "
                 "batches were neither measured nor extrapolated, so the speedup past there "
                 "is not known (not a measured limit)")
  return df, tab, notes, g


def run_model(run_dir: str) -> str:
  """The model a run trained: its checkpoint folder (model.hf_checkpoint), else model.name."""
  with open(os.path.join(run_dir, "config.json")) as f:
    m = json.load(f).get("model", {})
  return str(m.get("hf_checkpoint") or m.get("name") or "the run's model")  # a folder wins


def main(argv=None) -> int:
  a = parse(argv)
  try:
    with np.errstate(invalid="ignore"):  # quantiles over seeds that never reached (inf)
      df, tab, notes, g = advise(a)
  except (Refusal, ValueError) as e:
    print(f"advise.py: cannot recommend: {e}", file=sys.stderr)
    return 2
  out = a.out or os.path.join(a.dir, "advice")
  os.makedirs(out, exist_ok=True)
  df.to_csv(os.path.join(out, "candidates.csv"), index=False)
  text = "\n".join(["# Advice", "", *[f"- {n}" for n in notes], "",
                    "Time to target: median [95% interval from E's seeds or fit]; the step-time "
                    "model's own error is not in it. Extrapolated rows (E from fit, bound or "
                    "probe) are predictions beyond the batches run.", "",
                    report_md.table(tab), ""])
  with open(os.path.join(out, "advice.md"), "w") as f:
    f.write(text)
  print(text)
  title = f"best predicted time to target per layout ({a.accelerator})"
  print("wrote " + ", ".join([os.path.join(out, "advice.md")] + figure(df, out, title)))
  return 0


if __name__ == "__main__":
  sys.exit(main())

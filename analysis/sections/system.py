"""Actor vs critic gradient signal and noise in one window, and generation vs training time."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from analysis import figures
from analysis import fits
from analysis import stats
from analysis import study_table as st
from analysis.report_md import num
from analysis.runs import responses
from analysis.sections.common import study_series
from analysis.sections.types import Figure, Section

_MODELS = {"actor": "actor/grad_norm", "critic": "critic/grad_norm"}


def _trained(run, key: str, x: str) -> list[tuple[float, float]]:
  """(responses on axis `x`, grad norm) of the steps where the model trained (a PPO actor is
  idle, with a zero gradient, while the critic warms up)."""
  return [(responses(r, x), r[key]) for r in run.rows
          if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and r[key] > 0
          and responses(r, x) is not None]


def _kinds(runs: pd.DataFrame):
  """(kind, its runs) per kind and dynamic sampling setting: 'grpo filtered' for the runs
  with it, whose grad norms are not pooled with the others'."""
  on = runs.dynamic_sampling.fillna(False).astype(bool)
  for (kind, filtered), g in runs.groupby([runs.kind, on]):
    yield (f"{kind} filtered" if filtered else kind), g


def grad_points(study: st.Study) -> pd.DataFrame:
  """Per run and model: its B, mean |g|^2 and |g|, and B_simple over one window of responses
  per kind, the same for the actor and the critic: the middle third of the span in which
  every model of every run of the kind trained (after any critic warm-up), on the study's
  sample axis."""
  out = []
  for kind, group in _kinds(study.verdict_runs()):
    runs = [(r.run, study.records[r.run]) for r in group.itertuples()]
    series = {(name, m): _trained(run, key, study.opts.x) for name, run in runs
              for m, key in _MODELS.items() if m in run.plan.models}
    series = {k: v for k, v in series.items() if v}
    if not series:
      continue
    start = max(v[0][0] for v in series.values())
    end = min(v[-1][0] for v in series.values())
    if not end > start:
      continue
    lo, hi = start + (end - start) / 3, start + 2 * (end - start) / 3
    for (name, model), pts in series.items():
      g = [y for x, y in pts if lo <= x <= hi] or [min(pts, key=lambda p: abs(p[0] - lo))[1]]
      run = study.records[name]
      unit = "prompts" if any(f"{model}/noise_prompts/grad_sq_est" in r for r in run.rows) \
          else "responses"
      g2_est, tr_est, per = st.noise_in(run, lo, hi, unit, model, study.opts.x)
      out.append(dict(run=name, kind=kind, model=model, lo=lo, hi=hi,
                      B=run.plan.models[model].minibatch, grad_sq=float(np.mean(np.square(g))),
                      grad_norm=float(np.mean(g)), unit=unit, g2_est=g2_est,
                      trace_est=tr_est * per))
  return pd.DataFrame(out)


def actor_critic(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Actor vs critic: gradient signal and noise")
  pts = grad_points(study) if not study.used().empty else pd.DataFrame()
  if pts.empty or pts.groupby(["kind", "model"]).B.nunique().max() < 2:
    sec.skipped = "no grad norms at two or more batch sizes."
    return sec
  rows, sq, norm = [], [], []
  for (kind, model), g in pts.groupby(["kind", "model"]):
    if g.B.nunique() < 2 or (g.grad_sq > 0).sum() < 2:
      sec.text.append(f"{kind} {model}: skipped (grad norms at fewer than two batch sizes).")
      continue
    f = fits.fit_signal_noise(g.B, g.grad_sq)
    p = fits.fit_power(g.B, g.grad_norm)
    measured = stats.pooled_ratio(g.trace_est, g.g2_est, seed=study.opts.seed)
    rows.append(dict(kind=kind, model=model, runs=len(g), batches=g.B.nunique(),
                     lo=g.lo.iloc[0], hi=g.hi.iloc[0], fit=f, power=p,
                     measured=measured if not math.isnan(measured.point) else None,
                     unit=g.unit.mode().iloc[0]))
    panel = f"{kind} {model}"
    inv = np.linspace(0, 1 / g.B.min(), 20)
    sq += [pd.DataFrame({"panel": panel, "series": "runs", "x": 1 / g.B, "y": g.grad_sq,
                         "style": "points"}),
           pd.DataFrame({"panel": panel, "series": "|G|² + tr Σ/B", "x": inv,
                         "y": f["grad_sq_true"] + f["trace"] * inv, "style": "fit"})]
    b = np.geomspace(g.B.min(), g.B.max(), 20)
    norm += [pd.DataFrame({"panel": "", "series": panel, "x": g.B, "y": g.grad_norm,
                           "style": "points"}),
             pd.DataFrame({"panel": "", "series": f"{panel} B^{p['exponent']:.2f}", "x": b,
                           "y": p["coef"] * b ** p["exponent"], "style": "fit"}),
             pd.DataFrame({"panel": "", "series": f"{panel} 1/√B", "x": b, "style": "dashed",
                           "y": g.grad_norm[g.B == g.B.min()].mean() * np.sqrt(g.B.min() / b)})]
  if not rows:
    sec.skipped = "no model with nonzero grad norms at two or more batch sizes."
    return sec
  windows = "; ".join(sorted({f"{r['kind']} [{num(r['lo'])}, {num(r['hi'])}]" for r in rows}))
  sec.text.append("Per run, the mean squared grad norm and the noise-scale estimates over one "
                  f"window of {st.x_label(study)} per kind, the same for the actor and the "
                  "critic "
                  f"(the middle third of the span where every model of every run trained: "
                  f"{windows}); the squared norms regressed on 1/B: E|g_B|² = |G|² + tr Σ/B, "
                  "B_simple = tr Σ/|G|². Measured B_simple: the runs' own estimates in the "
                  "window (prompt-level x G where measured), pooled as a ratio of means with a "
                  "bootstrap over runs.")
  sec.facts["rows"] = rows
  sec.tables.append(("Signal and noise per model (95% intervals from the regression; the "
                     "exponent's from the log-log fit)", _show(rows)))
  _clipping(study, table, sec)
  for r in rows:
    f, p = r["fit"], r["power"]
    fit = (f"B_simple from the 1/B fit = {num(f['b_simple'])}" if not f["reasons"] else
           "B_simple from the 1/B fit not identified (" + "; ".join(f["reasons"]) + ")")
    expo = (f"grad norm ∝ B^{num(p['exponent'])} [{num(p['exponent_lo'])}, "
            f"{num(p['exponent_hi'])}] over {r['runs']} runs at {r['batches']} batches "
            "(−0.5 would be pure noise, 0 a batch-independent norm)")
    meas = (f"; measured B_simple {_pooled(r['measured'])} responses ({r['unit']}-level, "
            f"pooled over {r['measured'].n} runs)" if r["measured"] else "")
    sec.verdict.append(f"{r['kind']} {r['model']}: {expo}; {fit}{meas}.")
  sec.figures += [
      Figure("6_grad_sq_vs_inverse_batch", "Squared gradient norm vs 1/B, one point per run, "
             "with the line |G|² + tr Σ/B per kind and model.\nThe intercept is the signal "
             "|G|², the slope the noise tr Σ; their ratio is B_simple.",
             pd.concat(sq, ignore_index=True),
             functools.partial(figures.lines, xlabel="1/B", ylabel="|g|²")),
      Figure("6_grad_norm_vs_batch", "Gradient norm vs B (log-log) per kind and model with the "
             "power-law fit and the 1/√B reference.\nA slope near −0.5 means noise dominates; "
             "a flat line means the batch barely changes it.",
             pd.concat(norm, ignore_index=True),
             functools.partial(figures.lines, xlabel="B", ylabel="grad norm", logx=True,
                               logy=True))]
  return sec


def clipping_rows(study: st.Study, table: pd.DataFrame) -> pd.DataFrame:
  """Per series and B: the actor's gradient clip, its median grad norm before clipping and
  the fraction of its optimizer steps clipped (median over seeds, up to the crossing:
  study_table.clip_fraction)."""
  out = []
  for s in study_series(study, table):
    for r in s.rows(table).itertuples():
      out.append(dict(kind=s.kind, series=s.name, B=int(r.B), configuration=r.label,
                      grad_clip=float(r.grad_clip) if pd.notna(r.grad_clip) else 0.0,
                      grad_norm=r.grad_norm, clip_fraction=r.clip_fraction))
  return pd.DataFrame(out)


def _clipping(study: st.Study, table: pd.DataFrame, sec: Section) -> None:
  """The clipping table beside the grad norms, and per series whether the clip acts alike at
  every batch (study_table.clip_fraction_check)."""
  if "clip_fraction" not in table:
    return
  d = clipping_rows(study, table)
  if d.empty:
    return
  checks = []
  for (kind, name), g in d.groupby(["kind", "series"], sort=False):
    ok, why = st.clip_fraction_check(g)
    checks.append(dict(kind=kind, series=name, passed=ok, text=why))
    sec.text.append(f"Clipping, {kind} {name}: {why}.")
  sec.facts["clipping"] = checks
  sec.facts["clipping_rows"] = d
  sec.tables.append((
      "Gradient clipping per batch (the actor's optim.grad_clip, 0: off; its grad norm before "
      "clipping, median over steps up to the crossing and over seeds; the fraction of its "
      "optimizer steps whose norm exceeded the clip, median over seeds): a clip that acts at "
      "some batches only changes the update rule with B",
      pd.DataFrame({"kind": d.kind, "series": d.series, "B": d.B,
                    "configuration": d.configuration, "clip": d.grad_clip.map(num),
                    "grad norm": d.grad_norm.map(num),
                    "steps clipped": [("off" if c <= 0 else "—" if pd.isna(f) else f"{f:.0%}")
                                      for c, f in zip(d.grad_clip, d.clip_fraction)]})))


def _show(rows: list[dict]) -> pd.DataFrame:
  def ci(v, lo_hi):
    return f"{num(v)} [{num(lo_hi[0])}, {num(lo_hi[1])}]"
  return pd.DataFrame([{
      "kind": r["kind"], "model": r["model"], "runs": r["runs"], "batches": r["batches"],
      "|G|²": ci(r["fit"]["grad_sq_true"], r["fit"]["grad_sq_true_interval"]),
      "tr Σ": ci(r["fit"]["trace"], r["fit"]["trace_interval"]),
      "B_simple (fit)": num(r["fit"]["b_simple"]) if not r["fit"]["reasons"] else
      "not identified (" + "; ".join(r["fit"]["reasons"]) + ")",
      "R²": r["fit"]["r2"],
      "grad norm exponent": f"{num(r['power']['exponent'])} [{num(r['power']['exponent_lo'])},"
                            f" {num(r['power']['exponent_hi'])}]",
      "measured B_simple": _pooled(r["measured"]) if r["measured"] else "—",
      "unit": r["unit"]} for r in rows])


def _pooled(v: stats.Interval) -> str:
  if math.isinf(v.point):
    return "unbounded (the pooled |G|² estimate is not positive)"
  return f"{num(v.point)} [{num(v.lo)}, {num(v.hi)}]" if v.has_bounds else num(v.point)


def _median_after(rows: list[dict], keys: tuple[str, ...]) -> float:
  """Median over steps >= 2 of the sum of `keys` (missing ones count 0; step 1 compiles)."""
  vals = [sum(float(r.get(k) or 0) for k in keys) for r in rows
          if r.get("step", 0) >= 2 and any(isinstance(r.get(k), (int, float)) for k in keys)]
  return float(np.median(vals)) if vals else math.nan


def time_points(study: st.Study) -> pd.DataFrame:
  """Per run its step times, by kind and dynamic sampling setting (_kinds): with dynamic
  sampling a step generates as many rounds as it needs, so its generation time is not that of
  its nominal responses per step."""
  out = []
  for kind, group in _kinds(study.used()):
    for r in group.itertuples():
      run = study.records[r.run]
      out.append(dict(run=r.run, kind=kind, chips=int(r.chips),
                      responses=int(r.responses_per_step),
                      platform=run.summary.get("platform", "unknown"),
                      generate_s=_median_after(run.rows, ("time/generate",)),
                      train_s=_median_after(run.rows, ("time/actor_update",
                                                       "time/critic_update", "time/logprobs")),
                      train_tokens=_median_after(run.rows, ("train_tokens",))))
  return pd.DataFrame(out)


def _varies(x: pd.Series) -> bool:
  """A step size that spans at least 1.5x: a fit over less (e.g. runs that vary only their
  mini-batches, whose tokens per step differ by response lengths alone) would be noise."""
  return x.nunique() >= 2 and x.max() >= 1.5 * x.min()


def _timing_fits(g: pd.DataFrame) -> dict:
  gen = g.dropna(subset=["generate_s"])
  tr = g.dropna(subset=["train_s", "train_tokens"])
  gen, tr = gen[gen.generate_s > 0], tr[(tr.train_s > 0) & (tr.train_tokens > 0)]
  out = {}
  if _varies(gen.responses):
    out["gen"] = fits.fit_generation_time(gen.responses, gen.generate_s)
    out["gen_power"] = fits.fit_power(gen.responses, gen.generate_s)
  if _varies(tr.train_tokens):
    out["train"] = fits.fit_linear(tr.train_tokens, tr.train_s)
    out["train_power"] = fits.fit_power(tr.train_tokens, tr.train_s)
  return out


def timing(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Generation vs training time")
  pts = time_points(study) if not study.used().empty else pd.DataFrame()
  if pts.empty or pts.responses.nunique() < 2:
    sec.skipped = "step times at fewer than two batch sizes."
    return sec
  sec.facts["batches"] = (int(pts.responses.min()), int(pts.responses.max()))
  rows, gen_parts, tr_parts = [], [], []
  for (kind, chips, platform), g in pts.groupby(["kind", "chips", "platform"]):
    f = _timing_fits(g)
    panel = f"{kind} {platform}" + (f" {chips} chips" if pts.chips.nunique() > 1 else "")
    row = dict(kind=kind, platform=platform, chips=chips, runs=len(g))
    if "gen" in f:
      gf, gp = f["gen"], f["gen_power"]
      row.update(t0=gf["t0"], theta_max=gf["theta_max"], n_gen=gf["n_gen"], gen_r2=gf["r2"],
                 gen_exponent=f"{num(gp['exponent'])} [{num(gp['exponent_lo'])}, "
                              f"{num(gp['exponent_hi'])}]",
                 gen_fit="ok" if not gf["reasons"] else
                 "not identified (" + "; ".join(gf["reasons"]) + ")")
      n = np.geomspace(g.responses.min(), g.responses.max(), 40)
      gen_parts.append(pd.DataFrame({"panel": "", "series": f"{panel} t0 + N/Θmax", "x": n,
                                     "y": gf["t0"] + n / gf["theta_max"], "style": "fit"}))
      sec.verdict.append(_gen_verdict(kind, platform, gf, gp))
      sec.facts.setdefault("gen_power", {})[kind] = gp
    if "train" in f:
      tf, tp = f["train"], f["train_power"]
      row.update(train_s_per_token=tf["slope"], train_r2=tf["r2"],
                 train_exponent=f"{num(tp['exponent'])} [{num(tp['exponent_lo'])}, "
                                f"{num(tp['exponent_hi'])}]")
      x = np.geomspace(g.train_tokens.min(), g.train_tokens.max(), 40)
      tr_parts.append(pd.DataFrame({"panel": "", "series": f"{panel} linear", "x": x,
                                    "y": tf["intercept"] + tf["slope"] * x, "style": "fit"}))
      sec.verdict.append(f"{kind} training on {platform}: {num(tf['slope'])} s per token "
                         f"(R² {num(tf['r2'])}), time ∝ tokens^{num(tp['exponent'])} "
                         f"[{num(tp['exponent_lo'])}, {num(tp['exponent_hi'])}].")
    rows.append(row)
    gen_parts.append(pd.DataFrame({"panel": "", "series": panel, "x": g.responses,
                                   "y": g.generate_s, "style": "points"}))
    tr_parts.append(pd.DataFrame({"panel": "", "series": panel, "x": g.train_tokens,
                                  "y": g.train_s, "style": "points"}))
  sec.text.append("Per run, the median over steps ≥ 2 of time/generate against responses per "
                  "step N, and of time/actor_update + time/critic_update + time/logprobs against "
                  "train tokens per step; each kind, platform and chip count fitted separately, "
                  "when its step sizes span at least 1.5x. On a CPU, decoding a small model is "
                  "compute-bound, not memory-bound as on accelerators: these fits describe this "
                  "machine, not the GPU claim.")
  sec.facts["rows"] = rows
  sec.tables.append(("Timing fits", pd.DataFrame(rows)))
  sec.figures += [
      Figure("8_generation_time", "Generation time per step vs responses per step N (log-log) "
             "with t_gen = t0 + N/Θmax.\nFlat at small N (latency floor t0), then linear "
             "(throughput bound Θmax); they meet at N_gen = t0·Θmax.",
             pd.concat(gen_parts, ignore_index=True),
             functools.partial(figures.lines, xlabel="responses per step N",
                               ylabel="time/generate (s)", logx=True, logy=True)),
      Figure("8_training_time", "Training time per step (actor + critic + logprobs) vs train "
             "tokens per step (log-log) with the linear fit.\nA slope-1 line in log-log axes "
             "means time proportional to tokens.", pd.concat(tr_parts, ignore_index=True),
             functools.partial(figures.lines, xlabel="train tokens per step",
                               ylabel="training time (s)", logx=True, logy=True))]
  return sec


def _gen_verdict(kind, platform, gf, gp) -> str:
  shape = ("sublinear" if gp["exponent_hi"] < 1 else "about linear"
           if gp["exponent_lo"] <= 1 <= gp["exponent_hi"] else "superlinear") \
      if np.isfinite(gp["exponent_hi"]) else "unknown"
  law = (f"t0 = {num(gf['t0'])} s, Θmax = {num(gf['theta_max'])} responses/s, "
         f"N_gen = {num(gf['n_gen'])}" if not gf["reasons"] else
         "t0 + N/Θmax not identified (" + "; ".join(gf["reasons"]) + ")")
  return (f"{kind} generation on {platform}: time ∝ N^{num(gp['exponent'])} "
          f"[{num(gp['exponent_lo'])}, {num(gp['exponent_hi'])}] ({shape}); {law}.")

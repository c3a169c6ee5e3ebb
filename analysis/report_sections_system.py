"""Sections 5-7: actor vs critic gradient signal and noise, generation vs training time, and
learning-rate rules with equal P x G."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

import figures
import fits
import stats
import study_table as st
from report_md import interval, num
from report_sections import Figure, Section, batch_series

_MODELS = {"actor": "actor/grad_norm", "critic": "critic/grad_norm"}


def _trained(run, key: str) -> list[tuple[float, float]]:
  """(responses_seen, grad norm) of the steps where the model trained (a PPO actor is idle, with
  a zero gradient, while the critic warms up)."""
  return [(x["responses_seen"], x[key]) for x in run.rows
          if isinstance(x.get(key), (int, float)) and math.isfinite(x[key]) and x[key] > 0
          and "responses_seen" in x]


def grad_points(study: st.Study) -> pd.DataFrame:
  """Per run and model: its B and mean |g|^2 and |g| over a matched window of responses seen,
  per kind and model the middle third of the span every one of their runs trained in."""
  out = []
  for kind, group in study.used().groupby("kind"):
    runs = [(r.run, study.records[r.run]) for r in group.itertuples()]
    for model, key in _MODELS.items():
      series = {name: _trained(run, key) for name, run in runs if model in run.plan.models}
      series = {k: v for k, v in series.items() if v}
      if not series:
        continue
      start = max(v[0][0] for v in series.values())
      end = min(v[-1][0] for v in series.values())
      lo, hi = start + (end - start) / 3, start + 2 * (end - start) / 3
      for name, pts in series.items():
        g = [y for x, y in pts if lo <= x <= hi] or [min(pts, key=lambda p: abs(p[0] - lo))[1]]
        out.append(dict(run=name, kind=kind, model=model, lo=lo, hi=hi,
                        B=study.records[name].plan.models[model].minibatch,
                        grad_sq=float(np.mean(np.square(g))), grad_norm=float(np.mean(g))))
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
      sec.text.append(f"{kind} {model}: skipped (grad norms at fewer than two batch sizes, or "
                      "all zero: no reward signal).")
      continue
    f = fits.fit_signal_noise(g.B, g.grad_sq)
    pos = g[g.grad_norm > 0]  # a zero gradient (no reward signal yet) has no logarithm
    p = (fits.fit_power(pos.B, pos.grad_norm) if pos.B.nunique() >= 2
         else dict(exponent=math.nan, coef=math.nan))
    rows.append(dict(kind=kind, model=model, runs=len(g), lo=g.lo.iloc[0], hi=g.hi.iloc[0],
                     grad_sq_true=f["grad_sq_true"],
                     trace=f["trace"], b_simple_fit=f["b_simple"], r2=f["r2"],
                     grad_sq_lo=f["grad_sq_true_interval"][0],
                     grad_sq_hi=f["grad_sq_true_interval"][1],
                     trace_lo=f["trace_interval"][0], trace_hi=f["trace_interval"][1],
                     norm_exponent=p["exponent"]))
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
  res = pd.DataFrame(rows)
  windows = "; ".join(f"{r.kind} {r.model} [{num(r.lo)}, {num(r.hi)}]" for r in res.itertuples())
  sec.text.append("Mean squared grad norm per run over a matched window of responses seen (per "
                  "kind and model, the middle third of the span where all its runs trained: "
                  f"{windows}), regressed on 1/B: E|g_B|² = |G|² + tr Σ/B; "
                  "B_simple = tr Σ/|G|².")
  sec.tables.append(("Signal and noise per model (95% intervals from the regression)",
                     _show(res)))
  for r in res.itertuples():
    resolved = r.grad_sq_true > 0 and r.trace > 0  # else noise hides the 1/B trend
    fit = (f"B_simple from the fit = {num(r.b_simple_fit)}" if resolved else
           "B_simple not resolvable (a non-positive |G|² or tr Σ: no 1/B trend above noise)")
    sec.verdict.append(f"{r.kind} {r.model}: {fit} "
                       f"(|G|² {num(r.grad_sq_true)}, tr Σ {num(r.trace)}); grad norm ∝ "
                       f"B^{r.norm_exponent:.2f} (−0.5 would be pure noise).")
  sec.figures += [
      Figure("5_grad_sq_vs_inverse_batch", "Squared gradient norm vs 1/B, one point per run, "
             "with the line |G|² + tr Σ/B per kind and model.\nThe intercept is the signal "
             "|G|², the slope the noise tr Σ; their ratio is B_simple.",
             pd.concat(sq, ignore_index=True),
             functools.partial(figures.lines, xlabel="1/B", ylabel="|g|²")),
      Figure("5_grad_norm_vs_batch", "Gradient norm vs B (log-log) per kind and model with the "
             "power-law fit and the 1/√B reference.\nA slope near −0.5 means noise dominates; "
             "a flat line (e.g. the critic) means the batch barely changes it.",
             pd.concat(norm, ignore_index=True),
             functools.partial(figures.lines, xlabel="B", ylabel="grad norm", logx=True,
                               logy=True))]
  return sec


def _show(res: pd.DataFrame) -> pd.DataFrame:
  return pd.DataFrame({
      "kind": res.kind, "model": res.model, "runs": res.runs,
      "|G|²": [interval(*v) for v in zip(res.grad_sq_true, res.grad_sq_lo, res.grad_sq_hi)],
      "tr Σ": [interval(*v) for v in zip(res.trace, res.trace_lo, res.trace_hi)],
      "B_simple (fit)": res.b_simple_fit, "R²": res.r2, "grad norm exponent": res.norm_exponent})


def _median_after(rows: list[dict], keys: tuple[str, ...]) -> float:
  """Median over steps >= 2 of the sum of `keys` (missing ones count 0; step 1 compiles)."""
  vals = [sum(float(r.get(k) or 0) for k in keys) for r in rows
          if r.get("step", 0) >= 2 and any(isinstance(r.get(k), (int, float)) for k in keys)]
  return float(np.median(vals)) if vals else math.nan


def time_points(study: st.Study) -> pd.DataFrame:
  out = []
  for r in study.used().itertuples():
    rows = study.records[r.run].rows
    out.append(dict(run=r.run, kind=r.kind, chips=int(r.chips), responses=int(r.responses_per_step),
                    generate_s=_median_after(rows, ("time/generate",)),
                    train_s=_median_after(rows, ("time/actor_update", "time/critic_update",
                                                 "time/logprobs")),
                    train_tokens=_median_after(rows, ("train_tokens",))))
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
    out.update(fits.fit_generation_time(gen.responses, gen.generate_s))
    out["gen_exponent"] = fits.fit_power(gen.responses, gen.generate_s)["exponent"]
    out["critical_generation_batch"] = fits.critical_generation_batch(
        gen.responses, gen.responses / gen.generate_s)
  if _varies(tr.train_tokens):
    lin = fits.fit_linear(tr.train_tokens, tr.train_s)
    out.update(train_s_per_token=lin["slope"], train_intercept=lin["intercept"],
               train_r2=lin["r2"],
               train_exponent=fits.fit_power(tr.train_tokens, tr.train_s)["exponent"])
  return out


def timing(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Generation vs training time")
  pts = time_points(study) if not study.used().empty else pd.DataFrame()
  if pts.empty or pts.responses.nunique() < 2:
    sec.skipped = "step times at fewer than two batch sizes."
    return sec
  rows, gen_parts, tr_parts = [], [], []
  for (kind, chips), g in pts.groupby(["kind", "chips"]):
    f = _timing_fits(g)
    rows.append(dict(kind=kind, chips=chips, runs=len(g), **f))
    panel = f"{kind}" + (f" {chips} chips" if pts.chips.nunique() > 1 else "")
    gen_parts.append(pd.DataFrame({"panel": "", "series": panel, "x": g.responses,
                                   "y": g.generate_s, "style": "points"}))
    if "t0" in f:
      n = np.geomspace(g.responses.min(), g.responses.max(), 40)
      gen_parts.append(pd.DataFrame({"panel": "", "series": f"{panel} t0 + N/Θmax", "x": n,
                                     "y": f["t0"] + n / f["theta_max"], "style": "fit"}))
    tr_parts.append(pd.DataFrame({"panel": "", "series": panel, "x": g.train_tokens,
                                  "y": g.train_s, "style": "points"}))
    if "train_s_per_token" in f:
      x = np.geomspace(g.train_tokens.min(), g.train_tokens.max(), 40)
      tr_parts.append(pd.DataFrame({"panel": "", "series": f"{panel} linear", "x": x,
                                    "y": f["train_intercept"] + f["train_s_per_token"] * x,
                                    "style": "fit"}))
  res = pd.DataFrame(rows)
  sec.text.append("Per run, the median over steps ≥ 2 of time/generate against responses per "
                  "step N, and of time/actor_update + time/critic_update + time/logprobs against "
                  "train tokens per step; each kind (and chip count) fitted separately, when "
                  "its step sizes span at least 1.5x.")
  sec.tables.append(("Timing fits", res.drop(columns=["train_intercept"], errors="ignore")))
  for r in rows:
    _timing_verdict(sec, r)
  sec.figures += [
      Figure("6_generation_time", "Generation time per step vs responses per step N (log-log) "
             "with t_gen = t0 + N/Θmax.\nFlat at small N (latency floor t0), then linear "
             "(throughput bound Θmax); they meet at N_gen = t0·Θmax.",
             pd.concat(gen_parts, ignore_index=True),
             functools.partial(figures.lines, xlabel="responses per step N",
                               ylabel="time/generate (s)", logx=True, logy=True)),
      Figure("6_training_time", "Training time per step (actor + critic + logprobs) vs train "
             "tokens per step (log-log) with the linear fit.\nA slope-1 line in log-log axes "
             "means time proportional to tokens.", pd.concat(tr_parts, ignore_index=True),
             functools.partial(figures.lines, xlabel="train tokens per step",
                               ylabel="training time (s)", logx=True, logy=True))]
  return sec


def _timing_verdict(sec: Section, r: dict):
  if "t0" in r:
    shape = "sublinear" if r["gen_exponent"] < 0.9 else "about linear"
    sec.verdict.append(f"{r['kind']} generation: t0 = {num(r['t0'])} s, Θmax = "
                       f"{num(r['theta_max'])} responses/s, N_gen = t0·Θmax = {num(r['n_gen'])}; "
                       f"time ∝ N^{r['gen_exponent']:.2f} ({shape}).")
  if "train_s_per_token" in r:
    sec.verdict.append(f"{r['kind']} training: {num(r['train_s_per_token'])} s per token "
                       f"(R² {num(r['train_r2'])}), time ∝ tokens^{r['train_exponent']:.2f}.")

"""The critical training batch (E(B) = E_min (1 + B/B_crit), McCandlish et al. 2018) beside the
measured gradient noise scale, and the compute-performance curves (ScaleRL's sigmoid, Khatri et
al. 2025)."""

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
from analysis.sections.common import study_series
from analysis.sections.types import Figure, Section


def targets_of(study: st.Study, delta: float = 0.05) -> list[float]:
  """The critical batch's targets: --targets, else the study's and `delta` either side."""
  if study.opts.targets:
    return list(study.opts.targets)
  return [round(study.target + d, 4) for d in (-delta, 0.0, delta)]


def _primary(study: st.Study, table: pd.DataFrame):
  """The series the fit is made on: the first kind's chosen-lr series (GRPO's when present),
  else its first series."""
  ss = study_series(study, table)
  if not ss:
    return None
  kinds = [s.kind for s in ss]
  kind = "grpo" if "grpo" in kinds else kinds[0]
  mine = [s for s in ss if s.kind == kind]
  return next((s for s in mine if s.chosen and not s.filtered), mine[0])


def b_simple_values(study: st.Study, configs: list[str]) -> tuple[np.ndarray, np.ndarray, str]:
  """The runs' mean |G|^2 and tr(Sigma) estimates around their crossing (tr in responses):
  prompt-level (x G) where measured, else response-level (biased low when responses share a
  prompt), and which one it is. B_simple is their pooled ratio of means (stats.pooled_ratio):
  a single run's |G|^2 estimate over a few steps is often not positive."""
  runs = study.verdict_runs()
  runs = runs[runs.config.isin(configs)]
  for unit, what in (("prompts", "prompt-level x G"), ("responses", "response-level")):
    g2, tr = runs[f"g2_{unit}"].to_numpy(float), runs[f"trace_{unit}"].to_numpy(float)
    keep = ~(np.isnan(g2) | np.isnan(tr))
    if keep.any():
      return g2[keep], tr[keep], what
  return np.zeros(0), np.zeros(0), "none measured"


def _fit_at(study: st.Study, s, target: float) -> dict:
  points = {}
  for b, c in sorted(s.configs.items()):
    v = st.seed_values(study, c, target=target)
    if v.size:
      points[b] = v
  row = dict(target=target, batches=len(points))
  if len(points) < 3:
    return dict(row, identified=False, reasons=["fewer than 3 batches"], points=points)
  f = fits.critical_batch(points, reps=study.opts.fit_reps, seed=study.opts.seed)
  return dict(row, points=points, **f)


def critical_batch(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Critical training batch and the gradient noise scale")
  s = _primary(study, table) if not table.empty else None
  if s is None or len(s.configs) < 3:
    sec.skipped = "no series with 3 or more batches."
    return sec
  fits_ = [_fit_at(study, s, t) for t in targets_of(study)]
  g2, tr, what = b_simple_values(study, list(s.configs.values()))
  bs_iv = stats.pooled_ratio(tr, g2, reps=study.opts.reps, seed=study.opts.seed)
  bs = (g2, tr)
  sec.text.append(
      f"Fit on {s.kind} ({s.name}): E(B) = E_min (1 + B/B_crit) to the median responses to "
      "target per batch, least squares in log E (multiplicative errors; McCandlish's "
      "(S/S_min − 1)(E/E_min − 1) = 1 with S = E/B is the same law); B_crit's interval from "
      f"{study.opts.fit_reps} resamples of the seeds within each batch. It is *not identified* "
      "when E falls with B, when the residuals exceed the seeds' spread, or when B_crit lies "
      "beyond the batches tried (then only a bound is given). B_simple: the runs' raw "
      f"noise-scale estimates over [½, 3/2] of their crossing, {what}, pooled over the runs as "
      "a ratio of means (mean tr Σ / mean |G|²) with a bootstrap over runs.")
  rows = []
  for f in fits_:
    rows.append(_row(f, bs))
  res = pd.DataFrame(rows)
  sec.facts.update(fits=fits_, b_simple=bs_iv, b_simple_what=what, series=s)
  both = []
  for unit in ("prompts", "responses"):
    runs = study.verdict_runs()
    runs = runs[runs.config.isin(list(s.configs.values()))]
    v = stats.pooled_ratio(runs[f"trace_{unit}"], runs[f"g2_{unit}"], reps=study.opts.reps,
                           seed=study.opts.seed)
    if not math.isnan(v.point):
      both.append(f"{'prompt-level x G' if unit == 'prompts' else 'response-level'} "
                  f"{_bs(v)} over {v.n} runs")
  if len(both) == 2:
    sec.text.append("B_simple at the crossing, both estimates: " + "; ".join(both) + " (the "
                    "response-level one treats the G responses of a prompt as independent and "
                    "reads low by about (G−1) tr Σ_prompt / B on |G|², rlscale/rl/noise_scale.py)"
                    ".")
  sec.tables.append((f"B_crit per target ({s.kind}, {s.name})", res.drop(columns=["_ratio"])))
  at = min(fits_, key=lambda f: abs(f["target"] - study.target))
  sec.verdict.append(_verdict(study, s, at, bs_iv, what, rows[fits_.index(at)]["_ratio"]))
  sec.figures += [_e_figure(study, s, fits_), _bcrit_figure(fits_, bs_iv)]
  return sec


def _ratio(f: dict, bs: tuple, seed: int = 0) -> stats.Interval:
  """B_crit / B_simple with an interval: the fit's bootstrap draws over draws of the pooled
  B_simple with its runs resampled."""
  draws = f.get("b_crit_draws")
  g2, tr = bs
  if not f.get("identified") or draws is None or g2.size < 2:
    return stats.Interval(math.nan, n=0)
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, g2.size, (draws.size, g2.size))
  sg, st_ = g2[idx].sum(1), tr[idx].sum(1)
  with np.errstate(divide="ignore", invalid="ignore"):
    q = np.where(sg > 0, draws / (st_ / sg), 0.0)  # B_simple unbounded: the ratio is 0
  lo, hi = np.quantile(q, [0.025, 0.975])
  pooled = tr.sum() / g2.sum() if g2.sum() > 0 else math.inf
  return stats.Interval(f["b_crit"] / pooled, float(lo), float(hi),
                        min(g2.size, min(f["n"])), math.nan, "bootstrap")


def _row(f: dict, bs: tuple) -> dict:
  q = _ratio(f, bs)
  n = "/".join(map(str, f.get("n", []))) if f.get("n") else "—"
  if f.get("identified"):
    bc = f"{num(f['b_crit'])} [{num(f['b_crit_lo'])}, {num(f['b_crit_hi'])}]"
    e_min = f"{num(f['e_min'])} [{num(f['e_min_lo'])}, {num(f['e_min_hi'])}]"
    s_min = f"{num(f['s_min'])} [{num(f['s_min_lo'])}, {num(f['s_min_hi'])}]"
  else:
    bound = f.get("bound")
    bc = "not identified (" + "; ".join(f.get("reasons", [])) + ")" + (
        f"; B_crit {'>' if bound[0] == 'lower' else '<'} {num(bound[1])}" if bound else "")
    e_min = s_min = "—"
  return {"target": f["target"], "batches": f["batches"], "seeds per batch": n,
          "B_crit": bc, "E_min": e_min, "S_min": s_min,
          "rms log residual": f.get("residual", math.nan),
          "B_crit / B_simple": f"{num(q.point)} [{num(q.lo)}, {num(q.hi)}]"
          if q.has_bounds else "—", "_ratio": q}


def _verdict(study, s, f, bs_iv, what, q) -> str:
  head = f"Critical training batch ({s.kind}, {s.name}) at target {num(f['target'])}: "
  bs_text = (f"measured B_simple at the crossing {_bs(bs_iv)} responses ({what}, pooled over "
             f"{bs_iv.n} runs)" if not math.isnan(bs_iv.point) else "B_simple not measured")
  if f.get("identified"):
    tol = fits.tolerance_batch(f["b_crit"], study.opts.tolerance)
    return (head + f"**B_crit = {num(f['b_crit'])} [{num(f['b_crit_lo'])}, "
            f"{num(f['b_crit_hi'])}]** responses (seeds per batch {'/'.join(map(str, f['n']))})"
            f", S_min = {num(f['s_min'])} steps; {bs_text}; B_crit/B_simple = "
            f"{num(q.point)} [{num(q.lo)}, {num(q.hi)}]; E stays within "
            f"{study.opts.tolerance:.0%} of E_min up to B ≈ {num(tol)}.")
  bound = f.get("bound")
  return (head + "**not identified** (" + "; ".join(f.get("reasons", [])) + ")"
          + (f": B_crit {'>' if bound[0] == 'lower' else '<'} {num(bound[1])} responses"
             if bound else "") + f"; {bs_text}.")


def _bs(v: stats.Interval) -> str:
  """A pooled B_simple: its bootstrap interval (unbounded reads ∞: noise swamps the signal)."""
  if math.isinf(v.point):
    return "unbounded (the pooled |G|² estimate is not positive)"
  return f"{num(v.point)} [{num(v.lo)}, {num(v.hi)}]" if v.has_bounds else num(v.point)


def _e_figure(study, s, fits_) -> Figure:
  parts = []
  for f in fits_:
    name = f"target {num(f['target'])}"
    pts = f.get("points", {})
    for b, v in pts.items():
      fin = v[np.isfinite(v)]
      parts.append(pd.DataFrame({"panel": "", "series": name, "x": float(b),
                                 "y": fin if fin.size else [np.nan], "style": "points"}))
    if f.get("identified"):
      b = np.geomspace(min(pts), max(pts), 40)
      parts.append(pd.DataFrame({"panel": "", "series": f"{name} fit", "x": b,
                                 "y": f["e_min"] * (1 + b / f["b_crit"]), "style": "fit"}))
  return Figure("4_responses_vs_batch",
                f"Responses to target E vs B, one point per seed ({s.kind}, {s.name}), with "
                "E = E_min (1 + B/B_crit) where the fit identifies B_crit (dotted).\nFlat: "
                "more batch costs no extra responses (steps fall as 1/B); the knee is at "
                "B = B_crit, where E has doubled.",
                pd.concat(parts, ignore_index=True).assign(sample_axis=study.opts.x),
                functools.partial(figures.lines, xlabel="B (responses per optimizer step)",
                                  ylabel=f"{st.x_label(study)} to target", logx=True,
                                  logy=True))


def _bcrit_figure(fits_, bs_iv) -> Figure:
  ok = [f for f in fits_ if f.get("identified")]
  data = pd.DataFrame({"panel": "", "series": "B_crit (fit)", "x": [f["target"] for f in ok],
                       "y": [f["b_crit"] for f in ok], "lo": [f["b_crit_lo"] for f in ok],
                       "hi": [f["b_crit_hi"] for f in ok], "style": "points"})
  bound = [f for f in fits_ if not f.get("identified") and f.get("bound")]
  if bound:
    data = pd.concat([data, pd.DataFrame({
        "panel": "", "series": "B_crit bound (not identified)",
        "x": [f["target"] for f in bound], "y": [f["bound"][1] for f in bound],
        "style": "points"})], ignore_index=True)
  if not math.isnan(bs_iv.point):
    x = [f["target"] for f in fits_]
    data = pd.concat([data, pd.DataFrame({"panel": "", "series": "measured B_simple",
                                          "x": x, "y": bs_iv.point, "lo": bs_iv.lo,
                                          "hi": bs_iv.hi, "style": "line"})], ignore_index=True)
  return Figure("4_bcrit_vs_target",
                "Critical training batch B_crit per target with its interval (where identified; "
                "a bound where not), and the runs' B_simple at the crossing with its interval."
                "\nMcCandlish et al. find B_crit growing as the target gets harder; B_simple "
                "can underestimate it.", data,
                functools.partial(figures.lines, xlabel="target", logy=True,
                                  ylabel="batch (responses per optimizer step)"))


# --- compute-performance curves -------------------------------------------------------------

def _seed_curves(study: st.Study, config: str) -> list:
  runs = study.verdict_runs()
  out = [st.eval_curve(study.records[r], study.metric, study.opts.x)
         for r in runs[runs.config == config].run]
  return [c for c in out if c[0].size >= 4]


def _sigmoid_row(study: st.Study, b: int, config: str, label: str, panel: str):
  curves = _seed_curves(study, config)
  row = dict(configuration=label, B=b, seeds=len(curves))
  if not curves:
    return dict(row, fit="not identified (fewer than 4 evaluations)"), None
  try:
    f = fits.fit_sigmoid_interval(curves, reps=min(study.opts.fit_reps, 200),
                                  seed=study.opts.seed)
  except (ValueError, RuntimeError) as e:
    return dict(row, fit=f"not identified ({str(e).splitlines()[0]})"), None
  p = f["fit"]
  for k in ("A", "B", "c_mid"):
    row[k] = f"{num(f[k][0])} [{num(f[k][1])}, {num(f[k][2])}]"
  row.update(rmse=p["rmse"], fit="ok" if not f["reasons"] else
             "not identified (" + "; ".join(f["reasons"]) + ")")
  c = st.config_curve(study, config)
  grid = np.geomspace(max(c.responses[c.responses > 0].min(), 1), c.responses.max(), 50)
  data = pd.concat([
      pd.DataFrame({"panel": panel, "series": f"B={b}", "x": c.responses,
                    "y": c["median"], "style": "points"}),
      pd.DataFrame({"panel": panel, "series": f"B={b} fit", "x": grid, "style": "fit",
                    "y": fits.sigmoid(grid, p["r0"], p["A"], p["B"], p["c_mid"])})])
  return row, data


def compute_curves(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Compute–performance curves")
  ss = [s for s in study_series(study, table) if s.chosen] or \
      study_series(study, table)[:1]
  if table.empty or not ss:
    sec.skipped = "no batch series."
    return sec
  rows, parts = [], []
  for s in ss:
    for b, c in sorted(s.configs.items()):
      label = table[table.config == c].label.iloc[0]
      row, data = _sigmoid_row(study, b, c, label, f"{s.kind} {s.name}")
      rows.append(row)
      if data is not None:
        parts.append(data)
  sec.text.append("R(C) = R0 + (A − R0)/(1 + (C_mid/C)^B) with C in "
                  f"{st.x_label(study)}, fitted per "
                  "configuration to the mean of its seeds' curves (grid over A and C_mid, B by "
                  "least squares), intervals from resampling seeds. A fit whose parameter sits "
                  "at a bound, or whose half-gain point lies past the data (A then extrapolates),"
                  " is *not identified*. No verdict is drawn from A: the runs end on their "
                  "plateau's data, and the final values are in the decision table.")
  sec.tables.append(("Sigmoid fits (A: asymptote, B: efficiency, C_mid: half-gain responses)",
                     pd.DataFrame(rows)))
  if parts:
    sec.figures.append(Figure(
        "7_compute_curves", f"`{study.metric}` vs {st.x_label(study)} (points: median over "
        "seeds) with "
        "the fitted sigmoid (dotted), one panel per series.\nA smaller C_mid reaches half the "
        "gain sooner; the fit is a description, not a forecast past the data.",
        pd.concat(parts, ignore_index=True).assign(sample_axis=study.opts.x),
        functools.partial(figures.lines, xlabel=st.x_label(study), ylabel=study.metric,
                          logx=True)))
  return sec

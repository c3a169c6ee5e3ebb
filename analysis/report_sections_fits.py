"""Sections 3 and 4: the critical training batch (steps-samples trade-off, McCandlish et al.
2018) and the compute-performance curves (ScaleRL's sigmoid, Khatri et al. 2025)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

import figures
import fits
import study_table as st
from report_md import interval, num
from report_sections import Figure, Section, batch_series


def default_targets(study: st.Study) -> list[float]:
  """4 evenly spaced between the base policy's value and the best run's final value."""
  used = study.used()
  base, best = float(used.base.median()), float(used.final.max())
  return [float(t) for t in np.linspace(base, best, 6)[1:-1]] if best > base else []


def _fit_series(table: pd.DataFrame) -> tuple[str, str] | None:
  """(kind, rule) of the fit: GRPO if present, the sqrt rule, else the rule with most reached."""
  kinds = list(table.kind.unique())
  kind = "grpo" if "grpo" in kinds else kinds[0]
  d = table[table.kind == kind]
  reached = d[np.isfinite(d.rtt)].groupby("lr_rule").size()
  if "sqrt" in set(d.lr_rule) and reached.get("sqrt", 0) >= 3:
    return kind, "sqrt"
  return (kind, reached.idxmax()) if len(reached) else None


def _tradeoff_at(study, table, kind, rule, target) -> dict:
  configs = sorted(set(batch_series(table, kind, rule).config))  # a fixed order: same draws
  vals = st.seed_values(study, target)
  points = {}
  for c in configs:
    pts = [(study.records[run].optimizer_steps(e), e)
           for run, e in zip(vals[c]["run"], vals[c]["rtt"]) if math.isfinite(e)]
    if pts:
      points[c] = pts
  row = dict(target=target, configs=len(points))
  try:
    iv = fits.tradeoff_interval(points, reps=study.opts.fit_reps, seed=study.opts.seed)
  except (ValueError, RuntimeError) as e:
    return dict(row, error=str(e).splitlines()[0], points=points)
  for k in ("b_crit", "s_min", "e_min"):
    row.update({k: iv[k][0], f"{k}_lo": iv[k][1], f"{k}_hi": iv[k][2]})
  return dict(row, failed_reps=iv["failed"], error="", points=points)


def critical_batch(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Critical training batch: steps vs responses to several targets")
  series = _fit_series(table) if not table.empty else None
  targets = study.opts.targets or default_targets(study)
  if series is None or not targets:
    sec.skipped = "no configuration reached any target (the trade-off needs 3 batches)."
    return sec
  kind, rule = series
  rows = [_tradeoff_at(study, table, kind, rule, t) for t in targets]
  ok = [r for r in rows if not r["error"]]
  used = study.used()
  mine = used[used.config.isin(batch_series(table, kind, rule).config)]
  b_simple = float(np.nanmean(mine.b_simple)) if mine.b_simple.notna().any() else math.nan
  res = pd.DataFrame([{k: v for k, v in r.items() if k != "points"} for r in rows])
  res["b_simple"] = b_simple
  res["b_crit_over_b_simple"] = res.get("b_crit", np.nan) / b_simple
  sec.text.append(f"Fit on {kind} configurations with LR rule {rule} (one per B); S = the "
                  "actor's optimizer steps, E = responses, per seed; B_simple = mean over the "
                  "same runs of actor/noise_responses/b_simple over each run's second half.")
  sec.tables.append(("B_crit per target (95% bootstrap interval over seeds)",
                     _show(res)))
  if not ok:
    sec.verdict.append(f"Critical batch ({kind}, {rule}): no fit ({rows[0]['error']}).")
    return sec
  best = min(ok, key=lambda r: abs(r["target"] - study.target))
  tol = fits.tolerance_batch(best["b_crit"], study.opts.tolerance)
  sec.verdict.append(
      f"Critical training batch ({kind}, {rule}) at target {num(best['target'])}: **B_crit = "
      f"{interval(best['b_crit'], best['b_crit_lo'], best['b_crit_hi'])}** responses; measured "
      f"B_simple {num(b_simple)} (B_crit/B_simple = {num(best['b_crit'] / b_simple)}); a "
      f"{study.opts.tolerance:.0%} tolerance holds up to about B ≈ {num(tol)}.")
  sec.figures += [_bcrit_figure(res), _se_figure(ok)]
  return sec


def _show(res: pd.DataFrame) -> pd.DataFrame:
  out = pd.DataFrame({"target": res.target, "configurations reached": res.configs})
  if "b_crit" in res:
    out["B_crit"] = [interval(*v) for v in zip(res.b_crit, res.b_crit_lo, res.b_crit_hi)]
    out["S_min"] = [interval(*v) for v in zip(res.s_min, res.s_min_lo, res.s_min_hi)]
    out["E_min"] = [interval(*v) for v in zip(res.e_min, res.e_min_lo, res.e_min_hi)]
    out["B_crit/B_simple"] = res.b_crit_over_b_simple
  out["fit"] = [e or "ok" for e in res.error]
  return out


def _bcrit_figure(res: pd.DataFrame) -> Figure:
  ok = res[res.error == ""]
  data = pd.concat([
      pd.DataFrame({"panel": "", "series": "B_crit (fit)", "x": ok.target, "y": ok.b_crit,
                    "lo": ok.b_crit_lo, "hi": ok.b_crit_hi, "style": "points"}),
      pd.DataFrame({"panel": "", "series": "measured B_simple", "x": ok.target,
                    "y": ok.b_simple, "lo": np.nan, "hi": np.nan, "style": "fit"})])
  return Figure("3_bcrit_vs_target",
                "Critical training batch B_crit = E_min/S_min per target with its 95% bootstrap "
                "interval, and the runs' mean measured B_simple.\nMcCandlish et al. find B_crit "
                "growing as the target gets harder; B_simple can underestimate it.",
                data, functools.partial(figures.lines, xlabel="target", logy=True,
                                        ylabel="batch (responses per optimizer step)"))


def _se_figure(ok: list[dict]) -> Figure:
  parts = []
  for r in ok:
    s, e = np.array([p for pts in r["points"].values() for p in pts]).T
    name = f"target {num(r['target'])}"
    parts.append(pd.DataFrame({"panel": "", "series": name, "x": e, "y": s, "style": "points"}))
    grid = np.geomspace(r["e_min"] * 1.02, e.max() * 2, 60)
    parts.append(pd.DataFrame({"panel": "", "series": name + " fit", "x": grid,
                               "y": r["s_min"] * grid / (grid - r["e_min"]), "style": "fit"}))
  return Figure("3_steps_vs_responses",
                "Optimizer steps S vs responses E to each target (one point per run) with the "
                "fitted hyperbola (S/S_min − 1)(E/E_min − 1) = 1.\nThe knee is at "
                "S = 2 S_min, E = 2 E_min; past it more responses buy few steps.",
                pd.concat(parts, ignore_index=True),
                functools.partial(figures.lines, xlabel="responses E", ylabel="steps S",
                                  logx=True, logy=True))


def _seed_curves(study: st.Study, config: str) -> list:
  used = study.used()
  out = [st.eval_curve(study.records[r], study.metric) for r in used[used.config == config].run]
  return [c for c in out if c[0].size >= 4]


def _sigmoid_row(study: st.Study, r) -> tuple[dict, pd.DataFrame | None]:
  curves = _seed_curves(study, r.config)
  row = dict(configuration=r.label, kind=r.kind, lr_rule=r.lr_rule, B=int(r.B))
  if not curves:
    return dict(row, error="fewer than 4 evaluations"), None
  try:
    # n seeds have few distinct resamples (3 for 2 seeds): more reps only refit the same.
    reps = min(study.opts.fit_reps, 10 * len(curves))
    iv = fits.fit_sigmoid_interval(curves, reps=reps, seed=study.opts.seed)
    c = st.config_curve(study, r.config)
    ex = fits.extrapolation_check(c.responses_seen, c["median"])
  except (ValueError, RuntimeError) as e:
    return dict(row, error=str(e).splitlines()[0]), None
  for k in ("A", "B", "c_mid"):
    row.update({f"fit_{k}": iv[k][0], f"fit_{k}_lo": iv[k][1], f"fit_{k}_hi": iv[k][2]})
  f = iv["fit"]
  row.update(r0=f["r0"], rmse=f["rmse"], extrapolated=ex["predicted"], measured=ex["measured"],
             extrapolation_error=ex["error"], c_final=ex["c_final"], error="")
  grid = np.geomspace(max(c.responses_seen[c.responses_seen > 0].min(), 1),
                      c.responses_seen.max(), 50)
  panel = f"{r.kind} {r.lr_rule}"
  data = pd.concat([
      pd.DataFrame({"panel": panel, "series": f"B={r.B}", "x": c.responses_seen,
                    "y": c["median"], "style": "points"}),
      pd.DataFrame({"panel": panel, "series": f"B={r.B} fit", "x": grid, "style": "fit",
                    "y": fits.sigmoid(grid, f["r0"], f["A"], f["B"], f["c_mid"])})])
  return row, data


def _each_config(study: st.Study, table: pd.DataFrame, fit) -> tuple[list, list]:
  """`fit(study, configuration)` over each kind and LR rule's batch series: (its rows, its
  figure data where it had some)."""
  rows, parts = [], []
  for kind, rule in table[["kind", "lr_rule"]].drop_duplicates().itertuples(index=False):
    for r in batch_series(table, kind, rule).itertuples():
      row, data = fit(study, r)
      rows.append(row)
      if data is not None:
        parts.append(data)
  return rows, parts


def _flops_curve(run, metric: str) -> tuple[list, list] | None:
  """(cumulative model FLOPs, metric) at each evaluation, from the rows' flops/step; None when a
  step lacks it (runs from before it was logged)."""
  total, xs, ys = 0.0, [], []
  for row in run.rows:
    if row.get("step", 0) > 0:
      if not isinstance(row.get("flops/step"), (int, float)):
        return None
      total += row["flops/step"]
    if isinstance(row.get(metric), (int, float)):
      xs.append(total)
      ys.append(float(row[metric]))
  return xs, ys


def _flops_fit(study: st.Study, r) -> tuple[dict, pd.DataFrame | None]:
  """The sigmoid in FLOPs of one configuration: mean FLOPs and median metric per evaluation."""
  used = study.used()
  curves = [_flops_curve(study.records[run], study.metric)
            for run in used[used.config == r.config].run]
  row = dict(configuration=r.label)
  if not curves or any(c is None for c in curves):
    return dict(row, error="no flops/step"), None
  n = min(len(c[0]) for c in curves)
  x = np.mean([c[0][:n] for c in curves], axis=0)
  y = np.median([c[1][:n] for c in curves], axis=0)
  try:
    f = fits.fit_sigmoid(x, y)
  except (ValueError, RuntimeError) as e:
    return dict(row, error=str(e).splitlines()[0]), None
  grid = np.geomspace(x[x > 0].min(), x.max(), 50)
  panel = f"{r.kind} {r.lr_rule}"
  data = pd.concat([
      pd.DataFrame({"panel": panel, "series": f"B={r.B}", "x": x, "y": y, "style": "points"}),
      pd.DataFrame({"panel": panel, "series": f"B={r.B} fit", "x": grid, "style": "fit",
                    "y": fits.sigmoid(grid, f["r0"], f["A"], f["B"], f["c_mid"])})])
  return dict(row, A=f["A"], B=f["B"], C_mid_flops=f["c_mid"], rmse=f["rmse"], error=""), data


def _flops_section(study: st.Study, table: pd.DataFrame, sec: Section) -> None:
  rows, parts = _each_config(study, table, _flops_fit)
  if not parts:
    sec.text.append("FLOPs: absent (no flops/step in the runs' metrics: runs from before it "
                    "was logged); curves are in responses only.")
    return
  sec.text.append("In FLOPs: the same fit against the model FLOPs the runs spent (the sum of "
                  "flops/step: generation, log-probs and updates, as rlscale/flops.py counts "
                  "them), seeds' FLOPs averaged and metric's median per evaluation.")
  sec.tables.append(("Sigmoid fits in FLOPs (point fits)", pd.DataFrame(rows)))
  sec.figures.append(Figure(
      "4_compute_curves_flops", f"`{study.metric}` vs model FLOPs spent (median over seeds) "
      "with the fitted sigmoid, one panel per kind and LR rule.\nA batch that needs more FLOPs "
      "for the same gain spends them on responses, extra forwards or updates.",
      pd.concat(parts, ignore_index=True),
      functools.partial(figures.lines, xlabel="model FLOPs", ylabel=study.metric, logx=True)))


def compute_curves(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Compute–performance curves")
  if table.empty:
    sec.skipped = "no finished run."
    return sec
  rows, parts = _each_config(study, table, _sigmoid_row)
  res = pd.DataFrame(rows)
  sec.text += [f"R(C) = R0 + (A − R0)/(1 + (C_mid/C)^B) with C in responses, fitted per "
               f"configuration (grid over A and C_mid, B by least squares) on the mean of its "
               f"seeds; intervals: min({study.opts.fit_reps}, 10 × seeds) bootstrap reps over "
               "seeds. "
               "Extrapolation: fitted on the first half of the responses, predicted at the end."]
  sec.tables.append(("Sigmoid fits (A: asymptote, B: efficiency, C_mid: half-gain responses)",
                     _show_sigmoid(res)))
  if parts:
    sec.figures.append(Figure(
        "4_compute_curves", f"`{study.metric}` vs responses (points: median over seeds) with "
        "the fitted sigmoid (dotted), one panel per kind and LR rule.\nA higher asymptote A "
        "is a better final policy; a smaller C_mid reaches half the gain sooner.",
        pd.concat(parts, ignore_index=True),
        functools.partial(figures.lines, xlabel="responses seen", ylabel=study.metric,
                          logx=True)))
    # A is resolved only once the curve has passed its half-gain point.
    good = res[(res.error == "") & (res.get("fit_c_mid", np.inf) < res.get("c_final", 0))]
    if len(good):
      top = good.loc[good.fit_A.idxmax()]
      sec.verdict.append(f"Highest fitted asymptote: {top.configuration}: A = "
                         f"{interval(top.fit_A, top.fit_A_lo, top.fit_A_hi)} (extrapolation "
                         f"error from half the data: {num(top.extrapolation_error)}).")
  _flops_section(study, table, sec)
  return sec


def _show_sigmoid(res: pd.DataFrame) -> pd.DataFrame:
  if "fit_A" not in res:
    return res
  iv = lambda k: [interval(*v) for v in zip(res[k], res[k + "_lo"], res[k + "_hi"])]  # noqa
  return pd.DataFrame({"configuration": res.configuration, "A": iv("fit_A"), "B": iv("fit_B"),
                       "C_mid": iv("fit_c_mid"), "rmse": res.rmse,
                       "predicted at end (half fit)": res.extrapolated,
                       "measured": res.measured, "fit": [e or "ok" for e in res.error]})

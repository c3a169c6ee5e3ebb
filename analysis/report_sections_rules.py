"""Section 7: learning-rate rules (and the LR tuning at B0) and configurations of equal P x G."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

import figures
import stats
import study_table as st
from report_md import interval, num
from report_sections import Figure, Section


def lr_tuning(study: st.Study) -> pd.DataFrame:
  """Runs at B0 per base learning rate: responses to target and final metric over seeds."""
  ok = study.runs[(study.runs.problem == "") & (study.runs.B == study.runs.B0)]
  if ok.empty or ok.groupby("kind").lr.nunique().max() < 2:
    return pd.DataFrame()
  o, rows = study.opts, []
  for (kind, lr), g in ok.groupby(["kind", "lr"]):
    rtt = stats.bootstrap_interval(g.responses_to_target, o.stat, o.reps, seed=o.seed)
    fin = stats.bootstrap_interval(g.final, o.stat, o.reps, seed=o.seed)
    rows.append({"kind": kind, "lr": lr, "seeds": len(g), "used": bool(g.lr_chosen.all()),
                 "responses to target": interval(*rtt, final=fin[0]),
                 "final": interval(*fin)})
  return pd.DataFrame(rows)


def _rule_rows(table: pd.DataFrame) -> pd.DataFrame:
  return pd.DataFrame({"panel": table.kind, "series": table.lr_rule, "x": table.B,
                       "y": table.rtt.replace(np.inf, np.nan),
                       "lo": table.rtt_lo.replace(np.inf, np.nan),
                       "hi": table.rtt_hi.replace(np.inf, np.nan), "style": "line",
                       "G": table.G, "reached": np.isfinite(table.rtt)})


def equal_pg_groups(table: pd.DataFrame) -> list[pd.DataFrame]:
  """Configurations with the same kind, LR rule and P x G but different (P, G)."""
  out = []
  for _, g in table.groupby(["kind", "lr_rule", "responses_per_step", "num_minibatches"]):
    g = g.sort_values("n_seeds", ascending=False).drop_duplicates(["P", "G"])
    if len(g) >= 2:
      out.append(g.sort_values("G"))
  return out


def _pair_rows(study: st.Study, g: pd.DataFrame, main_g: int) -> tuple[list, list]:
  o = study.opts
  vals = st.seed_values(study)
  main = g[g.G == main_g]
  base = (main if len(main) else g).iloc[0]
  panel = f"{base.kind} {base.lr_rule} P×G={base.responses_per_step}"
  rows, curves = [], []
  for r in g.itertuples():
    a, b = (np.asarray(vals[c]["rtt"], float) for c in (r.config, base.config))
    ratio = (stats.ratio_interval(a, b, o.stat, o.reps, seed=o.seed)
             if not (np.isinf(a).all() and np.isinf(b).all()) else (math.nan,) * 3)
    rows.append({"P×G": r.responses_per_step, "configuration": r.label, "versus": base.label,
                 "responses to target": interval(r.rtt, r.rtt_lo, r.rtt_hi, r.final),
                 "ratio": interval(*ratio, unit="×"), "ratio_point": ratio[0]})
    c = st.config_curve(study, r.config)
    curves.append(pd.DataFrame({"panel": panel, "series": f"P={r.P} G={r.G}",
                                "x": c.responses_seen, "y": c["median"], "lo": c.lo,
                                "hi": c.hi, "style": "line"}))
  return rows, curves


def rules_and_pairs(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("LR rules and equal P×G")
  tuning = lr_tuning(study)
  if not tuning.empty:
    sec.tables.append(("LR tuning at B0 (runs at the reference batch per base lr)", tuning))
  if table.empty:
    sec.skipped = "no finished run."
    return sec
  rules = sorted(table.lr_rule.unique())
  pivot = table.assign(cell=[interval(r.rtt, r.rtt_lo, r.rtt_hi, r.final)
                             for r in table.itertuples()])
  pivot = pivot[pivot.G == [st.main_group_size(table, k) for k in pivot.kind]]
  pivot = pivot.pivot_table(index=["kind", "B"], columns="lr_rule", values="cell",
                            aggfunc="first").reset_index()
  sec.tables.append((f"Responses to target per LR rule ({', '.join(rules)}) at each B", pivot))
  sec.figures.append(Figure(
      "7_rtt_per_rule", "Responses to target vs B (log x), one line per LR rule and panel per "
      "kind, 95% interval shaded.\nThe lowest line is the best rule at that batch; missing "
      "points never reached the target.", _rule_rows(table),
      functools.partial(figures.lines, xlabel="B (responses per optimizer step)",
                        ylabel="responses to target", logx=True)))
  groups = equal_pg_groups(table)
  if not groups:
    sec.text.append("Equal P×G: no two configurations share P×G with different (P, G).")
    return sec
  rows, curves = [], []
  for g in groups:
    r, c = _pair_rows(study, g, st.main_group_size(table, g.kind.iloc[0]))
    rows += r
    curves += c
  pairs = pd.DataFrame(rows)
  sec.tables.append(("Equal P×G: responses to target relative to the main G",
                     pairs.drop(columns=["ratio_point"])))
  for r in rows:
    if r["configuration"] != r["versus"]:
      sec.verdict.append(f"Equal P×G = {r['P×G']}: {r['configuration']} needs "
                         f"{r['ratio']} the responses of {r['versus']}.")
  sec.figures.append(Figure(
      "7_equal_PxG_curves", f"`{study.metric}` vs responses for configurations of equal P×G "
      "(median over seeds, seed range shaded), one panel per P×G.\nOverlapping curves mean "
      "only the product P×G matters, not how it splits into prompts and responses.",
      pd.concat(curves, ignore_index=True),
      functools.partial(figures.lines, xlabel="responses seen", ylabel=study.metric,
                        hline=study.target)))
  return sec

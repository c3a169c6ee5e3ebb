"""The report's sections: each function computes one section's tables, figures and verdict.

A section gets the study (runs) and the configuration table (seeds aggregated at the target)
and returns a Section; drawing and writing happen elsewhere (figures.py, report_md.py). This
file holds the two most important sections, the decision table and where invariance breaks;
the others live in report_sections_*.py and are listed in SECTIONS at the end.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np
import pandas as pd

import figures
import study_table as st
from report_md import interval, num


@dataclasses.dataclass
class Figure:
  stem: str  # file name of the PNG, PDF and CSV
  caption: str  # two lines: what it shows, how to read it
  data: pd.DataFrame  # the CSV, and all the figure is drawn from
  draw: Callable[[pd.DataFrame], object]


@dataclasses.dataclass
class Section:
  title: str
  text: list[str] = dataclasses.field(default_factory=list)
  verdict: list[str] = dataclasses.field(default_factory=list)
  figures: list[Figure] = dataclasses.field(default_factory=list)
  tables: list[tuple[str, pd.DataFrame]] = dataclasses.field(default_factory=list)
  skipped: str = ""


def _ttt_text(r) -> str:
  return interval(r.ttt, r.ttt_lo, r.ttt_hi, r.final) + ("" if math.isinf(r.ttt) else " s")


def decision(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Decision table: responses and time to target per configuration")
  if table.empty:
    sec.skipped = "no finished run to compare."
    return sec
  show = pd.DataFrame({
      "configuration": table.label, "seeds": table.n_seeds, "B (prompts)": table.B_prompts,
      "responses to target": [interval(r.rtt, r.rtt_lo, r.rtt_hi, r.final)
                              for r in table.itertuples()],
      "time to target": [_ttt_text(r) for r in table.itertuples()],
      "responses vs ref": [interval(r.rtt_ratio, r.rtt_ratio_lo, r.rtt_ratio_hi, unit="×")
                           for r in table.itertuples()],
      "time vs ref": [interval(r.ttt_ratio, r.ttt_ratio_lo, r.ttt_ratio_hi, unit="×")
                      for r in table.itertuples()],
      "different from ref": ["yes" if d else "no" for d in table.ttt_different],
      "responses/s": table.throughput, "final": table.final})
  sec.tables.append(("Per configuration (stat over seeds [95% interval]; ratios to the "
                     "reference of the same kind and LR rule)", show))
  sec.verdict.append(_fastest(study, table))
  notes = sorted(set(table.reference_note))
  sec.text.append("Reference: " + "; ".join(notes) + ".")
  fig = _heatmap(table)
  if fig:
    sec.figures.append(fig)
  return sec


def _fastest(study: st.Study, table: pd.DataFrame) -> str:
  reached = table[np.isfinite(table.ttt)]
  if reached.empty:
    best = table.loc[table.final.idxmax()]
    return (f"**No configuration reached the target** {num(study.target)} of "
            f"`{study.metric}`: not reached (best final {num(best.final)}, {best.label}).")
  r = reached.loc[reached.ttt.idxmin()]
  ref = table[table.config == r.reference].iloc[0]
  return (f"**Fastest to {num(study.target)}**: {r.label}: {_ttt_text(r)}, "
          f"{interval(r.ttt_ratio, r.ttt_ratio_lo, r.ttt_ratio_hi, unit='×')} the time of the "
          f"reference {ref.label}" + (" (not different: intervals overlap)"
                                      if not r.ttt_different and r.config != ref.config else "")
          + f"; {num(len(reached))} of {len(table)} configurations reached it.")


def _heatmap(table: pd.DataFrame) -> Figure | None:
  grpo = table[table.kind == "grpo"]
  if grpo.empty:
    return None
  rule = "sqrt" if (grpo.lr_rule == "sqrt").any() else grpo.lr_rule.mode().iloc[0]
  d = grpo[grpo.lr_rule == rule].sort_values("ttt").groupby(["P", "G"], as_index=False).first()
  data = pd.DataFrame({"P": d.P.astype(int), "G": d.G.astype(int), "time_to_target_s": d.ttt,
                       "lo": d.ttt_lo, "hi": d.ttt_hi, "configuration": d.label,
                       "text": [("not\nreached" if math.isinf(v) else f"{num(v)} s")
                                for v in d.ttt]})
  return Figure("1_time_to_target_PxG",
                f"Time to target (s) of GRPO per prompts P × responses per prompt G, LR rule "
                f"{rule} (best configuration per cell).\nLower is better; equal P×G lie on "
                "anti-diagonals; empty cells were not run or never reached the target.",
                data, functools.partial(figures.heatmap, value="time_to_target_s",
                                        title=f"GRPO time to target ({rule})"))


def batch_series(table: pd.DataFrame, kind: str, rule: str) -> pd.DataFrame:
  """One configuration per B for (kind, rule): the main G, then the most seeds."""
  d = table[(table.kind == kind) & (table.lr_rule == rule)]
  g = st.main_group_size(table, kind)
  d = d.assign(_g=(d.G != g), _s=-d.n_seeds).sort_values(["B", "_g", "_s"])
  return d.groupby("B", as_index=False).first().drop(columns=["_g", "_s"])


def invariance_rows(study: st.Study, table: pd.DataFrame) -> pd.DataFrame:
  """Per (kind, rule, B): ratio to the reference, curve gap, and whether B is invariant."""
  o, out = study.opts, []
  for (kind, rule), _ in table.groupby(["kind", "lr_rule"]):
    series = batch_series(table, kind, rule)
    ref = series.reference.iloc[0]
    ref_curve = st.config_curve(study, ref)
    for r in series.itertuples():
      gap = st.curve_gap(st.config_curve(study, r.config), ref_curve, o.window)
      within = bool(np.isfinite(r.rtt_ratio) and abs(r.rtt_ratio - 1) <= o.tolerance)
      out.append(dict(kind=kind, lr_rule=rule, B=int(r.B), config=r.config, label=r.label,
                      reference=ref, is_reference=r.config == ref, rtt_ratio=r.rtt_ratio,
                      lo=r.rtt_ratio_lo, hi=r.rtt_ratio_hi, curve_gap=gap,
                      ratio_within=within, gap_within=bool(gap <= o.band) or r.config == ref,
                      invariant=(within and gap <= o.band) or r.config == ref))
  return pd.DataFrame(out)


def largest_invariant(rows: pd.DataFrame, key: str = "invariant") -> tuple[int, int]:
  """(smallest, largest) B reached from the reference through invariant batches only."""
  rows = rows.sort_values("B")
  b_ref = int(rows[rows.is_reference].B.iloc[0])
  up, down = b_ref, b_ref
  for r in rows[rows.B > b_ref].itertuples():
    if not getattr(r, key):
      break
    up = r.B
  for r in rows[rows.B < b_ref].iloc[::-1].itertuples():
    if not getattr(r, key):
      break
    down = r.B
  return int(down), int(up)


def invariance(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Where invariance breaks")
  if table.empty:
    sec.skipped = "no finished run."
    return sec
  rows = invariance_rows(study, table)
  o = study.opts
  for (kind, rule), g in rows.groupby(["kind", "lr_rule"]):
    ref = g[g.is_reference].iloc[0]
    down, up = largest_invariant(g)
    ref_row = table[table.config == ref.config].iloc[0]
    if math.isinf(ref_row.rtt):
      _, up_band = largest_invariant(g, "gap_within")
      sec.verdict.append(f"{kind}, LR rule {rule}: largest invariant B undetermined (the "
                         f"reference B={ref.B} never reached the target); by the ±{o.band:g} "
                         f"curve band alone: B = {up_band}.")
    else:
      sec.verdict.append(f"{kind}, LR rule {rule}: **largest invariant B = {up}** responses "
                         f"per optimizer step (invariant from B={down} to B={up}; reference "
                         f"B={ref.B}, tolerance {o.tolerance:g}, band {o.band:g}).")
  sec.tables.append(("Responses-to-target ratio and curve gap per batch", rows.drop(
      columns=["config", "reference"]).assign(rtt_ratio=[interval(*v) for v in zip(
          rows.rtt_ratio, rows.lo, rows.hi)]).drop(columns=["lo", "hi"])))
  sec.figures += [_curves_figure(study, table, rows), _ratio_figure(rows, o.tolerance)]
  return sec


def _curves_figure(study: st.Study, table: pd.DataFrame, rows: pd.DataFrame) -> Figure:
  parts = []
  for (kind, rule), g in rows.groupby(["kind", "lr_rule"], sort=False):
    panel = f"{kind} {rule}"
    for r in g.itertuples():
      c = st.config_curve(study, r.config)
      style = "ref" if r.is_reference else "line"
      parts.append(pd.DataFrame({"panel": panel, "series": f"B={r.B}", "x": c.responses_seen,
                                 "y": c["median"], "lo": c.lo if r.is_reference else np.nan,
                                 "hi": c.hi if r.is_reference else np.nan, "style": style}))
    parts += _unfinished_curves(study, kind, rule, panel)
  data = pd.concat(parts, ignore_index=True)
  return Figure("2_curves_vs_responses",
                f"`{study.metric}` vs responses seen, one line per B (median over seeds), per "
                "kind and LR rule; the reference is black with its seeds' range shaded.\n"
                "Lines that stay on the reference are batch-size invariant; dashed lines are "
                "unfinished runs (not used in any fit).",
                data, functools.partial(figures.lines, xlabel="responses seen",
                                        ylabel=study.metric, hline=study.target))


def _unfinished_curves(study: st.Study, kind: str, rule: str, panel: str) -> list:
  runs = study.runs
  bad = runs[(runs.problem != "") & (runs.n_eval >= 2) & (runs.kind == kind)
             & (runs.lr_rule == rule) & ~runs.problem.str.startswith("duplicate")]
  out = []
  for r in bad.itertuples():
    x, y = st.eval_curve(study.records[r.run], study.metric)
    out.append(pd.DataFrame({"panel": panel, "series": f"{r.name} ({r.problem})", "x": x,
                             "y": y, "lo": np.nan, "hi": np.nan, "style": "dashed"}))
  return out


def _ratio_figure(rows: pd.DataFrame, tolerance: float) -> Figure:
  data = pd.DataFrame({"panel": rows.kind, "series": rows.lr_rule, "x": rows.B,
                       "y": rows.rtt_ratio.replace(np.inf, np.nan), "lo": rows.lo.replace(
                           np.inf, np.nan), "hi": rows.hi.replace(np.inf, np.nan),
                       "style": "line", "reached": np.isfinite(rows.rtt_ratio),
                       "curve_gap": rows.curve_gap, "invariant": rows.invariant})
  return Figure("2_rtt_ratio_vs_batch",
                f"Responses to target relative to the reference batch vs B (log x), one line "
                f"per LR rule, 95% interval shaded; green: 1 ± {tolerance:g}.\nA batch is "
                "invariant while its line stays in the band (and its curve within the band "
                "of the reference's); gaps are batches that never reached the target.",
                data, functools.partial(figures.lines, xlabel="B (responses per optimizer step)",
                                        ylabel="responses to target / reference", logx=True,
                                        hband=(1 - tolerance, 1 + tolerance)))


def sections() -> list[Callable]:
  """Every section, most important first."""
  import report_sections_fits as fits_s
  import report_sections_rules as rules_s
  import report_sections_system as system_s
  return [decision, invariance, fits_s.critical_batch, fits_s.compute_curves,
          system_s.actor_critic, system_s.timing, rules_s.rules_and_pairs]

"""The report's first sections: the decision table, where invariance breaks, the study design.

A section gets the study (runs) and the configuration table (verdict seeds aggregated at the
target) and returns a Section (sections/types.py); drawing and writing happen elsewhere
(figures.py, report_md.py). The other sections live beside this file; report.py lists them all.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from analysis import figures
from analysis import stats
from analysis import study_table as st
from analysis.report_md import iv, num
from analysis.sections.common import ratio, reference_config, study_series
from analysis.sections.types import Figure, Section


def _ttt(r) -> str:
  return iv(r.ttt_iv, " s", r.final)


def decision(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Decision table: responses and time to target per configuration")
  if table.empty:
    sec.skipped = "no finished run to compare."
    return sec
  refs = {k: reference_config(study, table, k) for k in table.kind.unique()}
  ratios = [ratio(study, r.config, refs[r.kind], "time_to_target") if r.config != refs[r.kind]
            else stats.Interval(1.0, n=r.n_seeds) for r in table.itertuples()]
  table = table.assign(ttt_ratio_iv=ratios)
  show = pd.DataFrame({
      "configuration": table.label, "seeds": table.n_seeds,
      "B (prompts)": table.B_prompts, "effective B": table.effective_B.map(effective),
      f"{st.x_label(study)} to target": [iv(r.rtt_iv, final=r.final)
                                          for r in table.itertuples()],
      "steps to target": [iv(r.steps_iv) for r in table.itertuples()],
      "time to target": [_ttt(r) for r in table.itertuples()],
      "time vs ref": [iv(r.ttt_ratio_iv, "×") for r in table.itertuples()],
      "responses/s": table.throughput, "final": [iv(r.final_iv) for r in table.itertuples()]})
  if (table.tuning_seeds > 0).any():
    show["seeds"] = [f"{r.n_seeds} (tuning)" if r.tuning_seeds else str(r.n_seeds)
                     for r in table.itertuples()]
  if table.warmup.fillna(0).gt(0).any():
    show.insert(2, "critic warm-up", table.warmup)
  sec.tables.append(("Per configuration (median over seeds [interval] (seeds, coverage of "
                     "the interval); time ratios to the kind's reference; effective B: "
                     "informative responses per optimizer step up to the crossing, median over "
                     "seeds)", show))
  sec.verdict.append(_fastest(study, table, refs))
  sec.text.append("References: " + "; ".join(f"{k}: {table[table.config == c].label.iloc[0]}"
                                             for k, c in refs.items() if c) + ".")
  if (table.tuning_seeds > 0).any():
    sec.text.append("Rows marked (tuning) were run only by a learning-rate scan: their seeds "
                    "chose the rate, so they are shown but no verdict rests on them.")
  fig = _heatmap(table)
  if fig:
    sec.figures.append(fig)
  return sec


def effective(v) -> str:
  """An effective B for people; 'not logged' for runs without rollout/effective_batch."""
  return "not logged" if pd.isna(v) else num(v)


def _fastest(study: st.Study, table: pd.DataFrame, refs: dict) -> str:
  """The configuration with the least median time to target, against the runner-up (and the
  reference, when it is neither): 'not different' when their intervals overlap."""
  reached = table[np.isfinite(table.ttt) & (table.tuning_seeds == 0)]
  if reached.empty:
    best = table.loc[table.final.idxmax()]
    return (f"**No configuration reached the target** {num(study.target)} of "
            f"`{study.metric}` with verdict seeds (best final {num(best.final)}, {best.label}).")
  order = reached.sort_values("ttt")
  r = order.iloc[0]
  text = f"**Fastest to {num(study.target)}**: {r.label}: {_ttt(r)}"
  if len(order) > 1:
    second = order.iloc[1]
    q = ratio(study, second.config, r.config, "time_to_target")
    same = stats.overlaps(r.ttt_iv, second.ttt_iv)
    text += (f"; the next, {second.label}, takes {iv(q, '×')} its time"
             + (" (not different: their intervals overlap)" if same else ""))
  ref = refs.get(r.kind)
  if ref and ref not in (r.config, order.iloc[min(1, len(order) - 1)].config):
    q = ratio(study, r.config, ref, "time_to_target")
    text += f"; {iv(q, '×')} the time of the reference"
  return text + f". {len(reached)} of {len(table)} configurations reached it."


def _heatmap(table: pd.DataFrame) -> Figure | None:
  grpo = table[(table.kind == "grpo") & (table.tuning_seeds == 0)]
  if grpo.empty:
    return None
  d = grpo.sort_values("ttt").groupby(["P", "G"], as_index=False).first()
  both = grpo.dynamic_sampling.fillna(False).astype(bool).nunique() > 1
  data = pd.DataFrame({"P": d.P.astype(int), "G": d.G.astype(int), "time_to_target_s": d.ttt,
                       "configuration": d.label,
                       "text": [("not\nreached" if math.isinf(v) else f"{num(v)} s")
                                for v in d.ttt]})
  return Figure("1_time_to_target_PxG",
                "Time to target (s, median over seeds) of GRPO per prompts P × responses per "
                "prompt G (the fastest learning rate per cell"
                + (", with or without dynamic sampling: the CSV's configuration says which"
                   if both else "") + ").\nLower is better; equal P×G lie "
                "on anti-diagonals; empty cells were not run or never reached the target.",
                data, functools.partial(figures.heatmap, value="time_to_target_s",
                                        title="GRPO time to target"))


def invariance_rows(study: st.Study, table: pd.DataFrame, tolerance: float, band: float,
                    target: float | None = None) -> pd.DataFrame:
  """Per series and B: the responses-to-target ratio to the series' reference (interval), how
  far the curve falls below the reference's, steps to target, and the one-sided test: a batch
  is invariant when its ratio is at most 1 + tolerance and its curve is not below the
  reference's by more than `band` (a faster or higher curve is not a break)."""
  out = []
  for s in study_series(study, table):
    ref_curve = st.config_curve(study, s.reference)
    ref_e = st.seed_values(study, s.reference, target=target)
    reached = bool(ref_e.size) and np.isfinite(np.median(ref_e))
    for b in sorted(s.configs):
      c = s.configs[b]
      row = table[table.config == c].iloc[0]
      if c == s.reference:
        q = stats.Interval(1.0, n=int(row.n_seeds))
      elif reached:
        q = ratio(study, c, s.reference, target=target)
      else:  # no ratio to a reference that never got there (x / inf would read as 0)
        q = stats.Interval(math.nan, n=int(row.n_seeds))
      short = st.curve_shortfall(st.config_curve(study, c), ref_curve) if c != s.reference \
          else 0.0
      steps = st.seed_values(study, c, "steps_to_target", target)
      steps_med = float(np.median(steps)) if steps.size else math.nan
      within = bool(np.isfinite(q.point) and q.point <= 1 + tolerance)
      out.append(dict(kind=s.kind, series=s.name, B=int(b), B_eff=float(row.effective_B),
                      config=c, label=row.label,
                      seeds=int(row.n_seeds), is_reference=c == s.reference, ratio=q,
                      reference_reached=reached,
                      ratio_within=within, shortfall=short,
                      curve_within=bool(not short > band), steps=steps_med,
                      invariant=(within and not short > band) or c == s.reference))
  return pd.DataFrame(out)


def largest_invariant(rows: pd.DataFrame, by: str = "B") -> tuple:
  """(smallest, largest) batch reached from the reference through invariant batches only, the
  batches ordered by the column `by`: the nominal B, or B_eff (effective B)."""
  rows = rows.sort_values([by, "B"])
  ref = int(np.flatnonzero(rows.is_reference.to_numpy())[0])
  values, ok = rows[by].tolist(), rows.invariant.tolist()
  up = down = ref
  while up + 1 < len(rows) and ok[up + 1]:
    up += 1
  while down > 0 and ok[down - 1]:
    down -= 1
  cast = int if by == "B" else float
  return cast(values[down]), cast(values[up])


def _sure(r, tolerance: float) -> str:
  """Whether the ratio's interval settles the test: 'yes' when it lies wholly on one side of
  1 + tolerance, 'no' when it straddles it (more seeds would be needed to say)."""
  q = r.ratio
  if r.is_reference or not q.has_bounds:
    return "—"
  return "yes" if (q.hi <= 1 + tolerance or q.lo > 1 + tolerance) else "no"


def invariance(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Where invariance breaks")
  if table.empty or not study_series(study, table):
    sec.skipped = "no batch series (configurations of one kind at two or more batches)."
    return sec
  o = study.opts
  rows = invariance_rows(study, table, o.tolerance, o.band)
  for s in study_series(study, table):
    sec.text.append(f"Series {s.kind} {s.name}: B = {', '.join(map(str, sorted(s.configs)))}, "
                    f"reference B = {s.b0}" + (f" ({s.note})" if s.note else "") + ".")
  for (kind, name), g in rows.groupby(["kind", "series"], sort=False):
    ref = g[g.is_reference].iloc[0]
    down, up = largest_invariant(g)
    ref_rtt = table[table.config == ref.config].rtt.iloc[0]
    short = g[g.steps < o.min_steps]
    note = (f"; B = {', '.join(map(str, short.B))} reached it in fewer than {o.min_steps} "
            "optimizer steps (a transient more than gradient noise)" if len(short) else "")
    if math.isinf(ref_rtt):
      sec.verdict.append(f"{kind}, {name}: largest invariant B undetermined (the reference "
                         f"B={ref.B} never reached the target).")
      continue
    last = g[g.B > up].head(1)
    broke = ""
    if len(last):
      b = last.iloc[0]
      why = [] if b.ratio_within else [f"it needs {iv(b.ratio, '×')} the reference's responses"]
      if not b.curve_within:
        why.append(f"its curve falls {num(b.shortfall)} below the reference's")
      broke = f"; at B={b.B} {' and '.join(why)}"
    inside = g[(g.B >= down) & (g.B <= up) & ~g.is_reference]
    unsettled = [r.B for r in inside.itertuples() if _sure(r, o.tolerance) == "no"]
    if len(last) and _sure(last.iloc[0], o.tolerance) == "no" and last.iloc[0].curve_within:
      unsettled.append(int(last.iloc[0].B))
    hedge = (f"; not settled at B = {', '.join(map(str, unsettled))}: the ratio's interval "
             f"reaches across 1 + {o.tolerance:g}, more seeds would decide it"
             if unsettled else "")
    sec.verdict.append(f"{kind}, {name}: **largest invariant B = {up}** responses per optimizer "
                       f"step (invariant from B={down} to B={up}; reference B={ref.B}, "
                       f"tolerance {o.tolerance:g}, band {o.band:g}){broke}{hedge}{note}.")
    eff = _effective_verdict(g)
    (sec.verdict if eff.startswith("against") else sec.text).append(f"{kind}, {name}, {eff}")
  sec.text.insert(0, f"Every count of responses here is of {st.x_label(study)} (--x {o.x}).")
  sec.facts["rows"] = rows
  sec.tables.append(("Responses-to-target ratio and curve shortfall per batch (ratio: median "
                     "over seeds [interval] (seeds, coverage); settled: the interval lies on "
                     "one side of 1 + tolerance; effective B: informative responses per "
                     "optimizer step up to the crossing, median over seeds)",
                     _show_rows(rows, o.tolerance)))
  sens = sensitivity(study, table)
  if not sens.empty:
    sec.facts["sensitivity"] = sens
    sec.tables.append(("Sensitivity: the largest invariant B of each series per tolerance, "
                       "band and target", sens))
  sec.figures += [_curves_figure(study, rows), _ratio_figure(rows, o.tolerance, o.x)]
  return sec


def _effective_verdict(g: pd.DataFrame) -> str:
  """The series' verdict with its batches ordered by effective B instead of nominal B: the
  same ratios and tests (invariance_rows), only the order and the labels change."""
  if g.B_eff.isna().any():
    return ("effective B not logged (runs without rollout/effective_batch): the verdict "
            "holds against nominal B only.")
  down, up = largest_invariant(g, by="B_eff")
  ref = g[g.is_reference].iloc[0]
  order = [int(b) for b in g.sort_values(["B_eff", "B"]).B]
  moved = order != sorted(order)
  return (f"against effective B: **largest invariant effective B = {num(up)}** informative "
          f"responses per optimizer step (invariant from {num(down)} to {num(up)}; reference "
          f"B={ref.B} at effective B {num(ref.B_eff)})"
          + (f"; ordered by effective B the batches run B = {', '.join(map(str, order))}, not "
             "in nominal order" if moved else "; the same order as nominal B") + ".")


def _show_rows(rows: pd.DataFrame, tolerance: float) -> pd.DataFrame:
  return pd.DataFrame({
      "kind": rows.kind, "series": rows.series, "B": rows.B,
      "effective B": rows.B_eff.map(effective), "configuration": rows.label,
      "ratio": [iv(q, "×") for q in rows.ratio],
      "shortfall": rows.shortfall, "steps": rows.steps,
      "settled": [_sure(r, tolerance) for r in rows.itertuples()],
      "invariant": ["reference" if r.is_reference else ("yes" if r.invariant else "no")
                    for r in rows.itertuples()]})


def sensitivity(study: st.Study, table: pd.DataFrame, tolerances=(0.1, 0.2, 0.3),
                bands=(0.03, 0.05, 0.08), delta: float = 0.05) -> pd.DataFrame:
  """The largest invariant B per series for each tolerance, band and target (the study's and
  `delta` either side): how much the verdict depends on the thresholds."""
  targets = [round(study.target + d, 4) for d in (-delta, 0.0, delta)]
  out = []
  for t in targets:
    for tol in tolerances:
      rows = invariance_rows(study, table, tol, max(bands), target=t)
      for band in bands:
        r = rows.assign(invariant=[(x.ratio_within and not x.shortfall > band)
                                   or x.is_reference for x in rows.itertuples()])
        for (kind, name), g in r.groupby(["kind", "series"], sort=False):
          reached = bool(g.reference_reached.iloc[0])
          out.append({"kind": kind, "series": name, "target": t, "tolerance": tol,
                      "band": band, "largest invariant B":
                      largest_invariant(g)[1] if reached else "undetermined"})
  if not out:
    return pd.DataFrame()
  d = pd.DataFrame(out)
  return d.pivot_table(index=["kind", "series", "target", "tolerance"], columns="band",
                       values="largest invariant B", aggfunc="first").reset_index().rename(
                           columns={b: f"band {b:g}" for b in bands})


def _curves_figure(study: st.Study, rows: pd.DataFrame) -> Figure:
  parts = []
  for (kind, name), g in rows.groupby(["kind", "series"], sort=False):
    panel = f"{kind} {name}"
    for r in g.itertuples():
      c = st.config_curve(study, r.config)
      parts.append(pd.DataFrame({"panel": panel, "series": f"B={r.B}", "x": c.responses,
                                 "y": c["median"], "lo": c.lo if r.is_reference else np.nan,
                                 "hi": c.hi if r.is_reference else np.nan,
                                 "style": "ref" if r.is_reference else "line",
                                 "sample_axis": study.opts.x}))
  return Figure("2_curves_vs_responses",
                f"`{study.metric}` vs {st.x_label(study)} (median over seeds), one line per B, per "
                "kind and series; the reference is black with its seeds' range shaded.\n"
                "A line below the reference's band breaks invariance; a line above it does "
                "not (one-sided).", pd.concat(parts, ignore_index=True),
                functools.partial(figures.lines, xlabel=st.x_label(study), ylabel=study.metric,
                                  hline=study.target))


def _ratio_figure(rows: pd.DataFrame, tolerance: float, x: str) -> Figure:
  data = pd.DataFrame({"panel": rows.kind, "series": rows.series, "x": rows.B,
                       "y": [q.point for q in rows.ratio], "lo": [q.lo for q in rows.ratio],
                       "hi": [q.hi for q in rows.ratio], "style": "line",
                       "seeds": rows.seeds, "invariant": rows.invariant,
                       "effective_B": rows.B_eff, "sample_axis": x})
  for col in ("y", "lo", "hi"):
    data[col] = data[col].replace(np.inf, np.nan)
  return Figure("2_rtt_ratio_vs_batch",
                f"Responses ({x}) to target relative to the series' reference vs B (log x), "
                "one line "
                f"per series, interval shaded; green: ratio ≤ 1 + {tolerance:g}.\nA batch is "
                "invariant while its line stays at or below the band's top (and its curve not "
                "below the reference's); gaps never reached the target.",
                data, functools.partial(figures.lines, xlabel="B (responses per optimizer step)",
                                        ylabel="responses to target / reference", logx=True,
                                        hband=(0, 1 + tolerance)))


def design(study: st.Study, table: pd.DataFrame, done: dict | None = None) -> Section:
  """Whether the study measures what it claims to (what a study needs to answer its questions), each a
  line that says pass or fail with its number: the target well below the plateau, the largest
  batch of each series at least `min_steps` optimizer steps from it, references that do not
  collapse, enough verdict seeds, learning rates inside their scans."""
  sec = Section("Does the study measure gradient noise?", lead=True)
  o, rows = study.opts, []
  t = study.record.get("target") or {}
  if t.get("plateau") is not None:
    gap = t["plateau"] - study.target
    rows.append(("target below the plateau", gap >= 2 * o.band,
                 f"target {num(study.target)}, base {num(t['base'])}, plateau (best median "
                 f"final of stage {t['stage']}) {num(t['plateau'])}: {num(gap)} below it "
                 f"(needed: 2 × band = {num(2 * o.band)})"))
  inv = (done or {}).get("invariance")
  inv_rows = inv.facts.get("rows") if inv else None
  if inv_rows is not None:
    checked = set()
    for (kind, name), g in inv_rows.groupby(["kind", "series"], sort=False):
      top = g.sort_values("B").iloc[-1]
      rows.append((f"{kind} {name}: the largest batch is not a transient",
                   bool(top.steps >= o.min_steps),
                   f"B = {top.B} reaches the target in {num(top.steps)} optimizer steps (median "
                   f"over seeds; needed ≥ {o.min_steps})"))
      ref = g[g.is_reference].iloc[0]
      fewest = int(g.seeds.min())
      need = 5 if kind == "grpo" else 3
      rows.append((f"{kind} {name}: seeds", fewest >= need,
                   f"at least {fewest} verdict seeds per batch (needed: {need})"))
      if ref.config in checked:
        continue
      checked.add(ref.config)
      drops = study.verdict_runs()
      drops = drops[drops.config == ref.config].drop_after_target
      worst = float(np.nanmax(drops)) if drops.notna().any() else math.nan
      rows.append((f"{kind}: the reference B={ref.B} does not collapse",
                   bool(not worst > o.band),
                   f"its seeds fall at most {num(worst)} below the target after reaching it "
                   f"(allowed: the band, {num(o.band)})"))
  lr = (done or {}).get("learning_rate")
  for title, df in (lr.tables if lr else []):
    if "best lr per B" in title:
      kind = title.split(":")[0]
      edges = df[df.at_edge & (df.tried > 1)]
      rows.append((f"{kind}: every best lr inside its scan", edges.empty,
                   "the chosen rate is never the smallest or largest tried" if edges.empty else
                   f"at the edge at B = {', '.join(map(str, edges.B))}"))
  if not rows:
    sec.skipped = "nothing to check (no study record, no batch series)."
    return sec
  sec.facts["checks"] = rows
  sec.text.append("What a batch-size study must hold to measure gradient noise rather than its "
                  "own transients; a failed line qualifies every "
                  "verdict above that rests on it.")
  for name, ok, why in rows:
    sec.verdict.append(f"{'**pass**' if ok else '**FAIL**'} {name}: {why}.")
  return sec

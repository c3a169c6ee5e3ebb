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

from analysis import bracket as br
from analysis import curve_test as ct
from analysis import figures
from analysis import joint_fit
from analysis import series as se
from analysis import stats
from analysis import study_table as st
from analysis.report_md import iv, num
from analysis.sections.common import ratio, reference_config, study_series
from analysis.sections.types import Figure, Section
from rlscale.study import power


MIN_VERDICT_SEEDS = 10  # per batch: what a ratio of 1.5 needs to settle at the study's spread


def _ttt(r) -> str:
  return iv(r.ttt_iv, " s", r.final)


def _ttt_incl(r) -> str:
  return iv(r.ttt_incl_iv, " s", r.final)


def decision(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Decision table: responses and time to target per configuration")
  if table.empty:
    sec.skipped = "no finished run to compare."
    return sec
  refs = {k: reference_config(study, table, k) for k in table.kind.unique()}
  ratios = [ratio(study, r.config, refs[r.kind], "time_to_target_incl_warmup")
            if r.config != refs[r.kind] else stats.Interval(1.0, n=r.n_seeds)
            for r in table.itertuples()]
  table = table.assign(ttt_ratio_iv=ratios)
  warm = table.warmup.fillna(0).gt(0).any()
  x = st.x_label(study)
  show = pd.DataFrame({
      "configuration": table.label, "seeds": table.n_seeds,
      "B (prompts)": table.B_prompts, "effective B": table.effective_B.map(effective),
      f"{x} to target": [iv(r.rtt_incl_iv, final=r.final) for r in table.itertuples()],
      "steps to target": [iv(r.steps_iv) for r in table.itertuples()],
      "time to target": [_ttt_incl(r) for r in table.itertuples()],
      "time vs ref": [iv(r.ttt_ratio_iv, "×") for r in table.itertuples()],
      "responses/s": table.throughput, "final": [iv(r.final_iv) for r in table.itertuples()]})
  if (table.tuning_seeds > 0).any():
    show["seeds"] = [f"{r.n_seeds} (tuning)" if r.tuning_seeds else str(r.n_seeds)
                     for r in table.itertuples()]
  if warm:
    show.insert(2, "critic warm-up", table.warmup)
    show.insert(5, f"{x} to target after the warm-up",
                [iv(r.rtt_iv, final=r.final) for r in table.itertuples()])
  sec.tables.append(("Per configuration (median over seeds [interval] (seeds, coverage of "
                     "the interval); responses and time to target count a PPO critic's "
                     "warm-up, in which the actor does not train" + (
                         " (the column after the warm-up leaves it out)" if warm else "")
                     + "; time ratios to the kind's reference; effective B: informative "
                     "responses per optimizer step up to the crossing, median over seeds)",
                     show))
  sec.verdict.append(_fastest(study, table, refs))
  sec.text.append("References: " + "; ".join(f"{k}: {table[table.config == c].label.iloc[0]}"
                                             for k, c in refs.items() if c) + ".")
  if (table.tuning_seeds > 0).any():
    sec.text.append("Rows marked (tuning) were run only by a learning-rate scan: their seeds "
                    "chose the rate, so they are shown but no verdict rests on them.")
  lanes = sorted(set(study.verdict_runs().get("lanes", pd.Series([1])).dropna().astype(int)))
  if lanes != [1]:
    sec.text.append(f"Runs side by side: the verdict's runs shared a process with others ("
                    f"{', '.join(map(str, lanes))} lanes per process), each lane's step timed as "
                    "its group's: a time here is a lane's, comparable between configurations "
                    "run with as many lanes, not a run alone's.")
  fig = _heatmap(table)
  if fig:
    sec.figures.append(fig)
  return sec


def effective(v) -> str:
  """An effective B for people; 'not logged' for runs without rollout/effective_batch."""
  return "not logged" if pd.isna(v) else num(v)


def _fastest(study: st.Study, table: pd.DataFrame, refs: dict) -> str:
  """The configuration with the least median time to target (a PPO critic's warm-up counted),
  against the runner-up (and the reference, when it is neither): 'not different' when their
  intervals overlap."""
  reached = table[np.isfinite(table.ttt_incl) & (table.tuning_seeds == 0)]
  if reached.empty:
    best = table.loc[table.final.idxmax()]
    return (f"**No configuration reached the target** {num(study.target)} of "
            f"`{study.metric}` with verdict seeds (best final {num(best.final)}, {best.label}).")
  order = reached.sort_values("ttt_incl")
  r = order.iloc[0]
  col = "time_to_target_incl_warmup"
  text = f"**Fastest to {num(study.target)}**: {r.label}: {_ttt_incl(r)}"
  if len(order) > 1:
    second = order.iloc[1]
    q = ratio(study, second.config, r.config, col)
    same = stats.overlaps(r.ttt_incl_iv, second.ttt_incl_iv)
    text += (f"; the next, {second.label}, takes {iv(q, '×')} its time"
             + (" (not different: their intervals overlap)" if same else ""))
  ref = refs.get(r.kind)
  if ref and ref not in (r.config, order.iloc[min(1, len(order) - 1)].config):
    q = ratio(study, r.config, ref, col)
    text += f"; {iv(q, '×')} the time of the reference"
  warm = " (a PPO critic's warm-up counted)" if table.warmup.fillna(0).gt(0).any() else ""
  return text + f"{warm}. {len(reached)} of {len(table)} configurations reached it."


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
                    target: float | None = None, curves: bool = True,
                    series: list[se.Series] | None = None) -> pd.DataFrame:
  """Per series and B: the responses-to-target ratio to the series' reference (95% interval,
  and one-sided 95% bounds), the curve test against the reference's seeds
  (analysis/curve_test.py, at the bracket's level), steps to target, and whether the batch is
  settled invariant or settled broken (analysis/bracket.py); `invariant` is the point
  estimate's test (ratio at most 1 + tolerance and no curve break), kept for the
  sensitivity table. `curves=False` skips the curve test (a sensitivity sweep). `series`: the
  series to read (default: the study's, study_series; sections/staleness.py passes one per
  rollout.max_staleness)."""
  out = []
  for s in study_series(study, table) if series is None else series:
    ref_seeds = ct.seed_curves(study, s.reference) if curves else []
    ref_e = st.seed_values(study, s.reference, target=target)
    reached = bool(ref_e.size) and np.isfinite(np.median(ref_e))
    for b in sorted(s.configs):
      c = s.configs[b]
      row = table[table.config == c].iloc[0]
      is_ref = c == s.reference
      # The joint rate fit's reading at the optimum holds at the study's own target only.
      shift = s.shift.get(int(b)) if target is None and not is_ref else None
      if is_ref:
        q = one = stats.Interval(1.0, n=int(row.n_seeds))
      elif reached:
        q = ratio(study, c, s.reference, target=target, log_shift=shift)
        one = ratio(study, c, s.reference, target=target, level=0.9, log_shift=shift)
      else:  # no ratio to a reference that never got there (x / inf would read as 0)
        q = one = stats.Interval(math.nan, n=int(row.n_seeds))
      test = (ct.curve_test(ct.seed_curves(study, c), ref_seeds, band, br.CURVE_LEVEL,
                            seed=study.opts.seed) if curves and not is_ref else None)
      short = test.shortfall if test is not None else 0.0
      rejects = bool(test is not None and test.rejected)
      steps = st.seed_values(study, c, "steps_to_target", target)
      steps_med = float(np.median(steps)) if steps.size else math.nan
      within = bool(np.isfinite(q.point) and q.point <= 1 + tolerance)
      batch = br.Batch(int(b), one.lo if one.has_bounds else math.nan,
                       one.hi if one.has_bounds else math.nan, rejects, is_ref)
      out.append(dict(kind=s.kind, series=s.name, B=int(b), B_eff=float(row.effective_B),
                      config=c, label=row.label,
                      seeds=int(row.n_seeds), is_reference=is_ref, ratio=q, one_sided=one,
                      reference_reached=reached,
                      ratio_within=within, shortfall=short,
                      curve_p=test.p_value if test is not None else math.nan,
                      curve_within=not rejects,
                      settled_invariant=br.settled_invariant(batch, tolerance),
                      settled_broken=br.settled_broken(batch, tolerance),
                      steps=steps_med, log_shift=shift,
                      invariant=(within and not rejects) or is_ref))
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
  """'invariant' or 'broken' when the batch is settled so (analysis/bracket.py), 'no' when
  neither (more seeds would be needed to say), '—' for the reference."""
  if r.is_reference:
    return "—"
  return "invariant" if r.settled_invariant else "broken" if r.settled_broken else "no"


def _batches(g: pd.DataFrame) -> list[br.Batch]:
  return [br.Batch(int(r.B), r.one_sided.lo if r.one_sided.has_bounds else math.nan,
                   r.one_sided.hi if r.one_sided.has_bounds else math.nan,
                   not r.curve_within, bool(r.is_reference)) for r in g.itertuples()]


def series_bracket(study: st.Study, g: pd.DataFrame, reps: int = 1000) -> dict:
  """A series' bracket (X, Y), how often each answer comes back under seed resampling, and the
  power calculation at its seeds and measured spread."""
  o = study.opts
  x, y = br.bracket(_batches(g), o.tolerance)
  values = {int(r.B): st.seed_values(study, r.config) for r in g.itertuples()}
  ref = int(g[g.is_reference].B.iloc[0])
  shifts = {int(r.B): r.log_shift for r in g.itertuples()
            if getattr(r, "log_shift", None) is not None}
  freq = br.resampled({b: v for b, v in values.items() if v.size}, ref, o.tolerance,
                      {int(r.B): not r.curve_within for r in g.itertuples()}, reps=reps,
                      seed=o.seed, shifts=shifts)
  sigma, dof = power.pooled_spread(values.values())
  n = int(g[~g.is_reference].seeds.min()) if (~g.is_reference).any() else int(g.seeds.min())
  m = int(g[g.is_reference].seeds.iloc[0])
  lines = br.power_lines(sigma, n, m, o.tolerance) if dof and sigma > 0 else None
  broken = [int(r.B) for r in g.itertuples() if r.settled_broken]
  # At the fitted optimum (the point correction; its spread is far below the seeds').
  at_opt = {b: v * math.exp(-shifts[b][0]) if b in shifts else v for b, v in values.items()}
  joint = joint_fit.invariance({b: v for b, v in at_opt.items() if v.size}, ref, o.tolerance,
                               reps=reps, seed=o.seed)
  return dict(x=x, y=y, freq=freq, reps=reps, sigma=sigma, dof=dof, n=n, m=m, power=lines,
              text=br.describe(x, y, list(values), broken), joint=joint)


def _over_both_rates(rows: pd.DataFrame, tolerance: float) -> str | None:
  """The bracket over a kind's chosen and runner-up series together: the verdict does not rest
  on which of two close rates was chosen. None without both series."""
  chosen = rows[[se.is_chosen(n) and se.is_plain(n) for n in rows.series]]
  second = rows[rows.series == se.RUNNER_UP]
  if chosen.empty or second.empty:
    return None
  a, b = chosen.set_index("B"), second.set_index("B")
  flags = []
  for bb in sorted(set(a.index) & set(b.index)):
    ra, rb = a.loc[bb], b.loc[bb]
    ref = bool(ra.is_reference and rb.is_reference)
    flags.append((int(bb), ref or bool(ra.settled_invariant or rb.settled_invariant),
                  not ref and bool(ra.settled_broken and rb.settled_broken), ref))
  if not any(f[3] for f in flags):
    return None
  x, y = br.walk(flags)
  return br.describe(x, y, [f[0] for f in flags], [f[0] for f in flags if f[2]])


def _bracket_text(kind: str, name: str, b: dict, tolerance: float) -> str:
  freq = ", ".join(f"({x}, {'none' if y is None else y}) {100 * c / b['reps']:.0f}%"
                   for (x, y), c in b["freq"].most_common(4))
  text = (f"{kind}, {name}: **{b['text']}** (each batch settled by the one-sided 95% bounds of "
          f"its ratio against 1 + {tolerance:g} and the curve test at "
          f"{100 * br.CURVE_LEVEL:g}%; {b['n']} seeds a batch, {b['m']} at the reference). "
          f"Under seed resampling ({b['reps']} draws), (invariant up to, broken from): {freq}.")
  p = b["power"]
  if p is None:
    text += " No seed spread measured: no power calculation."
  else:
    text += (f" Power: the seed-to-seed spread of log responses to target is "
             f"{b['sigma']:.2f} ({b['dof']} degrees of freedom); at these seeds a true "
             f"ratio of 1.5 settles as broken with probability {p['p_broken_1.5']:.2f}, "
             f"a true 1.0 as invariant with {p['p_invariant_1.0']:.2f}; 80% would take "
             f"{p['seeds_broken_1.5']} and {p['seeds_invariant_1.0']} seeds a side.")
  j = b.get("joint")
  if j is not None:
    seeds = "/".join(map(str, j["seeds"]))
    text += (" Joint fit of E(B) = E_min (1 + B/B_crit) over every batch's seeds "
             f"(seeds per batch {seeds}; analysis/joint_fit.py): "
             + joint_fit.describe(j) + ".")
  return text


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
  brackets = {}
  for (kind, name), g in rows.groupby(["kind", "series"], sort=False):
    ref = g[g.is_reference].iloc[0]
    ref_rtt = table[table.config == ref.config].rtt.iloc[0]
    short = g[g.steps < o.min_steps]
    note = (f" B = {', '.join(map(str, short.B))} reached it in fewer than {o.min_steps} "
            "optimizer steps (a transient more than gradient noise)." if len(short) else "")
    if math.isinf(ref_rtt):
      sec.verdict.append(f"{kind}, {name}: no bracket (the reference B={ref.B} never reached "
                         "the target in the median).")
      continue
    b = brackets[(kind, name)] = series_bracket(study, g)
    sec.verdict.append(_bracket_text(kind, name, b, o.tolerance) + note)
    eff = _effective_verdict(g)
    sec.text.append(f"{kind}, {name}, {eff}")
  sec.text.insert(0, f"Every count of responses here is of {st.x_label(study)} (--x {o.x}).")
  sec.text.insert(1, "A batch is *settled invariant* when the one-sided 95% upper bound of its "
                  f"responses-to-target ratio lies at or below 1 + {o.tolerance:g} and the curve "
                  "test does not find its curve below the reference's; *settled broken* when "
                  "the lower bound lies above it or the curve test rejects; otherwise not "
                  "settled. Invariant up to X: every batch from the reference to X is settled "
                  "invariant; broken from Y: Y and every larger batch are settled broken. The "
                  "bracket's false-break rate on truly invariant batches is at most "
                  f"{100 * br.false_break_rate([8, 16, 32, 64, 128, 256], 16, 10, 0.28):.1f}% "
                  "(simulated at 10 seeds, spread 0.28, B = 8 ... 256: analysis/bracket.py). "
                  "The joint fit reads every batch's seeds at once under E = E_min (1 + "
                  "B/B_crit): E(B)/E(B0) <= 1 + tolerance up to B_tol = tolerance x B_crit + "
                  "(1 + tolerance) x B0, bounded one-sided (95%) by B_crit's seed bootstrap; "
                  "invariant up to the largest batch below B_tol's lower bound, broken from the "
                  "smallest above its upper bound whose own seeds are slower than the "
                  "reference's; no answer where the law's diagnostics fail. Simulated at this "
                  "study's shape, neither a false invariant nor a false break exceeds 5%, also "
                  "for E flat up to a hinge (tests/unit/analysis/test_joint_fit.py).")
  for kind in rows.kind.unique():
    both = _over_both_rates(rows[rows.kind == kind], o.tolerance)
    if both:
      sec.verdict.append(f"{kind}, over the chosen rate and its runner-up (invariant where "
                         f"either rate is settled invariant, broken where both are settled "
                         f"broken): **{both}**.")
  sec.facts["rows"], sec.facts["brackets"] = rows, brackets
  sec.tables.append(("Responses-to-target ratio and curve test per batch (ratio: median over "
                     "seeds [95% interval] (seeds, coverage); one-sided: the 95% bounds the "
                     "verdict reads; curve p: the permutation test's p-value, and the largest "
                     "gap below the reference's median curve; settled: invariant / broken / no)",
                     _show_rows(rows, o.tolerance)))
  sens = sensitivity(study, table)
  if not sens.empty:
    sec.facts["sensitivity"] = sens
    sec.tables.append(("Sensitivity: where the point estimates alone would put the largest "
                       "invariant B, per tolerance, band and target (no intervals: how much the "
                       "thresholds move it, not a verdict)", sens))
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
      "one-sided": [f"[{num(q.lo)}, {num(q.hi)}]" if q.has_bounds else "—"
                    for q in rows.one_sided],
      "curve p": rows.curve_p, "shortfall": rows.shortfall, "steps": rows.steps,
      "settled": [_sure(r, tolerance) for r in rows.itertuples()],
      "point estimate within": ["reference" if r.is_reference else (
          "yes" if r.invariant else "no") for r in rows.itertuples()]})


def sensitivity(study: st.Study, table: pd.DataFrame, tolerances=(0.1, 0.2, 0.3),
                delta: float = 0.05) -> pd.DataFrame:
  """Where the point estimates alone put the largest invariant B, per series, for each
  tolerance and target (the study's and `delta` either side): how much the thresholds move
  it. Ratios only (the curve test is the verdict's, at the study's target)."""
  targets = [round(study.target + d, 4) for d in (-delta, 0.0, delta)]
  out = []
  for t in targets:
    for tol in tolerances:
      rows = invariance_rows(study, table, tol, study.opts.band, target=t, curves=False)
      for (kind, name), g in rows.groupby(["kind", "series"], sort=False):
        reached = bool(g.reference_reached.iloc[0])
        out.append({"kind": kind, "series": name, "target": t, "tolerance": tol,
                    "largest invariant B": largest_invariant(g)[1] if reached
                    else "undetermined"})
  if not out:
    return pd.DataFrame()
  d = pd.DataFrame(out)
  return d.pivot_table(index=["kind", "series", "target"], columns="tolerance",
                       values="largest invariant B", aggfunc="first").reset_index().rename(
                           columns={t: f"tolerance {t:g}" for t in tolerances})


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
  """Whether the study measures what it claims to, each a line that says pass or fail with its
  number; every check can fail (tests/unit/analysis/test_design_checks.py):
  - the target is set before the scan, from the reference batch at the starting rate, well
    above the base (2 x band) and below what the reference's verdict seeds reach (a band);
  - every verdict seed of a series reaches the target (no censored run behind an interval);
  - the reference's seeds all reach it and none falls more than the band below after;
  - the largest batch of each series reaches it in at least `min_steps` optimizer steps (a
    batch that never reaches it fails: no steps to count);
  - enough verdict seeds per batch (10);
  - every chosen rate inside its scan (the learning-rate section's "lr per B" tables);
  - gradient clipping the same at every batch compared (study_table.clip_fraction_check)."""
  sec = Section("Does the study measure gradient noise?", lead=True)
  o, rows = study.opts, []
  t = study.record.get("target") or {}
  runs = study.verdict_runs()
  if t.get("base") is not None:
    rows.append(("target set before the rates were scanned", t.get("stage") == "target"
                 or bool(t.get("before_scan")),
                 f"from stage {t.get('stage')!r} ("
                 + ("the reference batch at the starting rate" if t.get("stage") == "target"
                    else "a stage that chose among its own runs") + ")"))
    gain = study.target - t["base"]
    rows.append(("target well above the base", gain >= 2 * o.band,
                 f"target {num(study.target)}, base {num(t['base'])}: {num(gain)} above it "
                 f"(needed: 2 × band = {num(2 * o.band)})"))
  inv = (done or {}).get("invariance")
  inv_rows = inv.facts.get("rows") if inv else None
  if inv_rows is not None:
    checked = set()
    for (kind, name), g in inv_rows.groupby(["kind", "series"], sort=False):
      top = g.sort_values("B").iloc[-1]
      rows.append((f"{kind} {name}: the largest batch is not a transient",
                   bool(np.isfinite(top.steps) and top.steps >= o.min_steps),
                   f"B = {top.B} reaches the target in {num(top.steps)} optimizer steps (median "
                   f"over seeds; needed ≥ {o.min_steps})" if np.isfinite(top.steps) else
                   f"B = {top.B} does not reach the target in the median: no steps to count"))
      in_series = runs[runs.config.isin(g.config)]
      lost = in_series[~np.isfinite(in_series.responses_to_target.astype(float))]
      rows.append((f"{kind} {name}: every verdict seed reaches the target", lost.empty,
                   f"{len(in_series) - len(lost)} of {len(in_series)} runs reached it"
                   + (f"; not: {', '.join(sorted(set(lost.label)))}" if len(lost) else "")))
      fewest = int(g.seeds.min())
      rows.append((f"{kind} {name}: seeds", fewest >= MIN_VERDICT_SEEDS,
                   f"at least {fewest} verdict seeds per batch (needed: {MIN_VERDICT_SEEDS})"))
      clip = getattr(st, "clip_fraction_check", None)
      if clip is not None:
        ok, why = clip(table[table.config.isin(g.config)])
        rows.append((f"{kind} {name}: gradient clipping the same at every batch", ok, why))
      ref = g[g.is_reference].iloc[0]
      if ref.config in checked:
        continue
      checked.add(ref.config)
      mine = runs[runs.config == ref.config]
      drops = mine.drop_after_target
      worst = float(np.nanmax(drops)) if drops.notna().any() else math.nan
      missed = int((~np.isfinite(mine.responses_to_target.astype(float))).sum())
      rows.append((f"{kind} {name}: the reference B={ref.B} reaches the target and does not "
                   "collapse",
                   bool(missed == 0 and not worst > o.band),
                   f"{len(mine) - missed} of {len(mine)} seeds reach it; they fall at most "
                   f"{num(worst)} below it after (allowed: the band, {num(o.band)})"))
      # Seeds stopped at the target (target.stop) end just past it: what the reference
      # reaches is then the target stage's (the reference batch at the starting rate, run to
      # its budget).
      stopped = bool(mine.stopped.fillna(False).astype(bool).any()) if "stopped" in mine else False
      finals = mine.final.astype(float).dropna()
      title = f"{kind} {name}: the target below what the reference reaches"
      if stopped and t.get("base") is not None and t.get("plateau") is None:
        rows.append((title, False, "its seeds stopped at the target and the study recorded no "
                     "plateau (a target stage run to its budget): not checkable"))
      elif len(finals) and t.get("base") is not None and not stopped:
        head = float(np.median(finals)) - study.target
        rows.append((title, head >= o.band,
                     f"the reference's median final {num(float(np.median(finals)))} is "
                     f"{num(head)} above the target (needed: the band, {num(o.band)})"))
      elif stopped and t.get("base") is not None:
        head = float(t["plateau"]) - study.target
        rows.append((title, head >= o.band,
                     f"its seeds stopped at the target; the target stage's median final "
                     f"{num(float(t['plateau']))} (the reference batch at the starting rate, "
                     f"to its budget) is {num(head)} above it (needed: the band, "
                     f"{num(o.band)})"))
  lr = (done or {}).get("learning_rate")
  for title, df in (lr.tables if lr else []):
    if "lr per B" in title and {"at_edge", "tried"} <= set(df.columns):
      kind = title.split(":")[0]
      edges = df[df.at_edge & (df.tried > 1)]
      rows.append((f"{kind}: every chosen lr inside its scan", edges.empty,
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

"""Staleness: what training on stale responses costs, per batch (rollout.max_staleness = k).

A run with rollout.max_staleness = k trains step t on responses sampled with the weights after
update max(0, t-1-k) (k = 0: synchronous); a run directory written with rollout.overlap reads as
k = 1 when it was on, else 0 (rlscale/config/migrate.py, applied by analysis/runs.read).
The section is written only when the configurations compared differ in k: `staleness` returns
None otherwise, and the report has no such section.

The configurations are grouped by kind, dynamic sampling and rl.off_policy_correction (at the
kind's main G). Within a group each k has its batch series (analysis/series.py on that k's
configurations, its first: the chosen lr where there is one; where it builds none, the one
configuration run at each B, AS_RUN). Each number is read the way the report reads it elsewhere:
- per B and k: responses to target, the median over seeds with its interval (a run that never
  reached the target is right-censored, never dropped: stats.median_interval), and its ratio to
  k = 0 at the same B (sections/common.ratio: Kaplan-Meier medians, a percentile bootstrap, its
  coverage simulated at these seed counts). k = 0 is the group's own, else that of correction
  "none". The ratio is *within* the report's tolerance when its one-sided 95% upper bound is at
  most 1 + tolerance, *beyond* it when its lower bound is above, else *not settled*
  (analysis/bracket.py's rule for one batch, without the curve test);
- per k: where invariance in B breaks, the bracket of sections/decision.py (analysis/bracket.py,
  the curve test included) on that k's series, when it has a batch above its reference and a
  reference that reached the target ("not testable here" and why otherwise); and B_crit of
  E(B) = E_min (1 + B/B_crit) (fits.critical_batch), "not identified" with the fit's reasons;
- with several corrections, per k > 0: which keeps every batch's ratio to k = 0 within the
  tolerance;
- per B and k: the mean over each run's steps of rollout/policy_lag and off_policy/mismatch_kl
  (median over seeds, with its interval), where the runs logged them.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from analysis import bracket as br
from analysis import figures
from analysis import fits
from analysis import series as se
from analysis import stats
from analysis import study_table as st
from analysis.report_md import iv, num
from analysis.sections import decision
from analysis.sections.common import ratio
from analysis.sections.types import Figure, Section

LAG, KL = "rollout/policy_lag", "off_policy/mismatch_kl"
AS_RUN = "one configuration per B"  # the series where analysis/series.py builds none
STEM = "9_rtt_vs_staleness"
K0 = "k = 0"  # a row's state: it is the reference of its B


def with_staleness(study: st.Study, table: pd.DataFrame) -> pd.DataFrame:
  """The configuration table with each configuration's k and correction (`k`, `correction`:
  the table's max_staleness and off_policy_correction, from its first verdict run)."""
  k = table.max_staleness if "max_staleness" in table else pd.Series(0, index=table.index)
  corr = (table.off_policy_correction if "off_policy_correction" in table
          else pd.Series("none", index=table.index))
  return table.assign(k=k.fillna(0).astype(int), correction=corr.fillna("none").astype(str))


def groups(t: pd.DataFrame) -> dict[tuple[str, bool, str], pd.DataFrame]:
  """(kind, dynamic sampling on, correction) -> its verdict configurations at the kind's main
  G (configurations only a learning-rate scan ran are left out, as the series leave them)."""
  out = {}
  t = t[t.tuning_seeds == 0]
  for kind in sorted(t.kind.unique()):
    d = t[(t.kind == kind) & (t.G == st.main_group_size(t, kind))]
    on = d.dynamic_sampling.fillna(False).astype(bool)
    for (filtered, corr), g in d.groupby([on, d.correction]):
      out[(str(kind), bool(filtered), str(corr))] = g
  return out


def series_at(study: st.Study, part: pd.DataFrame) -> tuple[se.Series | None, str]:
  """One k's batch series within a group (`part`: its configurations): the report's own
  (series.series, the first: the chosen lr where there is one), else the configuration run at
  each B when there is one per B (AS_RUN, its reference at B0 or the nearest B); (None, why)
  when neither."""
  ss = se.series(study, part)
  if ss:
    return ss[0], ""
  d = part[part.num_minibatches == part.num_minibatches.mode().iloc[0]]
  many = sorted(int(b) for b, n in d.groupby("B").config.nunique().items() if n > 1)
  if many:
    return None, (f"several configurations at B = {', '.join(map(str, many))} and no batch "
                  "series among them")
  b0 = float(d.B0.mode().iloc[0]) if d.B0.notna().any() else float(d.B.min())
  configs = {int(r.B): r.config for r in d.itertuples()}
  return se._reference(str(d.kind.iloc[0]), AS_RUN, configs, b0), ""


def k0_series(by_group: dict, key: tuple) -> tuple[se.Series | None, str]:
  """The k = 0 series a group's ratios are read against: the group's own, else that of
  correction "none" of its kind and dynamic sampling; with a note saying which."""
  own = by_group.get(key, {}).get(0)
  if own is not None:
    return own, ""
  kind, filtered, corr = key
  other = by_group.get((kind, filtered, "none"), {}).get(0)
  if other is not None:
    return other, f"against k = 0 of correction none (no k = 0 run with {corr})"
  return None, "no k = 0 run to compare with"


def _state(one: stats.Interval, tolerance: float) -> str:
  """'within' or 'beyond' 1 + tolerance by a ratio's one-sided 95% bounds, else 'not
  settled' (bracket.settled_invariant and settled_broken, without the curve test)."""
  if not one.has_bounds:
    return "not settled"
  b = br.Batch(0, one.lo, one.hi)
  return ("within" if br.settled_invariant(b, tolerance) else
          "beyond" if br.settled_broken(b, tolerance) else "not settled")


def against_k0(study: st.Study, config: str, k0: str | None, seeds: int,
               tolerance: float) -> tuple[stats.Interval, stats.Interval, str]:
  """(ratio, its one-sided 95% bounds as an interval, state) of `config`'s median responses
  to target over those of `k0`, the k = 0 configuration at its B (common.ratio at 0.95 and
  0.9); no ratio where there is no k = 0 run or its median never reached the target (x / inf
  would read as 0), as decision.invariance_rows does."""
  none = stats.Interval(math.nan, n=0)
  if k0 is None:
    return none, none, "no k = 0 run at this B"
  if k0 == config:
    one = stats.Interval(1.0, n=seeds)
    return one, one, K0
  ref = st.seed_values(study, k0)
  if not (ref.size and np.isfinite(np.median(ref))):
    return none, none, "k = 0 never reached the target"
  one = ratio(study, config, k0, level=0.9)
  return ratio(study, config, k0), one, _state(one, tolerance)


def step_mean(run, metric: str) -> float:
  """The mean of `metric` over the run's steps (step >= 1, a resumed run's repeated step once:
  its last row) that logged a finite value; NaN when none did."""
  by_step = {int(r["step"]): float(r[metric]) for r in run.rows
             if isinstance(r.get("step"), (int, float)) and r["step"] >= 1
             and isinstance(r.get(metric), (int, float)) and not isinstance(r[metric], bool)
             and math.isfinite(r[metric])}
  return float(np.mean(list(by_step.values()))) if by_step else math.nan


def seed_means(study: st.Study, config: str, metric: str) -> stats.Interval:
  """The median over a configuration's verdict seeds of each run's step_mean of `metric`, with
  its interval (stats.median_interval); n = 0 when no seed logged it."""
  runs = study.verdict_runs()
  v = np.array([step_mean(study.records[r], metric) for r in runs[runs.config == config].run])
  v = v[~np.isnan(v)]
  return stats.median_interval(v) if v.size else stats.Interval(math.nan, n=0)


def cell_rows(study: st.Study, t: pd.DataFrame, by_group: dict) -> pd.DataFrame:
  """One row per group, k and B of the group's k series: responses to target (the
  configuration table's interval), its ratio to k = 0 at the same B (against_k0), the mean
  policy lag and mismatch KL (seed_means)."""
  out = []
  for key, by_k in by_group.items():
    if max(by_k) == 0:
      continue  # only k = 0: nothing on staleness (it may still be another group's reference)
    ref, _ = k0_series(by_group, key)
    for k, s in sorted(by_k.items()):
      for b, c in sorted(s.configs.items()):
        row = t[t.config == c].iloc[0]
        q, one, state = against_k0(study, c, ref.configs.get(b) if ref else None,
                                   int(row.n_seeds), study.opts.tolerance)
        out.append(dict(kind=key[0], filtered=key[1], correction=key[2], k=int(k), B=int(b),
                        config=c, label=row.label, seeds=int(row.n_seeds), rtt=row.rtt_iv,
                        final=row.final, ratio=q, one_sided=one, state=state, series=s.name,
                        lag=seed_means(study, c, LAG), kl=seed_means(study, c, KL)))
  return pd.DataFrame(out)


def bracket_of(study: st.Study, table: pd.DataFrame, s: se.Series) -> tuple[str, dict | None]:
  """Where invariance in B breaks within one k's series: the report's bracket
  (decision.invariance_rows and series_bracket: one-sided ratio bounds and the curve test), or
  'not testable here (why)' when the series has no batch above its reference or a reference
  that never reached the target."""
  ref_b = next(b for b, c in s.configs.items() if c == s.reference)
  ref = f"reference B = {ref_b}" + (f", standing in for B0 = {s.b0}" if ref_b != s.b0 else "")
  if not any(b > ref_b for b in s.configs):
    return (f"not testable here (no batch above the {ref}: the bracket compares larger batches "
            "with it)"), None
  o = study.opts
  rows = decision.invariance_rows(study, table, o.tolerance, o.band, series=[s])
  if not rows.reference_reached.iloc[0]:
    return f"not testable here (the {ref} never reached the target)", None
  b = decision.series_bracket(study, rows)
  return f"{b['text']} ({ref}; {b['n']} seeds a batch)", b


def b_crit_of(study: st.Study, s: se.Series) -> dict:
  """fits.critical_batch on one k's series: each batch's verdict seeds' responses to target."""
  points = {}
  for b, c in sorted(s.configs.items()):
    v = st.seed_values(study, c)
    if v.size:
      points[b] = v
  return fits.critical_batch(points, reps=study.opts.fit_reps, seed=study.opts.seed)


def b_crit_text(f: dict) -> str:
  """B_crit with its interval and the seeds per batch, else 'not identified (the fit's
  reasons)' with the bound it gives."""
  if f.get("identified"):
    return (f"{num(f['b_crit'])} [{num(f['b_crit_lo'])}, {num(f['b_crit_hi'])}] (seeds per "
            f"batch {'/'.join(map(str, f['n']))})")
  bound = f.get("bound")
  return ("not identified (" + "; ".join(f.get("reasons", [])) + ")"
          + (f"; B_crit {'>' if bound[0] == 'lower' else '<'} {num(bound[1])}" if bound else ""))


def k_rows(study: st.Study, table: pd.DataFrame, by_group: dict, cells: pd.DataFrame
           ) -> pd.DataFrame:
  """Per group shown (in `cells`) and k: its series, the bracket in B and B_crit."""
  out = []
  shown = set(zip(cells.kind, cells.filtered, cells.correction))
  for key, by_k in by_group.items():
    if key not in shown:
      continue
    for k, s in sorted(by_k.items()):
      text, b = bracket_of(study, table, s)
      out.append(dict(kind=key[0], filtered=key[1], correction=key[2], k=int(k), series=s.name,
                      batches=sorted(s.configs), bracket=text, x=b["x"] if b else None,
                      y=b["y"] if b else None, fit=b_crit_of(study, s)))
  d = pd.DataFrame(out)
  for col in ("x", "y"):  # a batch or None, not a float NaN
    d[col] = pd.Series([r[col] for r in out], index=d.index, dtype=object)
  return d


def _group_name(kind: str, filtered: bool, corr: str, corrections: bool) -> str:
  return kind + (" filtered" if filtered else "") + (f", correction {corr}" if corrections else "")


def _batch(v) -> int | None:
  """A batch read back from a table cell (None or NaN: none)."""
  return None if v is None or pd.isna(v) else int(v)


def _ratio_list(g: pd.DataFrame) -> str:
  """'B = 16: 1.1× [1.0, 1.2] (n=5, 92%) within; ...' over a group's rows at one k."""
  return "; ".join(f"B = {r.B}: {iv(r.ratio, '×')} {r.state}" for r in g.itertuples())


def verdicts(cells: pd.DataFrame, ks: pd.DataFrame, tolerance: float, corrections: bool
             ) -> list[str]:
  """Per group: each k's ratios to k = 0 against 1 + tolerance, the largest invariant B and
  B_crit against k."""
  out = []
  for (kind, filtered, corr), g in cells.groupby(["kind", "filtered", "correction"], sort=False):
    name = _group_name(kind, filtered, corr, corrections)
    for k, h in g[g.k > 0].groupby("k"):
      out.append(f"Staleness ({name}), k = {k}: responses to target over k = 0's at the same B "
                 f"(against 1 + {tolerance:g}): {_ratio_list(h)}.")
    mine = ks[(ks.kind == kind) & (ks.filtered == filtered) & (ks.correction == corr)]
    inv = "; ".join(f"k = {r.k}: " + _short_bracket(r.x, r.y) for r in mine.itertuples())
    crit = "; ".join(f"k = {r.k}: " + (f"{num(r.fit['b_crit'])} [{num(r.fit['b_crit_lo'])}, "
                                       f"{num(r.fit['b_crit_hi'])}]" if r.fit.get("identified")
                                       else "not identified") for r in mine.itertuples())
    out.append(f"Staleness ({name}) against k: largest invariant B: {inv}. B_crit: {crit} "
               "(the table below says why where not).")
  return out


def _short_bracket(x, y) -> str:
  """'up to B = X, broken from B = Y', 'up to B = X' or 'not testable here'."""
  x, y = _batch(x), _batch(y)
  if x is None:
    return "not testable here"
  return f"up to B = {x}" + (f", broken from B = {y}" if y is not None else "")


def _keeps(h: pd.DataFrame) -> str:
  """Whether one correction's rows at one k keep every ratio to k = 0 within the tolerance."""
  if (h.state == "within").all():
    return "**keeps it within** at every B"
  beyond = h[h.state == "beyond"]
  if len(beyond):
    return f"**does not** (beyond at B = {', '.join(map(str, beyond.B))})"
  open_ = h[h.state != "within"]
  return f"not settled (at B = {', '.join(map(str, open_.B))})"


def correction_lines(cells: pd.DataFrame, tolerance: float) -> list[str]:
  """Per kind and k > 0 run with several corrections: which keeps the ratio of responses to
  target to k = 0 within 1 + tolerance at every batch (settled by the one-sided bounds), which
  is settled beyond it at some batch, which is not settled."""
  out = []
  for (kind, filtered, k), g in cells[cells.k > 0].groupby(["kind", "filtered", "k"]):
    if g.correction.nunique() < 2:
      continue
    parts = [f"{corr}: {_keeps(h)} ({_ratio_list(h)})" for corr, h in g.groupby("correction")]
    out.append(f"Off-policy correction ({kind}{' filtered' if filtered else ''}, k = {k}), "
               f"which keeps responses to target within 1 + {tolerance:g} of k = 0's: "
               + "; ".join(parts) + ".")
  return out


def _cell_table(cells: pd.DataFrame, corrections: bool, x: str) -> pd.DataFrame:
  logged = {m: any(v.n for v in cells[c]) for m, c in ((LAG, "lag"), (KL, "kl"))}
  show = pd.DataFrame({"kind": cells.kind + np.where(cells.filtered, " filtered", ""),
                       "correction": cells.correction, "B": cells.B, "k": cells.k,
                       "configuration": cells.label,
                       f"{x} to target": [iv(r.rtt, final=r.final) for r in cells.itertuples()],
                       "ratio to k = 0": [iv(q, "×") if q.n else "—" for q in cells.ratio],
                       "one-sided": [f"[{num(q.lo)}, {num(q.hi)}]" if q.has_bounds else "—"
                                     for q in cells.one_sided],
                       "vs 1 + tolerance": cells.state})
  if not corrections:
    show = show.drop(columns=["correction"])
  for metric, col in ((LAG, "lag"), (KL, "kl")):
    show[f"mean {metric}"] = ([iv(v) if v.n else "not logged" for v in cells[col]]
                              if logged[metric] else "not logged")
  return show


def _k_table(ks: pd.DataFrame, corrections: bool) -> pd.DataFrame:
  show = pd.DataFrame({"kind": ks.kind + np.where(ks.filtered, " filtered", ""),
                       "correction": ks.correction, "k": ks.k, "series": ks.series,
                       "B": [", ".join(map(str, b)) for b in ks.batches],
                       "where invariance in B breaks": ks.bracket,
                       "B_crit": [b_crit_text(f) for f in ks.fit]})
  return show if corrections else show.drop(columns=["correction"])


def _csv(cells: pd.DataFrame, ks: pd.DataFrame, corrections: bool, x: str) -> pd.DataFrame:
  """The figure's data and every number of the section, one row per group, B and k."""
  def col(ivs, attr):
    return [getattr(v, attr) for v in ivs]
  per_k = {(r.kind, r.filtered, r.correction, r.k): r for r in ks.itertuples()}
  def k_col(fn):
    return [fn(per_k[(r.kind, r.filtered, r.correction, r.k)]) for r in cells.itertuples()]
  d = pd.DataFrame({
      "panel": [_group_name(a, b, c, corrections) for a, b, c in
                zip(cells.kind, cells.filtered, cells.correction)],
      "series": [f"B={b}" for b in cells.B], "x": cells.k, "y": col(cells.rtt, "point"),
      "lo": col(cells.rtt, "lo"), "hi": col(cells.rtt, "hi"), "style": "line",
      "kind": cells.kind, "dynamic_sampling": cells.filtered, "correction": cells.correction,
      "B": cells.B, "k": cells.k, "configuration": cells.label, "seeds": cells.seeds,
      "rtt": col(cells.rtt, "point"), "rtt_lo": col(cells.rtt, "lo"),
      "rtt_hi": col(cells.rtt, "hi"), "rtt_n": col(cells.rtt, "n"),
      "rtt_coverage": col(cells.rtt, "coverage"), "ratio_to_k0": col(cells.ratio, "point"),
      "ratio_lo": col(cells.ratio, "lo"), "ratio_hi": col(cells.ratio, "hi"),
      "ratio_n": col(cells.ratio, "n"), "ratio_coverage": col(cells.ratio, "coverage"),
      "ratio_one_sided_lo": col(cells.one_sided, "lo"),
      "ratio_one_sided_hi": col(cells.one_sided, "hi"), "vs_tolerance": cells.state,
      "policy_lag": col(cells.lag, "point"), "policy_lag_n": col(cells.lag, "n"),
      "mismatch_kl": col(cells.kl, "point"), "mismatch_kl_n": col(cells.kl, "n"),
      "invariant_up_to_B": k_col(lambda r: _batch(r.x)),
      "broken_from_B": k_col(lambda r: _batch(r.y)),
      "b_crit": k_col(lambda r: r.fit.get("b_crit", math.nan) if r.fit.get("identified")
                      else math.nan),
      "b_crit_lo": k_col(lambda r: r.fit.get("b_crit_lo", math.nan)),
      "b_crit_hi": k_col(lambda r: r.fit.get("b_crit_hi", math.nan)),
      "b_crit_identified": k_col(lambda r: bool(r.fit.get("identified"))),
      "sample_axis": x})
  for c in ("y", "lo", "hi"):
    d[c] = d[c].replace([np.inf, -np.inf], np.nan)
  return d.sort_values(["panel", "B", "k"], kind="stable").reset_index(drop=True)


def staleness(study: st.Study, table: pd.DataFrame) -> Section | None:
  """The section; None when the configurations compared do not differ in
  rollout.max_staleness (the report then has no such section)."""
  if table.empty:
    return None
  t = with_staleness(study, table)
  if t.k.nunique() < 2:
    return None
  by_group, notes = {}, []
  corrections = t.correction.nunique() > 1
  for key, part in groups(t).items():
    for k, at_k in part.groupby("k"):
      s, why = series_at(study, at_k)
      if s is None:
        notes.append(f"{_group_name(*key, corrections)}, k = {k}: left out ({why}).")
      else:
        by_group.setdefault(key, {})[int(k)] = s
  cells = cell_rows(study, t, by_group)
  sec = Section("Staleness: responses to target against rollout.max_staleness k")
  if cells.empty:
    sec.skipped = "no group of configurations at two or more k. " + " ".join(notes)
    return sec
  ks = k_rows(study, table, by_group, cells)
  o, x = study.opts, st.x_label(study)
  sec.text.append(
      f"Step t of a run with rollout.max_staleness = k trains on responses sampled with the "
      f"weights after update max(0, t−1−k) (k = 0: synchronous; a run written with "
      f"rollout.overlap reads as k = 1 or 0). Per batch B and k: {x} to target, median over "
      "seeds [interval] (n seeds, coverage), a run that never reached the target censored, not "
      "dropped; its ratio to k = 0 at the same B, a percentile bootstrap of Kaplan–Meier "
      "medians with its simulated coverage, *within* the tolerance when its one-sided 95% upper "
      f"bound is at most 1 + {o.tolerance:g}, *beyond* it when its lower bound is above, else "
      "*not settled*. Per k, where invariance in B breaks (the bracket of the invariance "
      "section on that k's series) and B_crit (the critical-batch fit), each where the runs "
      "allow it. Mean policy lag and mismatch KL: each run's mean over its steps, median over "
      "seeds.")
  for key in by_group:
    ref, note = k0_series(by_group, key)
    if note and key in set(zip(cells.kind, cells.filtered, cells.correction)):
      sec.text.append(f"{_group_name(*key, corrections)}: {note}.")
  sec.text += notes
  sec.verdict += verdicts(cells, ks, o.tolerance, corrections)
  sec.verdict += correction_lines(cells, o.tolerance) if corrections else []
  sec.tables.append((f"{x} to target per B and k (median [interval] (seeds, coverage)); its "
                     "ratio to k = 0 at the same B [95%] and one-sided 95% bounds against 1 + "
                     f"{o.tolerance:g}; mean policy lag and mismatch KL over steps, median over "
                     "seeds", _cell_table(cells, corrections, x)))
  sec.tables.append(("Against k: where invariance in B breaks (analysis/bracket.py on each k's "
                     "series) and B_crit (E = E_min (1 + B/B_crit))", _k_table(ks, corrections)))
  data = _csv(cells, ks, corrections, o.x)
  sec.figures.append(Figure(
      STEM, f"{x} to target (median over seeds, interval shaded) against the staleness bound k, "
      "one line per B, one panel per kind and correction; the CSV holds every number of the "
      "section.\nA flat line: staleness costs nothing at that B; gaps never reached the target.",
      data, functools.partial(figures.lines, xlabel="k (rollout.max_staleness)",
                              ylabel=f"{x} to target")))
  sec.facts.update(cells=cells, k_rows=ks, data=data)
  return sec

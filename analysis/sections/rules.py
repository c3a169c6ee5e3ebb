"""The learning rate at every batch (does the best rate follow the sqrt, linear or no rule; what
does a fixed rate cost?) and configurations of equal P x G."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from analysis import figures
from analysis import fits
from analysis import stats
from analysis import study_table as st
from analysis.report_md import iv, num
from analysis.runs import axis_label
from analysis.sections.common import ratio, study_series
from analysis.sections.questions import MIN_COVERAGE, rules_out
from analysis import series as se
from analysis.series import chosen_rule
from analysis.sections.types import Figure, Section

RULES = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}  # the exponent of lr in B of each rule


def scan_table(study: st.Study, kind: str, g: int, filtered: bool = False) -> pd.DataFrame:
  """Every (B, lr) the scan ran for `kind` at G = g with dynamic sampling on (`filtered`) or
  off: median responses to target and final value with their intervals, over the tuning
  stage's seeds (the ones the study chose with) when there is one, else over every run."""
  used = study.used()
  used = used[(used.kind == kind) & (used.G == g)
              & (used.dynamic_sampling.fillna(False).astype(bool) == filtered)]
  if (used.role == "tuning").any():
    used = used[used.role == "tuning"]
  rows = []
  for (b, lr), r in used.groupby(["B", "lr"]):
    e = r.responses_to_target.to_numpy(float)
    rows.append(dict(B=int(b), P=int(r.P.iloc[0]), lr=float(lr), seeds=len(r),
                     roles="+".join(sorted(set(r.role))), scanned=bool((r.role == "tuning").any()),
                     rtt_iv=stats.median_interval(e),
                     final_iv=stats.median_interval(r.final.to_numpy(float)),
                     rtt=float(np.median(e)), worst=float(np.max(e)),
                     final_med=float(np.median(r.final)),
                     max_drop=float(r.drop_after_target.max()), values=e))
  if not rows:
    return pd.DataFrame()
  scan = pd.DataFrame(rows)
  return scan.assign(eligible=eligible(scan, _band(study)))


def _chosen(study: st.Study, kind: str) -> dict[int, float]:
  from analysis.series import chosen_lr
  return chosen_lr(study, kind)


def _band(study: st.Study) -> float:
  """The eligibility band the study chose with (study.json), else the report's band."""
  bands = [c.get("band") for c in study.record.get("chosen", {}).values() if c.get("band")]
  return float(bands[0]) if bands else study.opts.band


def eligible(scan: pd.DataFrame, band: float) -> pd.Series:
  """The rule the study runner chooses by (rlscale/study/study.py): a rate is stable when its
  median final value is within `band` of the best rate's at that B and none of its seeds fell
  more than `band` below the target after reaching it."""
  best = scan.groupby("B").final_med.transform("max")
  return (scan.final_med >= best - band) & ~(scan.max_drop > band)


# How lr_optima chooses where the study recorded no choice: the runner's rule
# (rlscale/study/study.py's choose).
REPORT_RULE = ("fewest median responses to target over the scan's seeds among the stable rates, "
               "then the faster slowest seed")


def lr_optima(scan: pd.DataFrame, chosen: dict[int, float] | None = None) -> pd.DataFrame:
  """Per B: the chosen lr (the study's, else by the runner's rule, REPORT_RULE), whether it is
  at the edge of the rates its scan tried, and lr*, the optimum of the median responses among
  the stable rates refined between grid points (fits.lr_optimum), which the exponent of lr*(B)
  is fitted to."""
  out = []
  for b, g in scan.groupby("B"):
    f = fits.lr_optimum(g.lr, g.rtt.where(g.eligible, np.inf))
    ok = g[g.eligible & np.isfinite(g.rtt)]
    pick = (chosen or {}).get(int(g.P.iloc[0]))
    if pick is None:
      pick = (float(ok.assign(_f=-ok.final_med).sort_values(["rtt", "worst", "_f"]).lr.iloc[0])
              if len(ok) else float("nan"))
    grid = g[g.scanned] if g.scanned.any() else g
    edge = bool(np.isfinite(pick) and (len(grid) < 2 or any(
        abs(pick / v - 1) < 1e-3 for v in (grid.lr.min(), grid.lr.max()))))
    out.append(dict(B=int(b), tried=len(grid), chosen=pick, at_edge=edge,
                    lr_star=f["lr"], reached=f["reached"]))
  return pd.DataFrame(out)


def lr_exponent(study: st.Study, scan: pd.DataFrame) -> dict:
  """fits.lr_exponent on the scan's cells, with its interval's coverage measured by simulating
  this scan (its cells and seeds) at the spread of its seeds and the curvature of its E(lr)."""
  cells = {(r.B, r.lr): r.values for r in scan.itertuples() if r.eligible}
  out = fits.lr_exponent(cells, reps=study.opts.fit_reps, seed=study.opts.seed)
  if not np.isfinite(out["lo"]):
    return out
  logs = [np.log(v[np.isfinite(v)]) for v in cells.values() if np.isfinite(v).sum() >= 2]
  dof = sum(x.size - 1 for x in logs)
  spread = float(np.sqrt(sum(((x - x.mean()) ** 2).sum() for x in logs) / dof)) if dof else 0.3
  curv = []
  for _, g in scan.groupby("B"):
    ok = g[np.isfinite(g.rtt)]
    if len(ok) >= 3:
      c2 = np.polyfit(np.log2(ok.lr), np.log(ok.rtt), 2)[0]
      curv.append(max(c2, 0.02))
  curvature = float(np.median(curv)) if curv else 0.2
  design = {k: int(v.size) for k, v in cells.items()}
  out.update(spread=spread, curvature=curvature, coverage=fits.lr_exponent_coverage(
      design, out["exponent"], spread, curvature, datasets=100, reps=100, seed=study.opts.seed))
  return out


def _joint_text(kind: str, joint: dict) -> str:
  """What the joint fit of E(B, lr) (rlscale/study/lr_fit.py) chose, or why it did not."""
  if not joint.get("identified"):
    return (f"{kind}: the joint fit of E(B, lr) is not identified ({joint.get('why')}): each "
            "batch's rate was chosen on its own scan, and its runner-up ran beside it.")
  f = joint["fit"]
  per_b = "; ".join(
      f"B = {int(joint['batches'][g])}: optimum {num(joint['optimum'][g])}, chosen "
      f"{num(joint['values'][g])} ({100 * math.expm1(joint['correction'][g]):.1f}% slower)"
      for g in joint["order"])
  return (f"{kind}: the rate per B was chosen by one fit of E(B, lr) over the scan's {f['points']}"
          f" stable cells that reached the target (log E a parabola in log lr of one curvature, "
          f"a = {f['a']:.2f}, whose optimum moves as B^{-f['c2'] / (2 * f['a']):.2f}; residual "
          f"spread {f['resid_sd']:.2f} of log E against {f['expected_sd']:.2f} from the seeds): "
          f"the scan's rate nearest each fitted optimum, read at the optimum in the verdict, the "
          f"correction's spread over {joint.get('redraws', 0)} redraws of the scan seeds "
          f"carried into its intervals (a batch whose own scan chose another rate runs that one "
          f"beside it). {per_b}.")


def learning_rate(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("The learning rate at every batch")
  if table.empty:
    sec.skipped = "no finished run."
    return sec
  settings = sorted(set(table.dynamic_sampling.fillna(False).astype(bool)))
  for kind, on in [(k, on) for k in sorted(table.kind.unique()) for on in settings]:
    g = st.main_group_size(table, kind)
    scan = scan_table(study, kind, g, on)
    if scan.empty or scan.groupby("B").lr.nunique().max() < 2:
      continue
    base_kind = kind
    kind = f"{kind} filtered" if on else kind  # names its tables, figure and facts
    opt = lr_optima(scan, _chosen(study, kind))
    sec.facts.setdefault("lr_per_B", {})[kind] = opt
    rule = chosen_rule(study, kind) if _chosen(study, kind) else None
    how = (f"the study's choice, {rule}" if rule else "the study's choice" if rule == ""
           else f"by the study runner's rule, {REPORT_RULE}")
    warm = table[table.kind == base_kind].warmup.fillna(0).astype(float)
    note = _warmup_note(base_kind, table[table.kind == base_kind]) if warm.gt(0).any() else ""
    if note and note not in sec.text:
      sec.text.append(note)
    sec.tables.append((f"{kind}: responses to target per B and lr over the scan's seeds "
                       f"(median [interval] (seeds, coverage), and the slowest seed); stable: the "
                       f"median final within {_band(study):g} of the best rate's and no seed "
                       "falling more than that below the target after reaching it",
                       pd.DataFrame({
                           "B": scan.B, "P": scan.P, "lr": scan.lr, "stages": scan.roles,
                           "responses to target": [iv(r.rtt_iv, final=r.final_iv.point)
                                                   for r in scan.itertuples()],
                           "slowest seed": scan.worst,
                           "final": [iv(r.final_iv) for r in scan.itertuples()],
                           "largest drop": scan.max_drop,
                           "stable": ["yes" if e else "no" for e in scan.eligible]})))
    joint = {} if on else (se.choice_of(study, base_kind) or {}).get("joint") or {}
    if joint:
      sec.text.append(_joint_text(kind, joint))
    edges = opt[opt.at_edge & (opt.tried > 1)]
    sec.tables.append((lr_per_b_title(kind, how), pd.DataFrame({
                           "B": opt.B, "tried": opt.tried, "chosen": opt.chosen.map(num),
                           "at_edge": opt.at_edge, "lr*": opt.lr_star.map(num)})))
    ex = lr_exponent(study, scan)
    sec.facts.setdefault("exponent", {})[kind] = ex
    edge = (f"; the chosen lr is at its scan's edge at B = {', '.join(map(str, edges.B))} (the "
            "optimum may lie beyond)" if len(edges) else "")
    if np.isfinite(ex["lo"]):
      sec.verdict.append(f"{kind}: the chosen lr grows as B^{num(ex['exponent'])} "
                         f"[{num(ex['lo'])}, {num(ex['hi'])}] over {len(ex['batches'])} batches "
                         f"({ex['seeds']}+ seeds per rate; the interval's coverage on simulated "
                         f"scans like this one: {ex['coverage']:.0%}); sqrt = 0.5, linear = 1, "
                         f"none = 0: {exponent_claim(ex)}{edge}.")
    elif np.isfinite(ex["exponent"]):
      sec.verdict.append(f"{kind}: the chosen lr grows as B^{num(ex['exponent'])} over "
                         f"{len(ex['batches'])} batches (no interval: {ex['seeds']} seed(s) per "
                         f"rate){edge}.")
    sec.figures.append(_lr_figure(kind, scan, opt, study.opts.x))
  _fixed_cost(study, table, sec)
  if not sec.tables:
    sec.skipped = "no batch was run at two or more learning rates."
  return sec


def lr_per_b_title(kind: str, how: str) -> str:
  """The title of the lr-per-B table: f"{kind}: lr per B (chosen: ...)". The design check
  (sections/decision.py) finds it by "lr per B" and reads its `tried` and `at_edge` columns;
  the unformatted values are in facts["lr_per_B"][kind] (lr_optima: B, tried, chosen,
  at_edge, lr_star)."""
  return (f"{kind}: lr per B (chosen: {how}; tried: the rates its scan tried; at_edge: the "
          "chosen rate is the smallest or largest of them; lr*: the optimum of the median "
          "refined between grid points, to which lr*(B) is fitted)")


def exponent_claim(ex: dict) -> str:
  """What the lr exponent's interval says of the none / sqrt / linear rules, no more strongly
  than its coverage allows (questions.rules_out): it excludes the rules it misses only at
  a coverage of at least questions.MIN_COVERAGE; below, it suggests and does not settle."""
  admits = [name for name, a in RULES.items() if ex["lo"] <= a <= ex["hi"]]
  misses = [name for name in RULES if name not in admits]
  text = (f"the interval admits {', '.join(admits)}" if admits else
          "the interval admits no rule of the three")
  if not misses:
    return text
  cov = ex.get("coverage", math.nan)
  if rules_out(cov):
    return (f"the interval excludes all three rules ({', '.join(misses)})" if not admits else
            text + f" and excludes {', '.join(misses)}")
  return text + (f"; it misses {', '.join(misses)}, but at {cov:.0%} coverage (below "
                 f"{MIN_COVERAGE:.0%}) that only suggests they do not hold: which rule holds "
                 "is not settled")


def _warmup_note(kind: str, rows: pd.DataFrame) -> str:
  """Whether leaving the critic's warm-up out of responses to target is fair within the kind:
  it is when every configuration's warm-up is the same."""
  warm = rows.warmup.fillna(0).astype(float)
  if warm.nunique() == 1:
    return (f"{kind}: responses to target leave out the critic's warm-up ({num(warm.iloc[0])} "
            "responses, the same at every B and lr), so it moves no choice and no ratio within "
            f"{kind}; a comparison with another kind counts it (responses and time to target "
            "incl. warm-up).")
  per = ", ".join(f"B = {b}: {num(w)}" for b, w in sorted(set(zip(rows.B, warm))))
  return (f"{kind}: responses to target leave out the critic's warm-up, which differs between "
          f"configurations ({per}): ratios within {kind} leave out different amounts.")


def _fixed_cost(study: st.Study, table: pd.DataFrame, sec: Section) -> None:
  """Per B: responses to target at the reference's lr over those at the batch's chosen lr."""
  by = {(s.kind, s.name): s for s in study_series(study, table)}
  for s in [s for s in by.values() if s.chosen]:
    fixed = [f for f in by.values() if f.kind == s.kind and f.name.startswith("fixed lr")
             and f.reference == s.reference]
    if not fixed:
      continue
    f = fixed[0]
    rows = []
    for b in sorted(set(s.configs) & set(f.configs)):
      if s.configs[b] == f.configs[b]:
        continue
      q = ratio(study, f.configs[b], s.configs[b])
      rows.append(dict(B=b, fixed=table[table.config == f.configs[b]].label.iloc[0],
                       best=table[table.config == s.configs[b]].label.iloc[0], ratio=q))
    if not rows:
      continue
    d = pd.DataFrame(rows)
    sec.facts.setdefault("fixed_cost", {})[s.kind] = d
    sec.tables.append((f"{s.kind}: what the reference's lr costs at other batches (responses "
                       f"to target at {f.name} / at the {s.name})",
                       d.rename(columns={"best": "chosen"}).assign(
                           ratio=[iv(q, "×") for q in d.ratio])))
    finite = [r for r in rows if np.isfinite(r["ratio"].point)]
    never = [r for r in rows if not np.isfinite(r["ratio"].point)]
    text = f"{s.kind}: keeping the reference's lr ({f.name}) "
    if finite:
      worst = max(finite, key=lambda r: r["ratio"].point)
      text += (f"costs up to {iv(worst['ratio'], '×')} the responses of the {s.name} (at "
               f"B = {worst['B']})")
    if never:
      text += ("; " if finite else "") + "never reaches the target (median over seeds) at B = " \
          + ", ".join(str(r["B"]) for r in never)
    sec.verdict.append(text + "; per B: " + ", ".join(
        f"{r['B']}: {num(r['ratio'].point)}×" for r in rows) + ".")


def _lr_figure(kind: str, scan: pd.DataFrame, opt: pd.DataFrame, x: str) -> Figure:
  parts = [pd.DataFrame({"panel": f"{kind}: responses to target per lr", "series": f"B={b}",
                         "x": g.lr, "y": g.rtt.replace(np.inf, np.nan), "style": "line"})
           for b, g in scan.groupby("B")]
  ok = opt[np.isfinite(opt.lr_star)]
  panel = f"{kind}: best lr per B"
  parts.append(pd.DataFrame({"panel": panel, "series": "lr* (median optimum)", "x": ok.B,
                             "y": ok.lr_star, "style": "line"}))
  parts.append(pd.DataFrame({"panel": panel, "series": "chosen", "x": opt.B,
                             "y": opt.chosen, "style": "points"}))
  if len(ok):
    b = np.geomspace(ok.B.min(), ok.B.max(), 20)
    b_mid = float(np.exp(np.mean(np.log(ok.B))))
    lr_mid = float(np.exp(np.mean(np.log(ok.lr_star))))
    for name, a in RULES.items():
      parts.append(pd.DataFrame({"panel": panel, "series": f"{name} rule", "x": b,
                                 "y": lr_mid * (b / b_mid) ** a, "style": "fit"}))
  return Figure(f"3_lr_per_batch_{kind.replace(' ', '_')}",
                f"{kind}: {axis_label(x)} to target against the learning rate, one line per B "
                "(median over all seeds; gaps never reached), and the best lr per B with the "
                "none / sqrt / linear rules through the same middle.\nA rule is right when the "
                "best lr follows its line; a best lr at a scan's end may lie beyond it.",
                pd.concat(parts, ignore_index=True).assign(sample_axis=x),
                functools.partial(figures.lines, logx=True, logy=True, xlabel={
                    f"{kind}: responses to target per lr": "learning rate",
                    f"{kind}: best lr per B": "B (responses per optimizer step)"}, ylabel={
                    f"{kind}: responses to target per lr": f"{axis_label(x)} to target",
                    f"{kind}: best lr per B": "best learning rate"}))


def equal_pg_groups(table: pd.DataFrame) -> list[pd.DataFrame]:
  """Verdict configurations with the same kind, P x G, mini-batches and lr but different
  (P, G)."""
  out = []
  d = table[table.tuning_seeds == 0]
  for _, g in d.groupby(["kind", "dynamic_sampling", "responses_per_step", "num_minibatches",
                         "lr"]):
    g = g.sort_values("n_seeds", ascending=False).drop_duplicates(["P", "G"])
    if len(g) >= 2:
      out.append(g.sort_values("G"))
  return out


def pairs(study: st.Study, table: pd.DataFrame) -> Section:
  sec = Section("Equal P×G: does only the product matter?")
  groups = equal_pg_groups(table) if not table.empty else []
  if not groups:
    sec.skipped = "no two configurations share P×G and lr with different (P, G)."
    return sec
  rows, curves = [], []
  for g in groups:
    main_g = st.main_group_size(table, g.kind.iloc[0])
    main = g[g.G == main_g]
    base = (main if len(main) else g).iloc[0]
    panel = (f"{base.kind} P×G={base.responses_per_step} lr={num(base.lr)}"
             + (" filtered" if base.dynamic_sampling else ""))
    for r in g.itertuples():
      q = ratio(study, r.config, base.config) if r.config != base.config else None
      rows.append({"P×G": r.responses_per_step, "configuration": r.label,
                   "versus": base.label,
                   f"{st.x_label(study)} to target": iv(r.rtt_iv, final=r.final),
                   "ratio": iv(q, "×") if q else "1 (itself)", "q": q})
      c = st.config_curve(study, r.config)
      curves.append(pd.DataFrame({"panel": panel, "series": f"P={r.P} G={r.G}",
                                  "x": c.responses, "y": c["median"], "lo": c.lo,
                                  "hi": c.hi, "style": "line", "sample_axis": study.opts.x}))
      if q:
        differs = q.has_bounds and not (q.lo <= 1 <= q.hi)
        sec.verdict.append(f"Equal P×G = {r.responses_per_step}: {r.label} needs {iv(q, '×')} "
                           f"the responses of {base.label}" + (
                               " (different: the interval excludes 1)" if differs else
                               " (not different: the interval includes 1)" if q.has_bounds
                               else ""))
  d = pd.DataFrame(rows)
  sec.facts["pairs"] = d
  sec.tables.append(("Responses to target of equal P×G, relative to the main G",
                     d.drop(columns=["q"])))
  sec.figures.append(Figure(
      "5_equal_PxG_curves", f"`{study.metric}` vs {st.x_label(study)} for configurations of "
      "equal P×G "
      "(median over seeds, seed range shaded), one panel per P×G.\nOverlapping curves mean "
      "only the product P×G matters, not how it splits into prompts and responses.",
      pd.concat(curves, ignore_index=True),
      functools.partial(figures.lines, xlabel=st.x_label(study), ylabel=study.metric,
                        hline=study.target)))
  return sec

"""Writing report.md: the verdict first, definitions, the runs left out, then each section with
its figures (two lines each) and tables. Also the number formats every section shares."""

from __future__ import annotations

import math
import os

import pandas as pd


def num(v, digits: int = 3) -> str:
  """A number for people: 3 significant digits, thousands as 12.3k; '—' when missing."""
  if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
    return "—"
  if isinstance(v, str):
    return v
  v = float(v)
  if math.isinf(v):
    return "∞" if v > 0 else "-∞"
  if abs(v) >= 1e4:
    return f"{v / 1e3:.{digits}g}k" if abs(v) < 1e7 else f"{v:.{digits}g}"
  if abs(v) >= 10 ** digits:  # 4040, not 4.04e+03
    return f"{round(v, digits - 1 - int(math.floor(math.log10(abs(v))))):.0f}"
  return f"{v:.{digits}g}"


def interval(point, lo, hi, final=None, unit: str = "") -> str:
  """'4.2k [4.1k, 4.3k]'; a never-reached value reads 'not reached (final 0.41)'."""
  if point is not None and not pd.isna(point) and math.isinf(float(point)):
    return "not reached" + (f" (final {num(final)})" if final is not None else "")
  body = f"{num(point)}{unit}"
  if not (pd.isna(lo) or pd.isna(hi)):
    body += f" [{num(lo)}, {num(hi)}]"
  return body


def iv(v, unit: str = "", final=None) -> str:
  """A stats.Interval for people, with its seeds and coverage:
  '4.2k [4.1k, 4.3k] (n=5, 94%)', with the share of bootstrap resamples in which a median was
  censored (more than half its seeds never reached the target) when there were any; below 3
  seeds 'range 4.1k–4.3k (n=2)'; one seed '(n=1)'."""
  if v is None or pd.isna(v.point):
    return "—"
  if math.isinf(v.point) and v.point > 0:
    head = "not reached" + (f" (final {num(final)})" if final is not None else "")
    return head + (f" (n={v.n})" if v.n else "")
  if not v.has_bounds:
    return f"{num(v.point)}{unit} (n={v.n})"
  if v.method == "range":
    return f"{num(v.point)}{unit} (range {num(v.lo)}–{num(v.hi)}, n={v.n})"
  cover = "coverage not measured" if math.isnan(v.coverage) else f"{v.coverage:.0%}"
  censored = getattr(v, "censored", 0.0) or 0.0
  tail = f", {censored:.0%} of resamples censored" if censored > 0.005 else ""
  return f"{num(v.point)}{unit} [{num(v.lo)}, {num(v.hi)}] (n={v.n}, {cover}{tail})"


def table(df: pd.DataFrame) -> str:
  """A markdown table of already formatted cells (no tabulate needed)."""
  if df.empty:
    return "(none)\n"
  cells = [[str(c) for c in df.columns]] + [[_cell(v) for v in row] for row in df.itertuples(
      index=False)]
  lines = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(df.columns)]
  lines += ["| " + " | ".join(r) + " |" for r in cells[1:]]
  return "\n".join(lines) + "\n"


def _cell(v) -> str:
  s = num(v) if isinstance(v, float) else ("—" if v is None or v is pd.NA else str(v))
  return s.replace("|", "\\|").replace("\n", " ")


def _problems(study) -> str:
  bad = study.runs[study.runs.problem != ""]
  if bad.empty:
    return "Every run finished and is used.\n"
  rows = pd.DataFrame({"run": bad.run, "status": bad.status, "why not used": bad.problem,
                       "error (last line)": bad.error.fillna(""),
                       "evaluations": bad.get("n_eval", pd.Series(0, index=bad.index))})
  return (f"{len(bad)} of {len(study.runs)} runs are not used in any table, fit or figure:"
          "\n\n" + table(rows))


def interval_columns(table: pd.DataFrame) -> pd.DataFrame:
  """The configuration table for a CSV: each stats.Interval column `x_iv` as x_lo, x_hi, x_n
  and x_coverage beside its point."""
  out = table.copy()
  for col in [c for c in table.columns if c.endswith("_iv")]:
    name = col[:-3]
    out[f"{name}_lo"] = [v.lo for v in table[col]]
    out[f"{name}_hi"] = [v.hi for v in table[col]]
    out[f"{name}_n"] = [v.n for v in table[col]]
    out[f"{name}_coverage"] = [v.coverage for v in table[col]]
    out = out.drop(columns=[col])
  return out


def _definitions(study) -> list[str]:
  from analysis import stats
  o = study.opts
  seeds = sorted({int(n) for n in study.verdict_runs().groupby("config").size()})
  cover = ", ".join(f"{stats.median_interval(range(n)).coverage:.0%} at n={n}"
                    for n in seeds if n >= 2)
  ratio = ", ".join(f"{stats.ratio_coverage(n, n):.0%} at n={n}" for n in seeds if n >= 2)
  axis = {"generated": "responses generated (`responses_seen`: the sample cost, every response "
                       "sampled, whether or not it entered an update)",
          "trained": "responses trained (`responses_trained`: those that entered an update; "
                     "`responses_seen` for runs that did not log it, which trained on every "
                     "response they generated)"}[o.x]
  return [
      f"- **Metric** `{study.metric}`, **target** {num(study.target)} ({study.target_note}).",
      f"- **Sample axis** (--x {o.x}): every count of responses in this report (curves, "
      f"responses, steps and time to target, every figure against responses) is {axis}.",
      "- **B** = responses per optimizer step (P×G/num_minibatches; also given in prompts). "
      "**Effective B** = the mean of `rollout/effective_batch` (informative responses per "
      "optimizer step: rows of groups whose advantage is not all zero) over a run's steps up "
      "to its crossing (all of them when it does not cross), median over seeds; 'not logged' "
      "for runs without it. Runs with dynamic sampling (`rollout.dynamic_sampling`: groups "
      "without signal dropped and refilled; 'filtered') and without it are separate "
      "configurations and series.",
      "- **Configuration** = kind, P, G, mini-batches, the actor's effective learning rate and "
      "the other config values that vary across runs and change the computation: "
      + (", ".join(f"`{k}`" for k in study.varying) or "(none)") + ". Seeds, evaluation "
      "spacing, run length, target and how the lr was written (base and rule) do not split "
      "configurations.",
      "- **Seeds**: a stage that chose a value (study.json) tunes; every verdict uses the other "
      "stages' seeds of a configuration. Statistics over seeds are medians; a median's interval "
      "is the distribution-free order-statistic one, printed with its seeds and exact coverage"
      + (f" ({cover})" if cover else "") + "; below 3 seeds only the range is shown. A ratio's "
      "interval is a percentile bootstrap of Kaplan–Meier medians, each side resampled within "
      "itself; a run that never reached the target is censored at its end, a resample whose "
      "median is censored is kept (a ratio over it reads 0, one of it ∞) and the share of "
      "such resamples is printed; its coverage, measured by simulation at the seed counts "
      "used and at each interval's own censoring, is printed beside it"
      + (f" (without censoring: {ratio})" if ratio else "") + ". No interval rests on one seed.",
      "- **Responses to target** = where the raw evaluations first reach the target, "
      "interpolated between that evaluation and the one before (rlscale/metrics/crossing.py): "
      "no smoothing window, and no later evaluation moves it, so it does not depend on how "
      "often a run evaluates. Within PPO the critic's warm-up responses (the same at every batch) "
      "are subtracted; wherever PPO is compared with GRPO they are counted. Never "
      "reached = ∞ ('not reached (final X)'). **Steps to target** = the actor's optimizer "
      f"steps by then; fewer than {o.min_steps} is flagged as a transient.",
      "- **Time to target** = responses to target / steady throughput (median over steps ≥ 2 "
      "of responses per step / (time/step − time/eval − time/checkpoint)); for a run with "
      "dynamic sampling, whose steps vary in responses, its steps to the crossing × the median "
      "net seconds of a step.",
      f"- **Settled invariant** B (one-sided): the one-sided 95% upper bound of its "
      f"responses-to-target ratio to the reference lies at or below 1 + {o.tolerance:g} and "
      f"the curve test (a seed-permutation test of its median curve's largest gap below the "
      f"reference's, a break only beyond {o.band:g}) does not reject it; **settled broken**: "
      "the lower bound lies above 1 + tolerance, or the curve test rejects; a faster or higher "
      "curve is never a break. **Invariant up to X, broken from Y**: every B from B0 to X "
      "settled invariant; Y and every larger B settled broken. The sensitivity table varies "
      "tolerance and target for the point estimates alone.",
  ] + [f"- **Learning rate**: {n}." for n in study.lr_notes]


def write(study, sections, out: str) -> str:
  """report.md under `out` from the computed sections; returns its path. The verdict comes
  first, then the claims of the reference study (a section with `lead` set), then the
  definitions, the runs left out and each section."""
  lead = [s for s in sections if getattr(s, "lead", False)]
  body = [s for s in sections if not getattr(s, "lead", False)]
  lines = ["# Batch-size study report", "", "## Verdict", ""]
  for s in body:
    lines += [f"- {v}" for v in s.verdict]
  for s in lead:
    lines += ["", f"## {s.title}", ""] + s.text + [""]
    lines += [f"- {v}" for v in s.verdict]
  lines += ["", "## Definitions", ""] + _definitions(study)
  lines += ["", "## Runs not used", "", _problems(study)]
  if study.warnings:
    lines += ["## Warnings", ""] + [f"- {w}" for w in study.warnings] + [""]
  for i, s in enumerate(body, 1):
    lines += [f"## {i}. {s.title}", ""]
    if s.skipped:
      lines += [f"Skipped: {s.skipped}", ""]
      continue
    lines += s.text + ([""] if s.text else [])
    for f in s.figures:
      lines += [f"![{f.stem}]({f.stem}.png)", "", f.caption, "",
                f"Data: [{f.stem}.csv]({f.stem}.csv)", ""]
    for title, df in s.tables:
      lines += [f"**{title}**", "", table(df)]
  path = os.path.join(out, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path

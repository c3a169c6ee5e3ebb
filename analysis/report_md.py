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
  return (f"{len(bad)} of {len(study.runs)} runs are not used in the fits (unfinished runs "
          "with evaluations are drawn dashed in the invariance curves):\n\n" + table(rows))


def _definitions(study) -> list[str]:
  o = study.opts
  return [
      f"- **Metric** `{study.metric}`, **target** {num(study.target)}; the stat over seeds is "
      f"the {'interquartile mean' if o.stat == 'iqm' else 'median'} with a stratified "
      f"bootstrap {95}% interval ({o.reps} reps; fits: {o.fit_reps} reps).",
      "- **B** = responses per optimizer step (P×G/num_minibatches; also given in prompts).",
      "- **Configuration** = the config values that vary across runs except `seed`: "
      + (", ".join(f"`{k}`" for k in study.varying if k not in study.kind_only) or "(none)")
      + (f" (and {len(study.kind_only)} fields set in one kind only, e.g. "
         f"`{study.kind_only[0]}`)" if study.kind_only else "") + ".",
      f"- **Responses to target** = first crossing of the eval curve smoothed over "
      f"{o.window} evaluations (trailing), interpolated; never reached = ∞, shown as "
      "'not reached (final X)'.",
      "- **Time to target** = responses to target / steady throughput (median over steps ≥ 2 "
      "of responses per step / (time/step − time/eval − time/checkpoint)).",
      "- **Reference** = the configuration at B = B0 (optim.reference_batch) of the same kind "
      "and LR rule; a configuration whose interval overlaps the reference's is not different.",
      f"- **Invariant** B: responses-to-target ratio within 1 ± {o.tolerance:g} of the "
      f"reference and the smoothed curve within ±{o.band:g} of the reference's at equal "
      "responses seen; the largest invariant B is the largest B reached from B0 through "
      "invariant batches only.",
  ] + [f"- **Learning rate**: {n}." for n in study.lr_notes]


def write(study, sections, out: str) -> str:
  """report.md under `out` from the computed sections; returns its path."""
  lines = ["# Batch-size study report", "", "## Verdict", ""]
  for s in sections:
    lines += [f"- {v}" for v in s.verdict]
  lines += ["", "## Definitions", ""] + _definitions(study)
  lines += ["", "## Runs not used", "", _problems(study)]
  if study.warnings:
    lines += ["## Warnings", ""] + [f"- {w}" for w in study.warnings] + [""]
  for i, s in enumerate(sections, 1):
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

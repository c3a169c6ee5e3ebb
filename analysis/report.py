"""A study's report: from sweep directories to report.md, figures (PNG, PDF) and their CSVs.

    python analysis/report.py runs/study                 # writes runs/study/report/
    python analysis/report.py runs/bi runs/ppo --out report --target 0.6 --tolerance 0.1
    python analysis/report.py runs/ds --x trained        # against responses that trained

DIR is a sweep directory (sweep.json), a study directory (one sweep per stage), or run
directories. Every point is listed, the ones not used (failed, unfinished) with their status and
error. The sections and their formulas: docs/study/README.md.

--x chooses the sample axis of every curve, responses (steps, time) to target and figure
against responses: `generated` (default; the metrics column responses_seen, every response
sampled: the sample cost) or `trained` (responses_trained: those that entered an update, fewer
with dynamic sampling, which drops groups whose rewards are all equal; responses_seen for runs
that did not log it). report.md's definitions, the figures' axis labels and the CSVs'
sample_axis column say which. Runs with rollout.dynamic_sampling on ("filtered") and off are
separate configurations and series; the invariance verdict is stated against nominal B and
against effective B (rollout/effective_batch, "not logged" for runs without it).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time

from analysis import figures
from analysis import report_md
from analysis.sections import decision, fitted, questions, rules, staleness, system
from analysis.sections.types import Section
from analysis import study_table
from analysis.runs import AXES, GENERATED

# Every section, most important first; the two marked `lead` (design, questions) are written
# right after the verdict (report_md.write). A section that returns None has nothing to say on
# these runs and is left out (staleness: runs of one rollout.max_staleness).
SECTIONS = (decision.decision, decision.invariance, rules.learning_rate, fitted.critical_batch,
            rules.pairs, system.actor_critic, fitted.compute_curves, system.timing,
            staleness.staleness, decision.design, questions.questions)


def _floats(text: str) -> list[float]:
  try:
    return [float(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas")


def parse(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("dirs", nargs="+", metavar="DIR", help="sweep, study or run directories")
  ap.add_argument("--out", help="output directory (default: DIR/report for one DIR)")
  ap.add_argument("--metric", help="eval metric (default: the runs' target.metric)")
  ap.add_argument("--target", type=float, help="target value (default: the runs' target)")
  ap.add_argument("--targets", type=_floats, help="targets of the critical-batch fit, e.g. "
                  "0.4,0.45,0.5 (default: the target and 0.05 either side)")
  ap.add_argument("--tolerance", type=float, default=0.2,
                  help="a batch is invariant when it needs at most (1 + this) x the reference's "
                  "responses ...")
  ap.add_argument("--band", type=float, default=0.05,
                  help="... and its curve is not below the reference's by more than this")
  ap.add_argument("--reps", type=int, default=2000, help="bootstrap reps of the intervals")
  ap.add_argument("--fit_reps", type=int, default=500,
                  help="bootstrap reps of the fits' intervals (each one a refit)")
  ap.add_argument("--reference_batch", type=int, help="B0 (default: optim.reference_batch)")
  ap.add_argument("--x", choices=sorted(AXES), default=GENERATED,
                  help="the sample axis: responses generated (responses_seen; default) or "
                  "trained (responses_trained)")
  return ap.parse_args(argv)


def _sections(study, table) -> list:
  out, done = [], {}
  for fn in SECTIONS:
    try:
      sec = (fn(study, table, done) if "done" in inspect.signature(fn).parameters
             else fn(study, table))
    except Exception as e:  # noqa: BLE001 - one bad section must not lose the others
      msg = f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"
      print(f"report.py: warning: section {fn.__name__} failed ({msg})", file=sys.stderr)
      sec = Section(fn.__name__.replace("_", " "),
                                    skipped=f"failed to compute ({msg}).")
    done[fn.__name__] = sec
    if sec is not None:
      out.append(sec)
  return out


def main(argv=None) -> int:
  args = parse(argv)
  opts = study_table.Options(metric=args.metric, target=args.target, targets=args.targets,
                             tolerance=args.tolerance, band=args.band, reps=args.reps,
                             fit_reps=args.fit_reps, reference_batch=args.reference_batch,
                             x=args.x)
  if not args.out and len(args.dirs) > 1:
    print("report.py: error: --out is needed with several DIRs", file=sys.stderr)
    return 2
  start = time.time()
  try:
    study = study_table.read_study(args.dirs, opts)
  except study_table.StudyError as e:
    print(f"report.py: error: {e}", file=sys.stderr)
    return 2
  out = args.out or os.path.join(args.dirs[0], "report")
  os.makedirs(out, exist_ok=True)
  table = study_table.config_table(study)
  sections = _sections(study, table)
  for sec in sections:
    for fig in sec.figures:
      figures.save(fig.draw(fig.data), fig.data, out, fig.stem)
  study.runs.drop(columns=["path"]).assign(sample_axis=args.x).to_csv(
      os.path.join(out, "runs.csv"), index=False)
  if not table.empty:
    report_md.interval_columns(table).assign(sample_axis=args.x).to_csv(
        os.path.join(out, "configurations.csv"), index=False)
  path = report_md.write(study, sections, out)
  print(f"wrote {path} ({time.time() - start:.1f} s)", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())

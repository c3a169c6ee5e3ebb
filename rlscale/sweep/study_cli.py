"""`launch/study.py`: run a study's stages in order, then write its report.

    python launch/study.py --study=configs/studies/cpu.py --workdir=runs/study [--parallel=2]

Each stage is a sweep in `<workdir>/<stage>`; `<workdir>/study.json` records the stages' wall
times, the target and what each choosing stage chose; `<workdir>/report/` (or --report_dir)
is analysis/report.py's output over all of them. Run the same command again to continue where it stopped. Exit status as for
launch/sweep.py: 0 done, 1 some point failed, 75 stopped, 2 bad input.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

from absl import flags, logging

from rlscale.run import command_line
from rlscale.config.errors import ConfigError
from rlscale.trainer.preemption import EXIT_REQUEUE

_FLAGS: dict = {}


def define_flags() -> None:
  if _FLAGS:
    return
  _FLAGS.update(
      study=flags.DEFINE_string("study", None, "study file[:arg] declaring stages()"),
      workdir=flags.DEFINE_string("workdir", None, "the study's directory (default: "
                                  "runs/study-<file name>); a sweep directory per stage"),
      parallel=flags.DEFINE_integer("parallel", 1, "points running at once, each on its own "
                                    "devices (CPU cores, GPUs)"),
      vectorize=flags.DEFINE_enum("vectorize", None, ["", "seed", "lanes"], "points side by "
                                  "side in one process (launch/sweep.py --vectorize); default: "
                                  "each stage's own choice"),
      max_lanes=flags.DEFINE_integer("max_lanes", 10, "points per process at most"),
      report=flags.DEFINE_bool("report", True, "write the report at the end "
                               "(analysis/report.py)"),
      report_dir=flags.DEFINE_string("report_dir", None, "where the report goes (default: "
                                     "<workdir>/report), e.g. docs/study; study.json is "
                                     "copied beside it"),
      dry_run=flags.DEFINE_bool("dry_run", False, "list the stages and their points; run "
                                "nothing"),
      run_command=flags.DEFINE_string("run_command", None, "what runs one point, before its "
                                      "flags (default: this Python's `-m rlscale`)"),
      verbose=flags.DEFINE_bool("verbose", False, "on bad input, show the traceback too"))


def report_script() -> str | None:
  """analysis/report.py of the checkout this package runs from (None when installed)."""
  here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  path = os.path.join(here, "analysis", "report.py")
  return path if os.path.exists(path) else None


def dry_run(runner) -> str:
  from rlscale.sweep import points, study
  lines = []
  for s in runner.stages:
    needs = list(study._placeholders(s.config))
    if not needs:
      for o in points.declared_points(s.config, s.sweep):
        needs += [m.group(1) for v in o.values() if isinstance(v, str)
                  for m in [study._REF.match(v)] if m and m.group(1) not in needs]
    if needs:
      what = [{"target": "the target", "seeds": "the power calculation's seeds"}.get(
          k, f"the choice of {k}") for k in needs]
      lines.append(f"{s.name}: sweep {s.sweep} of {s.config} (after {', '.join(what)})"
                   + (f", chooses {s.choose}" + (f" per {', '.join(s.per)}" if s.per else "")
                      if s.choose else ""))
      continue
    pts = points.points(s.config, s.sweep, os.path.join(runner.dir, s.name))
    lines.append(f"{s.name}: sweep {s.sweep} of {s.config}, {len(pts)} points"
                 + (f", chooses {s.choose}" + (f" per {', '.join(s.per)}" if s.per else "")
                    if s.choose else ""))
    lines += [f"  {p.name}" for p in pts]
  return "\n".join(lines)


def run(argv) -> int:
  del argv
  from rlscale.sweep import study
  from rlscale.sweep.study import StudyRunner
  v = {k: holder.value for k, holder in _FLAGS.items()}
  if not v["study"]:
    raise ConfigError("--study is required, e.g. --study=configs/studies/cpu.py")
  if v["parallel"] < 1:
    raise ConfigError(f"--parallel={v['parallel']} must be a positive integer")
  name = os.path.splitext(os.path.basename(v["study"].partition(":")[0]))[0]
  workdir = v["workdir"] or f"runs/study-{name}"
  command = shlex.split(v["run_command"]) if v["run_command"] else None
  runner = StudyRunner(v["study"], workdir, parallel=v["parallel"], command=command,
                       vectorize=v["vectorize"], max_lanes=v["max_lanes"])
  if v["dry_run"]:
    print(dry_run(runner))
    return 0
  t0 = time.time()
  rc = runner.run()
  runner.record["wall_s_last_launch"] = round(time.time() - t0, 1)
  runner.save()
  logging.info("study %s: stages finished with status %d in %.1f min", v["study"], rc,
               (time.time() - t0) / 60)
  if rc == EXIT_REQUEUE or not v["report"]:
    return rc
  script = report_script()
  if script is None:
    logging.warning("no analysis/report.py beside this package: run it from a checkout on %s",
                    workdir)
    return rc
  t1 = time.time()
  out = v["report_dir"] or os.path.join(workdir, "report")
  report = subprocess.run([sys.executable, script, workdir, "--out", out])
  if v["report_dir"] and report.returncode == 0:
    shutil.copy(os.path.join(workdir, study.FILE), os.path.join(out, study.FILE))
  logging.info("report: %s in %.1f s (exit %d)", out, time.time() - t1, report.returncode)
  return rc or (1 if report.returncode else 0)


def main() -> None:
  define_flags()
  command_line.run_app(run)


if __name__ == "__main__":
  main()

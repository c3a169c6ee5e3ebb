"""`launch/study.py`: run a study's stages in order, then write its report.

    python launch/study.py --study=configs/studies/cpu.py --workdir=runs/study [--parallel=2]

Each stage is a sweep in `<workdir>/<stage>`; `<workdir>/study.json` records the stages' wall
times, the target and what each choosing stage chose; `<workdir>/report/` (or --report_dir)
is analysis/report.py's output over all of them. Run the same command again to continue where it stopped. Exit status as for
launch/sweep.py: 0 done, 1 some point failed, 75 stopped, 2 bad input.
"""

from __future__ import annotations

import os
import shutil
import time

from absl import flags, logging

from rlscale.config.errors import ConfigError
from rlscale.study import cli_kit
from rlscale.trainer.preemption import EXIT_REQUEUE

_FLAGS: dict = {}


def define_flags() -> None:
  if _FLAGS:
    return
  _FLAGS.update(
      study=flags.DEFINE_string("study", None, "study file[:arg] declaring stages()"),
      workdir=flags.DEFINE_string("workdir", None, "the study's directory (default: "
                                  "runs/study-<file name>); a sweep directory per stage"),
      vectorize=flags.DEFINE_enum("vectorize", None, ["", "seed", "lanes"], "points side by "
                                  "side in one process (launch/sweep.py --vectorize); default: "
                                  "each stage's own choice"),
      max_lanes=flags.DEFINE_integer("max_lanes", 10, "points per process at most"),
      report_dir=flags.DEFINE_string("report_dir", None, "where the report goes (default: "
                                     "<workdir>/report), e.g. docs/study; study.json is "
                                     "copied beside it"),
      **cli_kit.launch_flags("points"))


def report_script() -> str | None:
  """analysis/report.py of the checkout this package runs from (None when installed)."""
  return cli_kit.checkout_script("analysis", "report.py")


def dry_run(runner) -> str:
  from rlscale.sweep import points
  from rlscale.study import study
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
  from rlscale.study import study
  from rlscale.study.study import StudyRunner
  v = cli_kit.values(_FLAGS)
  if not v["study"]:
    raise ConfigError("--study is required, e.g. --study=configs/studies/cpu.py")
  if v["parallel"] < 1:
    raise ConfigError(f"--parallel={v['parallel']} must be a positive integer")
  name = os.path.splitext(os.path.basename(v["study"].partition(":")[0]))[0]
  workdir = v["workdir"] or f"runs/study-{name}"
  runner = StudyRunner(v["study"], workdir, parallel=v["parallel"],
                       command=cli_kit.run_command(v["run_command"]),
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
  out = v["report_dir"] or os.path.join(workdir, "report")
  report = cli_kit.write_report([script, workdir, "--out", out], out)
  if v["report_dir"] and report == 0:
    shutil.copy(os.path.join(workdir, study.FILE), os.path.join(out, study.FILE))
  return rc or (1 if report else 0)


def main() -> None:
  cli_kit.main(define_flags, run)


if __name__ == "__main__":
  main()

"""`launch/sweep.py` (also `python -m rlscale.sweep`): run a sweep declared beside a config.

    python launch/sweep.py --config=configs/grpo.py:tiny --sweep=batch_invariance \\
        --workdir=runs/bi --launcher=local --parallel=2 [--dry_run] [--only=REGEX]

Each point is a full run in `<workdir>/<point name>`; `<workdir>/sweep.json` records where each
stands. Run the same command again to continue: done points are skipped, preempted and
partial ones resume from their checkpoints, failed ones are retried. The same command run twice
at once shares the points: the second says which the first holds and runs only the rest.
Exit status: 0 when every selected point is done, 75 when the launcher was stopped (runs
saved) or another launcher still runs some of them, 1 when some failed, 2 for bad input
(refused before anything runs, in one line).
"""

from __future__ import annotations

import re
import shlex

from absl import flags, logging

from rlscale.run import command_line
from rlscale.config.errors import ConfigError
from rlscale.trainer.preemption import EXIT_REQUEUE
from rlscale.sweep import launchers
# Their flags; neither imports its cluster's package.
from rlscale.sweep.launchers import slurm, xm  # noqa: F401

LAUNCHERS = launchers.KINDS

_FLAGS: dict = {}  # name -> absl flag holder, defined by main(): rlscale.run.main has --config too


def define_flags() -> None:
  """The command's flags, defined when it runs (not at import: a process that imports both
  this and rlscale.run.main, e.g. a test, would define --config and --workdir twice)."""
  if _FLAGS:
    return
  _FLAGS.update(
      config=flags.DEFINE_string("config", None, "experiment config file[:arg] declaring "
                                 "sweeps()"),
      sweep=flags.DEFINE_string("sweep", None, "the name of one of the config's sweeps"),
      workdir=flags.DEFINE_string("workdir", None, "the sweep's directory (default: "
                                  "runs/<config>-<sweep>); a run directory per point inside"),
      launcher=flags.DEFINE_enum("launcher", "local", LAUNCHERS, "where the points run"),
      parallel=flags.DEFINE_integer("parallel", None, "points running at once (local, xm: "
                                    "each on its own devices, default 1; slurm: the job "
                                    "array's limit, default 0: none)"),
      dry_run=flags.DEFINE_bool("dry_run", False, "print what would run (commands, scripts, "
                                "work units) and run nothing"),
      only=flags.DEFINE_string("only", None, "only the points whose name matches this regex"),
      vectorize=flags.DEFINE_enum("vectorize", "", ["", "seed", "lanes"], "local: run points "
                                  "that differ only in their seed ('seed'), or also in the "
                                  "numbers the compiled programs take as arguments such as the "
                                  "learning rate ('lanes'), side by side in one process"),
      max_lanes=flags.DEFINE_integer("max_lanes", 10, "--vectorize: points per process at most"),
      run_command=flags.DEFINE_string("run_command", None, "what runs one point, before its "
                                      "flags (default: this Python's `-m rlscale`); e.g. a "
                                      "container wrapper"),
      verbose=flags.DEFINE_bool("verbose", False, "on bad input, show the traceback too"))


def default_workdir(config: str, sweep: str) -> str:
  name = re.sub(r"\.py$", "", config.partition(":")[0].rsplit("/", 1)[-1])
  return f"runs/{name}-{sweep}"


def selected_points(config: str, sweep: str, workdir: str, only: str | None):
  """(every point of the sweep, those --only selects)."""
  from rlscale.sweep import points
  pts = points.points(config, sweep, workdir)
  if not only:
    return pts, pts
  try:
    pattern = re.compile(only)
  except re.error as e:
    raise ConfigError(f"--only={only!r} is not a regular expression: {e}") from e
  chosen = [p for p in pts if pattern.search(p.name)]
  if not chosen:
    raise ConfigError(f"--only={only!r} matches no point of sweep {sweep}")
  return pts, chosen


def launcher(kind: str, config: str, m, pts, parallel: int):
  """The launcher object of `kind` (launchers.make) with this command's flags."""
  text = _FLAGS["run_command"].value
  return launchers.make(kind, config, m, pts, parallel, shlex.split(text) if text else None,
                        _FLAGS["vectorize"].value, _FLAGS["max_lanes"].value)


def run(argv) -> int:
  del argv
  from rlscale.sweep import manifest as mf
  v = {k: holder.value for k, holder in _FLAGS.items()}
  if not v["config"] or not v["sweep"]:
    raise ConfigError("--config and --sweep are required, e.g. --config=configs/grpo.py:tiny "
                      "--sweep=batch_invariance")
  parallel = v["parallel"]
  if parallel is None:
    parallel = 0 if v["launcher"] == "slurm" else 1
  if parallel < 0 or (v["launcher"] != "slurm" and parallel < 1):
    raise ConfigError(f"--parallel={parallel} must be a positive integer"
                      + (" (or 0: no limit)" if v["launcher"] == "slurm" else ""))
  workdir = v["workdir"] or default_workdir(v["config"], v["sweep"])
  every, pts = selected_points(v["config"], v["sweep"], workdir, v["only"])
  if v["dry_run"]:
    m = mf.Manifest(v["sweep"], v["config"], v["launcher"], workdir)
    m.points = [mf.Entry(p.name, p.overrides, p.run_dir) for p in pts]
    print(launcher(v["launcher"], v["config"], m, pts, parallel).dry_run())
    return 0
  m = mf.open_sweep(workdir, v["sweep"], v["config"], v["launcher"], every,
                   {p.name for p in pts} if v["only"] else None)
  runner = launcher(v["launcher"], v["config"], m, pts, parallel)  # may refuse: no manifest
  m.save()
  logging.info("sweep %s of %s: %d points in %s (%d done), launcher %s", m.sweep, m.config,
               len(pts), workdir, m.counts()[mf.DONE], m.launcher)
  counts = runner.run()
  if counts[mf.FAILED]:
    for e in m.points:
      if e.status == mf.FAILED and m.mine(e):
        logging.error("failed: %s: %s", e.name, e.error[0] if e.error else "")
    return 1
  # Running at the end (not on Slurm, where it means queued): another launcher runs them.
  if counts[mf.PREEMPTED] or (m.launcher != "slurm" and (counts[mf.PENDING] or
                                                         counts[mf.RUNNING])):
    return EXIT_REQUEUE
  return 0


def main() -> None:
  define_flags()
  command_line.run_app(run)


if __name__ == "__main__":
  main()

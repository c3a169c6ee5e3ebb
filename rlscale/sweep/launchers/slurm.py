"""Run a sweep's points on Slurm: one job array of generated sbatch scripts, then return.

Why generated scripts and not submitit: the script is the whole story, a file a user can read,
edit and `sbatch` by hand; `--dry_run` prints exactly what is submitted; nothing is pickled
(a point is a shell command, so a job does not need this Python's exact environment to unpickle
a callable); and sbatch, srun, squeue, sacct and scontrol are easy to fake offline
(tests/support/fake_slurm/), so the whole path is tested on a laptop.

What is submitted, in `<sweep dir>/slurm/`:
  base-<recipe>.sh  one single-task job per base policy the points need that is not built yet
                    (`--base_policy_only`), submitted first;
  points-<n>.sh     one array over the points neither done nor queued (`--array=0,2,5%N`,
                    N = --parallel), `--dependency=afterok:<base jobs>`. Task i runs point i of
                    the manifest with srun on nodes x tasks_per_node processes, which start
                    jax.distributed from Slurm's variables; its output is appended to the
                    point's launch.log. Task ids stay below the cluster's MaxArraySize
                    (`scontrol show config`; Slurm's default 1001 when it does not say): a
                    sweep with more points is several arrays, the k-th running points
                    k*MaxArraySize + task id and, with --parallel, waiting for the one before
                    (afterany) so that N stays the limit on points at once.
Preemption: `--signal=USR2@<signal_seconds>` reaches the runs (not the batch shell) before the
time limit; a run saves its step and exits 75 (as on SIGTERM), and the task requeues itself
(`scontrol requeue`), so it resumes from its checkpoint. `--requeue` lets Slurm requeue it after
a preemption or a node failure too.

`run()` submits and returns; sweep.json records each point's job (`<array job>_<task>`). Run the
same command again to see where they stand (squeue for live jobs, sacct for finished ones):
queued or running jobs are left alone, points that failed or were preempted are submitted again
(resuming their checkpoints), done points are skipped. The settings and their checks are in
slurm_settings.py, what squeue and sacct say in slurm_queue.py. Two launches at once never
submit a point twice: each submits only points it has claimed in the sweep's folder
(manifest.Claims), and reads what the other recorded before it looks at the queue.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time

from absl import logging

from rlscale.config.errors import ConfigError
from rlscale.run import supervise
from rlscale.trainer.preemption import EXIT_REQUEUE
from rlscale.sweep import manifest as mf
from rlscale.sweep.points import Point
from rlscale.sweep.launchers.slurm_queue import QUEUED, JobState, array_spec, job_states, max_array_size
from rlscale.sweep.launchers.slurm_settings import check, current_settings

# After the first process of a point ends, the others get this long to end too (finish a save)
# before srun stops them: a process left alone in a collective would hold the nodes until the
# time limit.
SRUN_WAIT_S = 300
_JOB = re.compile(r"\d+_\d+")  # what this launcher records: <array job>_<task>


def _points(n: int) -> str:
  return f"{n} point" + "s" * (n != 1)


def _base_built(key: str) -> bool:
  from rlscale.trainer import sft_trainer as sft
  return os.path.exists(os.path.join(key, "policy", sft.DONE))


class SlurmLauncher:
  """Submits the not-done points of a manifest as one job array; `command` replaces
  `python -m rlscale`; `settings` the --slurm config (its fields: slurm_config.py)."""

  def __init__(self, config: str, m: mf.Manifest, points: list[Point], parallel: int = 0,
               command: list[str] | None = None, settings=None):
    self.config, self.m, self.parallel = config, m, parallel
    self.points = {p.name: p for p in points}
    self.command = command or ["python", "-m", "rlscale"]
    self.s = settings if settings is not None else current_settings()
    check(self.s)
    self.dir = os.path.join(m.sweep_dir, "slurm")
    self.max_array_size: int | None = None  # the cluster's, asked once

  # --- the scripts ---

  def _argv(self, p: Point) -> list[str]:
    return [*self.command, f"--config={self.config}", f"--workdir={p.run_dir}",
            *p.config_args()]

  def _directives(self, suffix: str, output: str, nodes: int, tasks: int,
                  cpus: int) -> list[str]:
    s = self.s
    lines = [f"--job-name={s.job_name or 'rlscale-' + self.m.sweep}{suffix}", f"--nodes={nodes}",
             f"--ntasks-per-node={tasks}"]
    if s.gpus_per_node:
      lines.append(f"--gpus-per-node={s.gpus_per_node}")
    if cpus:
      lines.append(f"--cpus-per-task={cpus}")
    lines += [f"--{k}={s[k]}" for k in ("mem", "partition", "time", "account", "qos",
                                        "constraint") if s[k]]
    if s.signal_seconds:
      lines.append(f"--signal=USR2@{s.signal_seconds}")  # no B:, so srun's tasks get it
    lines += ["--requeue", "--open-mode=append", f"--output={output}",
              f"--chdir={os.getcwd()}"]
    lines += shlex.split(s.sbatch_args)
    return ["#SBATCH " + line for line in lines]

  def _launch(self, job: str, nodes: int, tasks_per_node: int) -> list[str]:
    """Start the point's processes with srun, and requeue the job when the run exits 75."""
    s, lines = self.s, []
    lines.append("# jax.distributed finds its processes in Slurm's variables, not these:")
    lines.append("unset JAX_COORDINATOR_ADDRESS JAX_NUM_PROCESSES JAX_PROCESS_ID")
    if s.gpus_per_node and tasks_per_node == 1:
      ids = ",".join(map(str, range(s.gpus_per_node)))
      lines.append(f"export JAX_LOCAL_DEVICE_IDS={ids}  # one process drives all its node's GPUs")
    elif s.gpus_per_node:
      lines.append("# one process per GPU: jax.distributed gives each GPU $SLURM_LOCALID")
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes * tasks_per_node}",
            f"--ntasks-per-node={tasks_per_node}", f"--wait={SRUN_WAIT_S}",
            *shlex.split(s.srun_args)]
    several = nodes * tasks_per_node > 1
    lines += [
        "export PYTHONUNBUFFERED=1",
        "# A SIGTERM (preemption, the time limit) reaches the runs too: wait for their save.",
        "trap 'echo \"# SIGTERM: the run saves its step and exits 75\"' TERM"]
    if several:  # srun returns the highest task status: a killed task's 137 hides the others' 75
      lines += ["# each process writes its exit status here (a lost process: the others 75)",
                f'export {supervise.EXIT_DIR_ENV}="$run_dir/.task_exit"',
                f'rm -rf "${supervise.EXIT_DIR_ENV}"']
    lines += [shlex.join(srun) + ' "${argv[@]}"', "rc=$?"]
    if several:
      lines.append(f'if grep -qsx {EXIT_REQUEUE} "${supervise.EXIT_DIR_ENV}"/*; then '
                   f'rc={EXIT_REQUEUE}; fi')
    lines += [
        f'if [ "$rc" -eq {EXIT_REQUEUE} ]; then',
        f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -lt {s.max_requeues} ]; then',
        f'    echo "# preempted (exit {EXIT_REQUEUE}): requeueing {job}; it resumes from its '
        'checkpoint"',
        f'    scontrol requeue "{job}"',
        "  else",
        f'    echo "# preempted after {s.max_requeues} requeues; run the sweep again to resume"',
        "  fi",
        "fi",
        'exit "$rc"']
    return lines

  def _setup(self) -> list[str]:
    return ["# setup (--slurm.setup)", *self.s.setup.strip().splitlines()] if \
        self.s.setup.strip() else []

  def _index(self) -> dict[str, int]:
    return {e.name: i for i, e in enumerate(self.m.points)}

  def arrays(self, entries: list[mf.Entry]) -> list[tuple[int, list[mf.Entry]]]:
    """The entries as job arrays the cluster takes: [(offset, entries)], task id = a point's
    index in the manifest - offset, below MaxArraySize."""
    if self.max_array_size is None:
      self.max_array_size = max_array_size()
    size, index = self.max_array_size, self._index()
    out: dict[int, list[mf.Entry]] = {}
    for e in entries:
      out.setdefault(index[e.name] // size * size, []).append(e)
    return sorted(out.items())

  def array_script(self, entries: list[mf.Entry], name: str, offset: int = 0) -> str:
    s = self.s
    index = self._index()
    indices = [index[e.name] - offset for e in entries]
    out = os.path.join(os.path.abspath(self.dir), f"{name}-%A_%a.out")
    lines = ["#!/bin/bash",
             f"# Sweep {self.m.sweep} of {self.config}: {_points(len(entries))} as one job array",
             "# (rlscale/sweep/launchers/slurm.py). Task i runs point i below with srun, its output in",
             *([f"# (point i is point {offset} + i of the sweep: task ids stay below the "
                "cluster's MaxArraySize.)"] if offset else []),
             "# <run dir>/launch.log. A run that exits 75 (SIGUSR2 before the time limit, or",
             "# preempted) saved its step: the task requeues itself and resumes from there.",
             f"#SBATCH --array={array_spec(indices, self.parallel)}",
             *self._directives("", out, s.nodes, s.tasks_per_node, s.cpus_per_task),
             "#SBATCH --kill-on-invalid-dep=yes", "",
             'case "$SLURM_ARRAY_TASK_ID" in']
    for i, e in zip(indices, entries):
      p = self.points[e.name]
      lines += [f"  {i}) run_dir={shlex.quote(p.run_dir)}",
                f"     argv=({shlex.join(self._argv(p))}) ;;"]
    lines += ['  *) echo "error: array task $SLURM_ARRAY_TASK_ID is no point of this script" >&2',
              "     exit 2 ;;", "esac",
              'mkdir -p "$run_dir"',
              'exec >>"$run_dir/launch.log" 2>&1',
              'echo "# $(date \'+%Y-%m-%d %H:%M:%S\') slurm job ${SLURM_ARRAY_JOB_ID}_'
              '${SLURM_ARRAY_TASK_ID} on ${SLURM_JOB_NODELIST:-?}, restart '
              '${SLURM_RESTART_COUNT:-0}: ${argv[*]}"',
              *self._setup(),
              *self._launch("${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}", s.nodes,
                            s.tasks_per_node)]
    return "\n".join(lines) + "\n"

  def base_script(self, key: str, p: Point) -> str:
    """One process on one node builds the base policy (all the node's GPUs and cores)."""
    s = self.s
    log = os.path.abspath(self._base_log(key))
    lines = ["#!/bin/bash",
             f"# The base policy of sweep {self.m.sweep} of {self.config}, built once before",
             "# its points, whose job array waits for this job (rlscale/sweep/launchers/slurm.py):",
             f"# {key}",
             *self._directives("-base", log, 1, 1, s.cpus_per_task * s.tasks_per_node), "",
             f"argv=({shlex.join(self._argv(p) + ['--base_policy_only'])})",
             'echo "# $(date \'+%Y-%m-%d %H:%M:%S\') slurm job $SLURM_JOB_ID on '
             '${SLURM_JOB_NODELIST:-?}: ${argv[*]}"',
             *self._setup(), *self._launch("$SLURM_JOB_ID", 1, 1)]
    return "\n".join(lines) + "\n"

  def _base_log(self, key: str) -> str:
    return os.path.join(self.dir, f"base-{os.path.basename(key)}.log")

  def _base_groups(self, entries: list[mf.Entry], built=None) -> dict[str, Point]:
    """Each base policy the entries' points need and that is not built: key -> a point."""
    from rlscale.sweep.points import base_key
    built = built or _base_built
    groups: dict[str, Point] = {}
    for e in entries:
      key = base_key(self.config, self.points[e.name])
      if key and key not in groups and not built(key):
        groups[key] = self.points[e.name]
    return groups

  def dry_run(self) -> str:
    """Each script as it would be submitted, after the sbatch command that submits it."""
    entries = [e for e in self.m.points if e.name in self.points]
    out, deps = [], []
    for n, (key, p) in enumerate(self._base_groups(entries, built=lambda k: False).items()):
      path = os.path.join(self.dir, f"base-{os.path.basename(key)}.sh")
      out.append(f"# sbatch --parsable {path}\n{self.base_script(key, p)}")
      deps.append(f"<base job {n + 1}>")
    for k, (offset, chunk) in enumerate(self.arrays(entries)):
      name = f"points-{k + 1}"
      dep = self._dependency(deps, f"<array {k}>" if k else None)
      dep = f"--dependency={dep} " if dep else ""
      out.append(f"# sbatch --parsable {dep}{os.path.join(self.dir, name + '.sh')}\n"
                 f"{self.array_script(chunk, name, offset)}")
    return "\n".join(out) + (f"# {_points(len(entries))}; a launch leaves out those done or "
                             "queued (sweep.json) and base policies already built")

  def _dependency(self, base_jobs: list[str], previous: str | None) -> str:
    """--dependency: the base policies built (afterok); with --parallel, the array before
    ended (afterany), so that no more than --parallel points run at once."""
    parts = [f"afterok:{':'.join(base_jobs)}"] if base_jobs else []
    if previous and self.parallel:
      parts.append(f"afterany:{previous}")
    return ",".join(parts)

  # --- submitting and following ---

  def _sbatch(self, script: str, path: str, dependency: str = "") -> str:
    with open(path, "w") as f:
      f.write(script)
    argv = ["sbatch", "--parsable"]
    if dependency:
      argv.append("--dependency=" + dependency)
    argv.append(path)
    out = subprocess.run(argv, capture_output=True, text=True)
    lines = out.stdout.strip().splitlines()
    if out.returncode or not lines or not lines[-1].split(";")[0].isdigit():
      why = (out.stderr.strip() or out.stdout.strip()).splitlines()
      raise ConfigError(f"{shlex.join(argv)} failed (exit {out.returncode}): "
                        f"{why[-1] if why else 'no job id'}")
    return lines[-1].split(";")[0]

  def refresh(self, lost: str | None = mf.PENDING) -> None:
    """Each point's status from its job's state. A job Slurm no longer knows of gets `lost`
    (None: keep the status; right after a submission accounting may not list it yet). Points
    another launcher holds are its to follow."""
    live = [e for e in self.m.points if e.job_id and e.status != mf.DONE and self.m.writes(e)]
    ours = [e.job_id for e in live if _JOB.fullmatch(e.job_id)]  # not a local launcher's pid
    states = job_states(ours) if ours else {}
    for e in live:
      self._update(e, states.get(e.job_id), lost)

  def _update(self, e: mf.Entry, st: JobState | None, lost: str | None) -> None:
    if st is not None:
      e.returncode = st.returncode if st.returncode is not None else e.returncode
      e.duration_s = st.elapsed_s if st.elapsed_s is not None else e.duration_s
    log = mf.log_path(e.run_dir)
    if mf.run_done(e.run_dir):
      e.status, e.error = mf.DONE, []
    elif st is None:
      if lost and e.status == mf.RUNNING:
        logging.warning("sweep: slurm knows no job %s (point %s); it is submitted again",
                        e.job_id, e.name)
        e.status = lost
    elif st.state in QUEUED:
      e.status = mf.RUNNING
    elif st.state == "PREEMPTED" or st.returncode == EXIT_REQUEUE:
      e.status, e.error = mf.PREEMPTED, []
    else:
      e.status = mf.FAILED
      why = (f"slurm job {e.job_id} {st.state}"
             + (f" (exit {st.returncode})" if st.returncode else ""))
      if st.state == "COMPLETED":
        why += " without writing summary.json"
      if os.path.exists(log):
        e.error = [f"{why}; {log}:"] + mf.tail(log)
      else:
        e.error = [f"{why} before its run started" + self._base_hint(e)]

  def _base_hint(self, e: mf.Entry) -> str:
    from rlscale.sweep.points import base_key
    key = base_key(self.config, self.points[e.name]) if e.name in self.points else None
    return f" (did its base policy fail? {self._base_log(key)})" if key else ""

  def run(self) -> dict[str, int]:
    """Submit every point that is neither done nor queued; the manifest's counts after."""
    if not shutil.which("sbatch"):
      raise ConfigError("--launcher=slurm: sbatch is not on PATH; launch from a Slurm login node "
                        "(or see the scripts with --dry_run)")
    try:
      return self._submit()
    finally:
      self.m.close()

  def _submit(self) -> dict[str, int]:
    names = [e.name for e in self.m.points if e.name in self.points and e.status != mf.DONE]
    mine = set(self.m.claim(names, adopt_runs=True))  # what another launch submitted, as it is
    self.refresh()
    todo = [e for e in self.m.points
            if e.name in mine and e.status not in (mf.DONE, mf.RUNNING)]
    for e in todo:
      if e.status == mf.FAILED:
        logging.info("sweep: retrying %s, which failed: %s", e.name, e.error[0] if e.error else "")
    if not todo:
      self.m.save()
      c = self.m.counts()
      theirs = f", {len(self.m.theirs)} another launcher's" if self.m.theirs else ""
      print(f"sweep {self.m.sweep}: nothing to submit ({c[mf.DONE]} done, {c[mf.RUNNING]} "
            f"queued or running{theirs}, see {self.m.path})")
      return c
    os.makedirs(self.dir, exist_ok=True)
    base_jobs = []
    for key, p in self._base_groups(todo).items():
      path = os.path.join(self.dir, f"base-{os.path.basename(key)}.sh")
      base_jobs.append(self._sbatch(self.base_script(key, p), path))
      print(f"sweep {self.m.sweep}: base policy {key}: job {base_jobs[-1]} ({path}, log "
            f"{self._base_log(key)})")
    n = 1 + sum(bool(re.fullmatch(r"points-\d+\.sh", f)) for f in os.listdir(self.dir))
    index, arrays, paths = self._index(), [], []
    for k, (offset, chunk) in enumerate(self.arrays(todo)):
      paths.append(os.path.join(self.dir, f"points-{n + k}.sh"))
      arrays.append(self._sbatch(self.array_script(chunk, f"points-{n + k}", offset), paths[-1],
                                 self._dependency(base_jobs, arrays[-1] if arrays else None)))
      for e in chunk:
        e.status, e.job_id, e.started = mf.RUNNING, f"{arrays[-1]}_{index[e.name] - offset}", \
            time.time()
        e.attempts, e.returncode, e.duration_s, e.error = e.attempts + 1, None, None, []
      self.m.save(chunk)  # at once: a later sbatch that fails leaves these recorded
    self.refresh(lost=None)  # a job that failed at once (or a fake Slurm that ran it) shows now
    self.m.save()
    after = f", after base policy job {','.join(base_jobs)}" if base_jobs else ""
    where = (f"job array {arrays[0]} ({paths[0]})" if len(arrays) == 1 else
             f"{len(arrays)} job arrays {', '.join(arrays)} ({', '.join(paths)}; task ids stay "
             f"below MaxArraySize{', one array after another' if self.parallel else ''})")
    jobs = ",".join(arrays)
    print(f"sweep {self.m.sweep}: submitted {_points(len(todo))} as {where}{after}\n"
          f"  watch: squeue -j {jobs}; sacct -j {jobs}; tail -f <point>/launch.log\n"
          f"  run the same command again to update {self.m.path} and resubmit what failed or "
          "was preempted")
    return self.m.counts()

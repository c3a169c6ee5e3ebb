"""Run a sweep's points through XManager: one experiment, a work unit per point (`--launcher=xm`).

Why XManager at all, when launcher=local does the same on this machine: the experiment and its
work units are what XManager's tools list and compare, and the jobs come from one pure function,
`jobs()`, whose output an `xm_local.Vertex` or community (xm-slurm) executor accepts as well.

What runs here is XManager's local executor, without Docker: each work unit is
`/bin/sh -c <WRAPPER> <command> --config=... --workdir=<point> --config.x=y`; the wrapper appends
the output to `<point>/launch.log` and `exec`s the run, whose exit status is the unit's. The base
policies are built first, each once, as work units of the same experiment with all devices; then
at most --parallel points run at once, each with its own GPUs (CUDA_VISIBLE_DEVICES) or, on CPU,
its own cores (taskset). sweep.json records each point's work unit as `<experiment id>/<work unit
id>` and its status as the unit ends. A failed point never stops the others; run the command
again to skip done points and retry the rest (partial ones resume from their checkpoints).
A point starts only once this launcher has claimed it in the sweep's folder (manifest.Claims):
two launches of one sweep share its points and never run one twice at once.

On SIGINT or SIGTERM the launcher sends SIGTERM to each unit's process group (xm_local starts the
unit's `sh -c` in a session of its own, and a shell does not pass signals on): the runs save, the
launcher waits for their workdir locks and exits 75. A second signal kills them.

XManager keeps a database of experiments; unless --xm_db_yaml_config_path names one, it is
`<sweep dir>/xm/experiments.sqlite3`, so a sweep writes nothing under HOME.

Not covered: if this launcher is killed outright (SIGKILL), its runs go on to their end (the
local launcher's runs get SIGTERM from the kernel); a re-run waits for their workdir locks. On
Vertex AI the points would run from a container, with the sweep directory on a bucket both
sides mount (/gcs/<bucket>) -- see the README; that path is not tested here.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sys
import time

from absl import flags, logging

from rlscale.run import workdir_lock
from rlscale.config.errors import ConfigError
from rlscale.sweep.launchers import local
from rlscale.sweep import manifest as mf
from rlscale.sweep.points import Point, base_key

try:  # XManager's own --xm_* flags (its database, ...), when it is installed
  from xmanager import xm_flags as _xm_flags  # noqa: F401
except ImportError:
  _xm_flags = None

INSTALL = "--launcher=xm needs the xmanager package: pip install 'rlscale[xm]'"
LOG_VAR, CORES_VAR = "RLSCALE_SWEEP_LOG", "RLSCALE_SWEEP_CORES"
# xm_local runs it through `sh -c`; `exec`: the run's exit status is the unit's.
WRAPPER = (f'log="${LOG_VAR}"; mkdir -p "${{log%/*}}" && '
           f'printf "\\n# %s %s\\n" "$(date "+%Y-%m-%d %H:%M:%S")" "$*" >> "$log" || exit 1; '
           f'if [ -n "${CORES_VAR}" ] && command -v taskset >/dev/null; then '
           f'set -- taskset -c "${CORES_VAR}" "$@"; fi; '
           'exec "$@" >> "$log" 2>&1')


def require() -> None:
  try:
    import xmanager  # noqa: F401
  except ImportError as e:
    raise ConfigError(INSTALL) from e


def argv(config: str, p: Point, command: list[str], base: bool = False) -> list[str]:
  """The point's run (or its base policy's build): `command --config --workdir --config.x=y`."""
  return [*command, f"--config={config}", f"--workdir={p.run_dir}", *p.config_args(),
          *(["--base_policy_only"] if base else [])]


def job(executable, executor, args: list[str], log: str | None = None,
        slot: dict | None = None):
  """An xm.Job; `log` and `slot` ({"gpus"|"cores": [...]}) only mean something to WRAPPER."""
  from xmanager import xm
  env = {LOG_VAR: log} if log else {}
  if slot and "gpus" in slot:
    env["CUDA_VISIBLE_DEVICES"] = ",".join(slot["gpus"])
  if slot and "cores" in slot:
    env[CORES_VAR] = ",".join(map(str, slot["cores"]))
  return xm.Job(executable, executor, args=list(args), env_vars=env)


def jobs(config: str, pts: list[Point], command: list[str], executable, executor,
         logs: bool = True) -> dict[str, object]:
  """{point name: xm.Job} of each point, for any executor: with `logs`, for WRAPPER's output
  redirection; a container whose entrypoint is `python -m rlscale` takes command=[]."""
  return {p.name: job(executable, executor, argv(config, p, command),
                      mf.log_path(p.run_dir) if logs else None) for p in pts}


def packageable():
  """The local executor's one executable: WRAPPER (the points differ only in their job args)."""
  from xmanager import xm, xm_local
  return xm.binary(path="/bin/sh", args=["-c", WRAPPER, "rlscale-point"],
                   executor_spec=xm_local.LocalSpec())


def executor():
  from xmanager import xm_local
  return xm_local.Local(experimental_stream_output=False)  # the output is in launch.log


def use_sweep_database(sweep_dir: str) -> None:
  """XManager's database in the sweep directory, unless --xm_db_yaml_config_path names one
  (xm_local's default, ~/.xmanager, would tie a sweep to HOME)."""
  if flags.FLAGS.xm_db_yaml_config_path:
    return
  folder = os.path.join(os.path.abspath(sweep_dir), "xm")
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, "db.yaml")
  settings = {"backend": "sqlite", "db_name": os.path.join(folder, "experiments.sqlite3")}
  with open(path, "w") as f:  # JSON is YAML
    json.dump({"sql_connector": "sqlite", "sql_connection_settings": settings}, f)
  flags.FLAGS.xm_db_yaml_config_path = path


class _AllEnded(Exception):
  """Leaves the experiment with every unit ended and recorded: xm_local then neither waits for
  its jobs again nor logs their failures as tracebacks (it does both on a normal exit)."""


def _forget_ended_jobs() -> None:
  """xm_local's exit hook says it terminates every job it ever started, 'that may still be
  running': a false alarm once all have ended."""
  from xmanager.xm_local import execution
  jobs = getattr(execution, "_local_jobs", [])
  jobs[:] = [j for j in jobs if getattr(getattr(j, "process", None), "returncode", 0) is None]


def _built(base: str) -> bool:
  from rlscale.trainer import sft_trainer as sft
  return os.path.exists(os.path.join(base, "policy", sft.DONE))


def _processes(unit) -> list:
  """The local processes of a work unit (xm_local keeps them private; its stop() does not
  reach them): to signal them and read their exit status."""
  handles = getattr(unit, "_local_execution_handles", [])
  return [h.process for h in handles if getattr(h, "process", None) is not None]


def _returncode(unit, error) -> int:
  procs = _processes(unit)
  if procs and procs[0].returncode is not None:
    return procs[0].returncode
  return 1 if error else 0


class XMLauncher:
  """Runs the not-done points of a manifest as work units of one XManager experiment."""

  def __init__(self, config: str, m: mf.Manifest, points: list[Point], parallel: int = 1,
               command: list[str] | None = None, slots: list[dict] | None = None,
               poll: float = 0.5):
    require()
    self.config, self.m, self.parallel, self.poll = config, m, parallel, poll
    self.points = {p.name: p for p in points}
    self.command = command or [sys.executable, "-m", "rlscale"]
    try:
      self.slots = slots or local.device_slots(parallel)
    except ValueError as e:
      raise ConfigError(str(e)) from e
    self.title = f"{m.sweep} ({os.path.abspath(m.sweep_dir)})"
    self.running: dict[str, object] = {}  # name -> work unit
    self.durations: list[float] = []
    self.stopping = False
    self.t0 = time.time()
    self.ended = False  # every unit added has ended

  def _bases(self, todo: list[Point], built: bool = False) -> dict[str, list[Point]]:
    """{base policy folder: its points} of the base policies `todo` needs (`built`: also those
    built already)."""
    groups: dict[str, list[Point]] = {}
    for p in todo:
      key = base_key(self.config, p)
      if key and (built or not _built(key)):
        groups.setdefault(key, []).append(p)
    return groups

  def _base_log(self, key: str) -> str:
    return os.path.join(self.m.sweep_dir, "base-" + os.path.basename(key) + ".log")

  def dry_run(self) -> str:
    """Each work unit's job: the base policies' builds first, then one line per point."""
    from xmanager import xm

    def line(j) -> str:
      env = {k: v for k, v in j.env_vars.items() if k != LOG_VAR}
      args = shlex.join(j.args.to_list(xm.utils.ARGV_ESCAPER))
      return " ".join([*(f"{k}={v}" for k, v in env.items()), args,
                       ">>", shlex.quote(j.env_vars[LOG_VAR])])
    pts = [self.points[e.name] for e in self.m.points]
    lines = [f"# XManager experiment {self.title!r}, local executor: a work unit per line"]
    for key, group in self._bases(pts, built=True).items():
      build = job(None, None, argv(self.config, group[0], self.command, base=True),
                  self._base_log(key))
      lines += [f"# base policy {key} of {len(group)} points: built already"] if _built(key) \
          else [f"# base policy {key}, built once before its {len(group)} points", line(build)]
    lines += [line(j) for j in jobs(self.config, pts, self.command, None, None).values()]
    slots = ", ".join(" ".join(f"{k}={','.join(map(str, v))}" for k, v in s.items())
                      for s in self.slots)
    return "\n".join(lines + [f"# {len(pts)} points, {self.parallel} at a time on: {slots}"])

  def run(self) -> dict[str, int]:
    """Run every point that is not done; the manifest's counts at the end."""
    use_sweep_database(self.m.sweep_dir)
    try:
      asyncio.run(self._run())
    finally:
      self.m.close()
    return self.m.counts()

  async def _flush(self) -> None:
    """sweep.json takes in the journal's changes while the units run (manifest.flush)."""
    while True:
      self.m.flush()
      await asyncio.sleep(1.0)

  async def _run(self) -> None:
    from xmanager import xm_local
    todo = [self.points[e.name] for e in self.m.begin(self.points)]
    if not todo:
      return
    loop = asyncio.get_running_loop()
    for s in (signal.SIGINT, signal.SIGTERM):
      loop.add_signal_handler(s, self._stop, s)
    try:
      async with xm_local.create_experiment(experiment_title=self.title) as experiment:
        [executable] = experiment.package([packageable()])
        failed = await self._build_bases(experiment, executable, todo)
        queue = [p for p in todo if p.name not in failed]
        flusher = asyncio.get_running_loop().create_task(self._flush())
        try:
          await asyncio.gather(*(self._worker(experiment, executable, queue, slot)
                                 for slot in range(len(self.slots))))
        finally:
          flusher.cancel()
        self.ended = True
        raise _AllEnded
    except Exception:  # _AllEnded, or xm_local re-raising a unit that failed to start (recorded)
      if not self.ended:
        raise
    finally:
      for s in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(s)
      _forget_ended_jobs()

  async def _wait(self, name: str, unit, run_dir: str | None = None) -> int:
    """The exit status of `unit` once it ends (signals reach it meanwhile, see _stop). When
    stopping, xm_local's shell dies at once and the run saves on: wait for its workdir lock."""
    from xmanager import xm
    self.running[name] = unit
    error = None
    try:
      try:
        await unit.wait_until_complete()
      except xm.ExperimentUnitError as e:
        error = e
      while self.stopping and run_dir and workdir_lock.in_use(run_dir):
        await asyncio.sleep(self.poll)
    finally:
      del self.running[name]
    return _returncode(unit, error)

  async def _build_bases(self, experiment, executable, todo: list[Point]) -> set[str]:
    """Build each distinct base policy once, one after another with all devices; the names of
    the points whose base failed (marked failed with its log's last lines)."""
    failed = set()
    for key, group in self._bases(todo).items():
      if self.stopping:
        break
      log = self._base_log(key)
      logging.info("sweep: building the base policy %s for %d points (log %s)", key,
                   len(group), log)
      j = job(executable, executor(), argv(self.config, group[0], self.command, base=True), log)
      rc = await self._wait("base:" + key, await experiment.add(j))
      if rc != 0 and not self.stopping:
        error = [f"building the base policy {key} failed (exit {rc}); {log}:"] + mf.tail(log)
        entries = [self.m.entry(n) for n in self.m.claim([p.name for p in group])]
        for e in entries:
          e.status, e.error = mf.FAILED, error
          failed.add(e.name)
        self.m.save(entries)
    return failed

  async def _worker(self, experiment, executable, queue: list[Point], slot: int) -> None:
    """Runs points from `queue` on devices `slot`, one at a time, until none is left."""
    while queue and not self.stopping:
      p = queue.pop(0)
      while workdir_lock.in_use(p.run_dir) and not self.stopping:  # an earlier run still saving
        await asyncio.sleep(self.poll)
      if self.stopping:
        return
      if not self.m.claim([p.name]):  # another launcher holds it, or ran it meanwhile
        continue
      e = self.m.entry(p.name)
      e.status, e.started, e.returncode, e.error = mf.RUNNING, time.time(), None, []
      e.attempts += 1
      j = job(executable, executor(), argv(self.config, p, self.command),
              mf.log_path(p.run_dir), self.slots[slot])
      try:
        unit = await experiment.add(j)
      except Exception as err:  # it could not start (e.g. no such command): this point fails
        e.error = [f"could not start the work unit: {type(err).__name__}: {err}"]
        self._finish(e, None)
        continue
      e.job_id = f"{experiment.experiment_id}/{unit.work_unit_id}"
      self.m.save([e])
      rc = await self._wait(p.name, unit, p.run_dir)
      self._finish(e, rc)

  def _finish(self, e: mf.Entry, rc: int | None) -> None:
    mf.finish(e, rc, self.stopping)
    if e.status == mf.DONE:
      self.durations.append(e.duration_s)
    self.m.save([e])
    logging.info("%s", mf.progress_line(self.m, self.t0, self.durations, self.parallel))

  def _stop(self, signum: int) -> None:
    """First signal: SIGTERM to the runs (they save and exit 75), start nothing more; a second:
    SIGKILL, without waiting for the saves."""
    again, self.stopping = self.stopping, True
    logging.warning("sweep: signal %d: %s %d runs", signum,
                    "killing" if again else "asking to save and stop (again to kill)",
                    len(self.running))
    for unit in list(self.running.values()):
      for proc in _processes(unit):
        try:  # the group: the unit's `sh -c` and the run
          os.killpg(proc.pid, signal.SIGKILL if again else signal.SIGTERM)
        except ProcessLookupError:
          pass

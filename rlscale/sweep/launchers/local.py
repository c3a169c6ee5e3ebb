"""Run a sweep's points on this machine, N at a time, each on its own devices.

Every point is a child process (`python -m rlscale --config=... --workdir=<point> --config.x=y`)
whose output goes to `<point>/launch.log`. The base policies the points start from are built
first, one per distinct recipe, with all devices. Then N points run at once: with GPUs, each
gets its own `CUDA_VISIBLE_DEVICES`; on CPU, its own set of cores (sched_setaffinity).

Nothing is lost when the launcher stops: on SIGINT or SIGTERM it passes SIGTERM to its runs,
which save the step in flight and exit 75 (preempted); if the launcher is killed outright, the
kernel sends them SIGTERM (PR_SET_PDEATHSIG) with the same effect. Run the same command again:
done points are skipped, the others resume from their checkpoints. A run directory another
process still uses (its lock is held) is waited for, never started twice. Two launchers of
one sweep (two terminals, two machines on one file system) share its points: each starts a
point only once it has claimed it in the sweep's folder (manifest.Claims), so none runs twice
at once; the second says which points the first holds.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

from absl import logging

from rlscale.run import workdir_lock
from rlscale.config.errors import ConfigError
from rlscale.sweep import manifest as mf
from rlscale.sweep.points import Point

_PR_SET_PDEATHSIG = 1


def gpu_ids() -> list[str]:
  """The GPUs this process may use: CUDA_VISIBLE_DEVICES, else those nvidia-smi lists."""
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    return [d for d in visible.split(",") if d.strip()]
  if not shutil.which("nvidia-smi"):
    return []
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return []
  return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def device_slots(parallel: int, gpus: list[str] | None = None,
                 cores: list[int] | None = None) -> list[dict]:
  """What each of `parallel` concurrent runs gets: {"gpus": [...]} or {"cores": [...]}."""
  gpus = gpu_ids() if gpus is None else gpus
  if gpus:
    if parallel > len(gpus):
      raise ConfigError(f"--parallel={parallel} runs need at least as many GPUs; "
                       f"{len(gpus)} are visible ({','.join(gpus)})")
    share = len(gpus) // parallel
    return [{"gpus": gpus[i * share:(i + 1) * share]} for i in range(parallel)]
  cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
  if parallel >= len(cores):
    return [{"cores": [cores[i % len(cores)]]} for i in range(parallel)]
  share = len(cores) // parallel
  return [{"cores": cores[i * share:(i + 1) * share]} for i in range(parallel)]


def _child_setup(cores: list[int] | None):
  def setup():
    try:  # SIGTERM (save and exit) when the launcher dies, however it dies
      ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
      pass
    if cores:
      os.sched_setaffinity(0, cores)
  return setup


VECTORIZE = ("", "seed", "lanes")  # --vectorize: points differing in these run side by side


def lane_groups(points: list[Point], vectorize: str, max_lanes: int) -> list[list[Point]]:
  """The points as processes: one each, or (`vectorize`) groups of up to `max_lanes` points
  whose configs differ only in their seed ("seed") or in any field runs side by side may
  differ in ("lanes": rlscale/trainer/lanes.LANE_FIELDS, learning rates among them), each
  group one process training its points side by side (`--lanes`)."""
  if not vectorize:
    return [[p] for p in points]
  from rlscale.trainer.lanes import LANE_FIELDS, ON_OFF
  varying = {"seed"} if vectorize == "seed" else set(LANE_FIELDS)
  buckets: dict[str, list[Point]] = {}
  for p in points:
    shared = {k: v for k, v in p.fields.items() if k not in varying}
    on = {k: bool(p.fields[k]) for k in ON_OFF if k in p.fields and k in varying}
    buckets.setdefault(json.dumps([shared, on], sort_keys=True, default=str), []).append(p)
  return [group[i:i + max_lanes] for group in buckets.values()
          for i in range(0, len(group), max_lanes)]


class LocalLauncher:
  """Runs the not-done points of a manifest; `command` replaces `python -m rlscale`. With
  `vectorize` ('seed' or 'lanes'), points that may run side by side run as one process of up
  to `max_lanes` of them (rlscale/trainer/lanes.py), each still in its own run directory."""

  def __init__(self, config: str, m: mf.Manifest, points: list[Point], parallel: int = 1,
               command: list[str] | None = None, slots: list[dict] | None = None,
               progress_every: float = 60.0, poll: float = 0.5, vectorize: str = "",
               max_lanes: int = 10):
    if vectorize not in VECTORIZE:
      raise ConfigError(f"--vectorize={vectorize!r}; known: seed, lanes (or '' for none)")
    if max_lanes < 1:
      raise ConfigError(f"--max_lanes={max_lanes} must be a positive integer")
    self.config, self.m, self.parallel = config, m, parallel
    self.vectorize, self.max_lanes = vectorize, max_lanes
    self.points = {p.name: p for p in points}
    self.command = command or [sys.executable, "-m", "rlscale"]
    self.slots = slots or device_slots(parallel)
    self.progress_every, self.poll = progress_every, poll
    self.running: dict[str, tuple[subprocess.Popen, int]] = {}  # name -> (process, slot)
    self.durations: list[float] = []
    self.stopping = False
    self.base_proc: subprocess.Popen | None = None  # a base policy being built
    self._group_of: dict[str, list[Point]] = {}  # a point's group of this launch
    self._log_of: dict[str, str] = {}  # a grouped point's process log

  def _argv(self, p: Point) -> list[str]:
    return [*self.command, f"--config={self.config}", f"--workdir={p.run_dir}",
            *p.config_args()]

  def _group_argv(self, group: list[Point], write: bool = True) -> tuple[list[str], str]:
    """The command running `group` side by side, and its log: the lanes' file (their run
    directories and the overrides they differ in; written unless `write` is False) beside the
    sweep's manifest."""
    if len(group) == 1:
      return self._argv(group[0]), mf.log_path(group[0].run_dir)
    keys = [k for k in group[0].fields if any(p.fields.get(k) != group[0].fields[k]
                                              for p in group)]
    folder = os.path.join(self.m.sweep_dir, "lanes")
    if write:
      os.makedirs(folder, exist_ok=True)
    name = group[0].name + f"+{len(group) - 1}"
    path = os.path.join(folder, name + ".json")
    if write:
      with open(path, "w") as f:
        json.dump([{"run_dir": p.run_dir, "overrides": {k: p.fields[k] for k in keys}}
                   for p in group], f, indent=1)
    shared = Point(group[0].name, {}, {k: v for k, v in group[0].fields.items()
                                       if k not in keys}, group[0].run_dir)
    argv = [*self.command, f"--config={self.config}", f"--lanes={path}", *shared.config_args()]
    return argv, os.path.join(folder, name + ".log")

  def _env(self, slot: int | None) -> dict:
    env = dict(os.environ)
    if slot is not None and "gpus" in self.slots[slot]:
      env["CUDA_VISIBLE_DEVICES"] = ",".join(self.slots[slot]["gpus"])
    return env

  def _spawn(self, argv: list[str], log: str, slot: int | None) -> subprocess.Popen:
    """Start `argv` on the devices of `slot` (None: all of this launcher's)."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "a") as f:
      f.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n")
      f.flush()
      # Its own session: a Ctrl-C in the terminal reaches the launcher, which passes SIGTERM.
      return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=self._env(slot),
                              start_new_session=True,
                              preexec_fn=_child_setup(
                                  None if slot is None else self.slots[slot].get("cores")))

  def dry_run(self) -> str:
    """The commands: a base policy's build (once per recipe), then each point's run."""
    from rlscale.sweep.points import base_key
    lines, bases = [], set()
    for e in self.m.points:
      p = self.points[e.name]
      key = base_key(self.config, p)
      if key and key not in bases:
        bases.add(key)
        lines += ["# base policy " + key, shlex.join(self._argv(p) + ["--base_policy_only"])]
    groups = lane_groups([self.points[e.name] for e in self.m.points], self.vectorize,
                         self.max_lanes)
    for g in groups:
      if len(g) > 1:
        lines.append(f"# side by side: {', '.join(p.name for p in g)}")
      lines.append(shlex.join(self._group_argv(g, write=False)[0]))
    slots = ", ".join(" ".join(f"{k}={','.join(map(str, v))}" for k, v in s.items())
                      for s in self.slots)
    return "\n".join(lines + [f"# {len(self.m.points)} points in {len(groups)} processes, "
                              f"{self.parallel} at a time on: {slots}"])

  def build_bases(self, todo: list[Point]) -> set[str]:
    """Build each distinct base policy of `todo` once, before any point; the names of points
    whose base failed (they are marked failed with its log's last lines)."""
    from rlscale.sweep.points import base_key
    groups: dict[str, list[Point]] = {}
    for p in todo:
      key = base_key(self.config, p)
      if key and not os.path.exists(os.path.join(key, "policy", _done_marker())):
        groups.setdefault(key, []).append(p)
    failed = set()
    for key, group in groups.items():
      log = os.path.join(self.m.sweep_dir, "base-" + os.path.basename(key) + ".log")
      logging.info("sweep: building the base policy %s for %d points (log %s)", key,
                   len(group), log)
      proc = self.base_proc = self._spawn(self._argv(group[0]) + ["--base_policy_only"], log,
                                          None)
      proc.wait()
      self.base_proc = None
      if self.stopping:  # it saved its checkpoint: the next launch resumes the build
        return {p.name for p in todo}
      if proc.returncode != 0:
        error = [f"building the base policy {key} failed (exit {proc.returncode}); {log}:"]
        entries = [self.m.entry(n) for n in self.m.claim([p.name for p in group])]
        for e in entries:
          e.status, e.error = mf.FAILED, error + mf.tail(log)
          failed.add(e.name)
        self.m.save(entries)
    return failed

  def _claim(self, group: list[Point]) -> list[Point]:
    """The points of `group` this launcher holds now; the others are another launch's."""
    got = set(self.m.claim([p.name for p in group]))
    return [p for p in group if p.name in got]

  def _start(self, group: list[Point], slot: int) -> None:
    argv, log = self._group_argv(group)
    proc = self._spawn(argv, log, slot)
    for p in group:
      e = self.m.entry(p.name)
      self._group_of[p.name] = group
      if len(group) > 1:  # where the group's output goes
        self._log_of[p.name] = log
        os.makedirs(p.run_dir, exist_ok=True)
        with open(mf.log_path(p.run_dir), "a") as f:
          f.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} side by side with "
                  f"{len(group) - 1} other points: {log}\n")
      self.running[p.name] = (proc, slot)
      e.status, e.job_id, e.started, e.returncode, e.error = mf.RUNNING, str(proc.pid), \
          time.time(), None, []
      e.attempts += 1
    self.m.save([self.m.entry(p.name) for p in group])

  def _finish(self, name: str, rc: int) -> None:
    e = self.m.entry(name)
    mf.finish(e, rc, self.stopping)
    if e.status == mf.FAILED and len(self._group_of.get(name, ())) > 1:
      e.error = [f"exited {rc} (side by side); {self._log_of[name]}:"] + mf.tail(
          self._log_of[name])
    if e.status == mf.DONE:
      self.durations.append(e.duration_s)
    self.m.save([e])

  def _stop(self, signum, frame) -> None:
    del frame
    if self.stopping:  # a second signal: do not wait for the saves
      for proc in [p for p, _ in self.running.values()] + [self.base_proc]:
        if proc is not None:
          proc.kill()
      return
    self.stopping = True
    logging.warning("sweep: signal %d: asking %d runs to save and stop (again to kill them)",
                    signum, len(self.running))
    for proc in [p for p, _ in self.running.values()] + [self.base_proc]:
      if proc is not None:
        proc.send_signal(signal.SIGTERM)

  def run(self) -> dict[str, int]:
    """Run every point that is not done; the manifest's counts at the end."""
    old = [signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)]
    try:
      self._run()
    finally:
      for s, h in zip((signal.SIGINT, signal.SIGTERM), old):
        signal.signal(s, h)
      self.m.close()
    if self.m.theirs:
      logging.warning("sweep %s: %d of its points were another launcher's (%s); their status "
                      "is what that one recorded", self.m.sweep, len(self.m.theirs),
                      mf.counts_line(self.m, self.m.theirs))
    return self.m.counts()

  def _run(self) -> None:
    todo = [self.points[e.name] for e in self.m.begin(self.points)]
    t0, shown = time.time(), (None, 0.0)  # (counts, time) of the last progress line
    failed = self.build_bases(todo)
    queue = lane_groups([p for p in todo if p.name not in failed], self.vectorize,
                        self.max_lanes)
    free = list(range(len(self.slots)))
    while True:
      for name, (proc, slot) in list(self.running.items()):
        if proc.poll() is not None:
          del self.running[name]
          if not any(q is proc for q, _ in self.running.values()):  # the group's last point
            free.append(slot)
          self._finish(name, proc.returncode)
      for group in list(queue):
        if not free or self.stopping:
          break
        if any(workdir_lock.in_use(p.run_dir) for p in group):  # an earlier launcher's run
          continue
        queue.remove(group)
        group = self._claim(group)
        if group:
          self._start(group, free.pop(0))
      self.m.flush()
      counts = self.m.counts()
      if counts != shown[0] or time.time() - shown[1] >= self.progress_every:
        logging.info("%s", mf.progress_line(self.m, t0, self.durations, self.parallel))
        shown = (counts, time.time())
      if not ((queue and not self.stopping) or self.running):
        break
      time.sleep(self.poll)


def _done_marker() -> str:
  from rlscale.trainer import sft_trainer as sft
  return sft.DONE

"""DIR/sweep.json: what a sweep is and where each of its points stands.

    {"sweep": "batch_invariance", "config": "configs/grpo.py:tiny", "launcher": "local",
     "git_commit": "9d3085a...", "git_dirty": false, "created": 1764582000.0, "updated": ...,
     "points": [{"name": "p=8,lr_scaling=sqrt,seed=0", "overrides": {...},
                 "run_dir": "DIR/p=8,...", "status": "done", "job_id": "12345",
                 "attempts": 1, "duration_s": 81.2, "returncode": 0, "error": []}, ...]}

Statuses: pending (never started), running, done (the run wrote summary.json), failed (its
last lines in `error`), preempted (stopped with a checkpoint; exit status 75). A point is done
when its run directory says so, whatever the manifest last recorded, so a manifest lost or
left stale by a killed launcher is rebuilt from the run directories.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import time
from typing import Any

from absl import logging

from rlscale.config.errors import ConfigError
from rlscale.sweep.points import Point

PENDING, RUNNING, DONE, FAILED, PREEMPTED = "pending", "running", "done", "failed", "preempted"
STATUSES = (PENDING, RUNNING, DONE, FAILED, PREEMPTED)
FILE = "sweep.json"
LOG = "launch.log"  # a point's stdout and stderr, in its run directory
TAIL_LINES = 20


@dataclasses.dataclass
class Entry:
  name: str
  overrides: dict[str, Any]
  run_dir: str
  status: str = PENDING
  job_id: str | None = None
  attempts: int = 0
  started: float | None = None
  duration_s: float | None = None
  returncode: int | None = None
  error: list[str] = dataclasses.field(default_factory=list)


def finish(e: "Entry", rc: int | None, stopping: bool) -> None:
  """A point's run ended with exit status `rc` (None: unknown): done when its run directory
  says so, preempted on 75 (or a signal while the launcher stops), else failed with why."""
  from rlscale.trainer.preemption import EXIT_REQUEUE
  e.returncode = rc
  e.duration_s = round(time.time() - e.started, 1) if e.started is not None else None
  if run_done(e.run_dir) and (rc == 0 or stopping):
    e.status, e.error = DONE, []
  elif rc == EXIT_REQUEUE or (stopping and rc is not None and rc < 0):
    e.status, e.error = PREEMPTED, []
  else:
    e.status = FAILED
    if rc is not None:
      why = "exited 0 without writing summary.json" if rc == 0 else f"exited {rc}"
      e.error = [f"{why}; {log_path(e.run_dir)}:"] + tail(log_path(e.run_dir))


def run_done(run_dir: str) -> bool:
  """A run is done when it wrote summary.json (rl_loop and sft write it last)."""
  return os.path.exists(os.path.join(run_dir, "summary.json"))


def log_path(run_dir: str) -> str:
  return os.path.join(run_dir, LOG)


def tail(path: str, lines: int = TAIL_LINES) -> list[str]:
  """The last non-empty lines of a file (a failure's cause), [] when it is missing."""
  try:
    with open(path, errors="replace") as f:
      text = f.read()[-20000:]
  except OSError:
    return []
  return [line for line in text.splitlines() if line.strip()][-lines:]


def git_commit(path: str) -> tuple[str | None, bool]:
  """(commit, dirty) of the git checkout holding `path`; (None, False) outside one."""
  folder = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path
  try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True,
                            text=True, timeout=10)
    if commit.returncode:
      return None, False
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                           capture_output=True, text=True, timeout=10)
    return commit.stdout.strip(), bool(dirty.stdout.strip())
  except (OSError, subprocess.SubprocessError):
    return None, False


@dataclasses.dataclass
class Manifest:
  sweep: str
  config: str
  launcher: str
  sweep_dir: str
  git_commit: str | None = None
  git_dirty: bool = False
  created: float = dataclasses.field(default_factory=time.time)
  updated: float | None = None
  points: list[Entry] = dataclasses.field(default_factory=list)
  # The points this launch runs (--only); the others' entries are another launch's to write.
  selected: set[str] | None = dataclasses.field(default=None, repr=False)

  @property
  def path(self) -> str:
    return os.path.join(self.sweep_dir, FILE)

  def entry(self, name: str) -> Entry:
    return next(e for e in self.points if e.name == name)

  def mine(self, e: Entry) -> bool:
    return self.selected is None or e.name in self.selected

  def counts(self) -> dict[str, int]:
    """How many of this launch's points are in each status."""
    return {s: sum(e.status == s for e in self.points if self.mine(e)) for s in STATUSES}

  def begin(self, names) -> list[Entry]:
    """The entries of `names` a launch runs (not done), as it starts: one an earlier launcher
    left 'running' is 'preempted' (it resumes), a failed one 'pending' again (it is retried;
    its error stays until it restarts)."""
    todo = [e for e in self.points if e.name in names and e.status != DONE]
    for e in todo:
      e.status = {RUNNING: PREEMPTED, FAILED: PENDING}.get(e.status, e.status)
    self.save()
    return todo

  def save(self) -> None:
    """Written whole to a temporary file, then renamed: a reader never sees half of it.

    Entries of points this launch did not select are taken from the file as it is now, under
    a lock, so launches of disjoint --only selections share one manifest without losing
    each other's updates.
    """
    self.updated = time.time()
    os.makedirs(self.sweep_dir, exist_ok=True)
    with open(self.path + ".lock", "a") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if self.selected is not None:
        disk = load(self.sweep_dir)
        theirs = {e.name: e for e in disk.points} if disk else {}
        self.points = [e if self.mine(e) else theirs.get(e.name, e) for e in self.points]
      d = dataclasses.asdict(self)
      d.pop("sweep_dir")
      d.pop("selected")
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        json.dump(d, f, indent=1, default=str)
        f.write("\n")
      os.replace(tmp, self.path)


def load(sweep_dir: str) -> Manifest | None:
  path = os.path.join(sweep_dir, FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      d = json.load(f)
    entries = [Entry(**e) for e in d.pop("points")]
    return Manifest(sweep_dir=sweep_dir, points=entries, **d)
  except (ValueError, TypeError, KeyError) as e:
    raise ConfigError(f"{path} is not a sweep manifest ({type(e).__name__}: {e}); move it "
                      "away to start the sweep there afresh") from e


def open_sweep(sweep_dir: str, sweep: str, config: str, launcher: str,
               points: list[Point], selected: set[str] | None = None) -> Manifest:
  """The manifest of `points` (the whole sweep), carrying over what an earlier launch of the
  same sweep recorded; this launch runs the `selected` names (None: all).

  A sweep directory belongs to one sweep of one config: another is refused. A point's status
  comes from its run directory first (done), else the manifest.
  """
  old = load(sweep_dir)
  if old and (old.sweep, old.config) != (sweep, config):
    raise ConfigError(f"{sweep_dir} holds sweep {old.sweep!r} of {old.config}, not {sweep!r} of "
                      f"{config}; use another --workdir")
  commit, dirty = git_commit(config.partition(":")[0])
  m = Manifest(sweep, config, launcher, sweep_dir, commit, dirty,
               created=old.created if old else time.time(), selected=selected)
  previous = {e.name: e for e in old.points} if old else {}
  for p in points:
    e = previous.get(p.name)
    if e and e.overrides != p.overrides:
      raise ConfigError(f"point {p.name!r} of {m.path} had overrides {e.overrides}, the sweep now "
                        f"declares {p.overrides}; use another --workdir")
    e = e or Entry(p.name, p.overrides, p.run_dir)
    e.run_dir = p.run_dir
    if run_done(p.run_dir):
      e.status = DONE
    elif e.status == DONE:  # stale or hand-edited: the run directory says otherwise
      logging.warning("point %s: %s says done, but %s has no summary.json: it runs again",
                      p.name, m.path, p.run_dir)
      e.status = PREEMPTED if os.path.isdir(p.run_dir) else PENDING  # resumes, or starts
      e.error = [f"{FILE} said done without summary.json in {p.run_dir}"]
    m.points.append(e)
  return m


def progress_line(m: Manifest, t0: float, durations: list[float], parallel: int) -> str:
  """`sweep NAME: 3/12 done, 2 running, 1 failed, 6 pending | 4m10s, ETA 9m`."""
  c = m.counts()
  total = sum(c.values())
  left = c[PENDING] + c[RUNNING] + c[PREEMPTED]
  eta = "?"
  if durations:
    mean = sum(durations) / len(durations)
    eta = _minutes(mean * left / max(1, parallel))
  parts = [f"{c[DONE]}/{total} done", f"{c[RUNNING]} running"]
  parts += [f"{c[s]} {s}" for s in (FAILED, PREEMPTED, PENDING) if c[s]]
  return (f"sweep {m.sweep}: {', '.join(parts)} | {_minutes(time.time() - t0)} elapsed"
          + (f", ETA {eta}" if left else ""))


def _minutes(seconds: float) -> str:
  m, s = divmod(int(seconds), 60)
  return f"{m}m{s:02d}s"

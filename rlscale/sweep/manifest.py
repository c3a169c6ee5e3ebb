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

Beside it, in DIR:
  sweep.journal.jsonl  the changes since sweep.json was last written, a line each: a point's
                       entry ({"t": time, "point": {...}}) or the header's fields a launch
                       changed ({"t": time, "head": {...}}). A launcher's status change
                       appends one line. sweep.json (written whole to a temporary file, then
                       renamed: a reader never sees half of it) takes the journal in at a whole
                       save (`save()`, as a launch starts), when a launch ends, when the journal
                       outgrows it, and otherwise within about COMPACT_S seconds of a change
                       while a launcher runs: read alone it is at most that far behind, and it
                       is rewritten at most that often however fast points change. `load`
                       reads both.
  sweep.json.lock      an flock held for each read-modify-write of the two, so concurrent
                       launchers never lose each other's changes.
  .launchers/          one file per live launcher that has claimed points: a line saying who
                       (pid, host, start time, launcher), then the points it runs or ran, one
                       per line. It holds an flock on its file as long as it lives; the kernel
                       drops it when the process dies, however it dies, so a file whose lock
                       can be taken is a dead launcher's and is removed. A launcher starts a
                       point only once it has claimed it (under sweep.json.lock), and never one
                       another live launcher holds (nor, locally, one another launch ran since
                       it read the manifest): two launches of one sweep share its points and
                       never run one twice at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import subprocess
import time
from typing import Any, Iterable

from absl import logging

from rlscale.config.errors import ConfigError
from rlscale.sweep.points import Point

PENDING, RUNNING, DONE, FAILED, PREEMPTED = "pending", "running", "done", "failed", "preempted"
STATUSES = (PENDING, RUNNING, DONE, FAILED, PREEMPTED)
FILE = "sweep.json"
JOURNAL = "sweep.journal.jsonl"
LOCK = FILE + ".lock"
LAUNCHERS = ".launchers"
LOG = "launch.log"  # a point's stdout and stderr, in its run directory
TAIL_LINES = 20
COMPACT_S = 10.0  # while points change, sweep.json takes the journal in at most this often
HEAD = ("sweep", "config", "launcher", "git_commit", "git_dirty", "created", "updated")
LAUNCH_HEAD = ("launcher", "git_commit", "git_dirty")  # what a later launch may change


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


# --- the folder's files: sweep.json, its journal, their lock ---

@contextlib.contextmanager
def locked(sweep_dir: str):
  """The sweep's lock (sweep.json.lock), held for one read-modify-write of its files."""
  os.makedirs(sweep_dir, exist_ok=True)
  with open(os.path.join(sweep_dir, LOCK), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    yield


@dataclasses.dataclass
class Disk:
  """What sweep.json and its journal say, as this process last read them."""
  head: dict | None = None  # None: no sweep.json
  points: dict[str, dict] = dataclasses.field(default_factory=dict)  # name -> entry, in order
  snapshot: tuple | None = None  # sweep.json's (inode, mtime_ns, size) when it was read
  journal: int = 0  # the journal's bytes read (all of them, after a read)

  @property
  def written(self) -> float:
    """When sweep.json was last written (0: never)."""
    return self.snapshot[1] / 1e9 if self.snapshot else 0.0


def _stat(path: str) -> tuple | None:
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return None
  return st.st_ino, st.st_mtime_ns, st.st_size


def read(sweep_dir: str, disk: Disk | None = None) -> Disk:
  """sweep.json with its journal's lines applied. Given what an earlier read returned (`disk`)
  and sweep.json is still the file it read, only the journal's new lines are read. A journal
  without sweep.json (moved away to start afresh) is not read. A reader without the sweep's
  lock may meet a writer folding the journal into a new sweep.json (the journal removed between
  two reads): it reads again from the new sweep.json."""
  path = os.path.join(sweep_dir, FILE)
  for _ in range(READ_TRIES - 1):
    try:
      out = _read_once(sweep_dir, path, disk)
    except FileNotFoundError:
      out = None
    if out is not None and out.snapshot == _stat(path):
      return out
    disk = None
  return _read_once(sweep_dir, path, None)


READ_TRIES = 5  # a compaction every ~10 s: a second read almost always sees a settled file


def _read_once(sweep_dir: str, path: str, disk: Disk | None) -> Disk:
  snapshot = _stat(path)
  journal = _stat(os.path.join(sweep_dir, JOURNAL))
  if disk is None or snapshot != disk.snapshot or (journal[2] if journal else 0) < disk.journal:
    disk = Disk(snapshot=snapshot)
    if snapshot is None:
      return disk
    with open(path) as f:
      d = json.load(f)
    disk.points = {e["name"]: e for e in d.pop("points")}
    disk.head = d
  if journal and disk.head is not None:
    _read_journal(sweep_dir, disk)
  return disk


def _read_journal(sweep_dir: str, disk: Disk) -> None:
  with open(os.path.join(sweep_dir, JOURNAL), "rb") as f:
    f.seek(disk.journal)
    data = f.read()
  end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
  for line in data[:end].splitlines():
    _apply(disk, line)
  disk.journal += end


def _apply(disk: Disk, line: bytes) -> None:
  try:
    _apply_record(disk, json.loads(line))
  except (ValueError, TypeError, KeyError, AttributeError):  # a line a dead writer left torn
    logging.warning("sweep: %s: skipping a line that is not a change: %r", JOURNAL, line[:200])


def _apply_record(disk: Disk, record: dict) -> None:
  if "point" in record:
    disk.points[record["point"]["name"]] = record["point"]
  disk.head.update(record.get("head", {}))
  disk.head["updated"] = record.get("t", disk.head.get("updated"))


def _append(sweep_dir: str, disk: Disk, records: list[dict]) -> None:
  """Append `records` to the journal (under the lock, `disk` read to its end) and apply them."""
  lines = [json.dumps(r, default=str) + "\n" for r in records]
  path = os.path.join(sweep_dir, JOURNAL)
  data = "".join(lines).encode()
  with open(path, "a+b") as f:
    size = f.seek(0, os.SEEK_END)
    if size and os.pread(f.fileno(), 1, size - 1) != b"\n":
      data = b"\n" + data  # a writer killed mid-line: its torn line stays a line of its own
    f.write(data)
  disk.journal = size + len(data)
  for line in lines:
    _apply(disk, line.encode())


def _write_snapshot(sweep_dir: str, disk: Disk) -> None:
  """sweep.json from `disk` (a temporary file, then renamed: a reader never sees half of it),
  and the journal emptied."""
  path = os.path.join(sweep_dir, FILE)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump({**disk.head, "points": list(disk.points.values())}, f, indent=1, default=str)
    f.write("\n")
  os.replace(tmp, path)
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(sweep_dir, JOURNAL))
  disk.snapshot, disk.journal = _stat(path), 0


def _canonical(d: dict) -> dict:
  """An entry as JSON gives it back (tuples as lists)."""
  return json.loads(json.dumps(d, default=str))


def _entry_dict(e: Entry) -> dict:
  return {f.name: getattr(e, f.name) for f in dataclasses.fields(Entry)}


def _entry(d: dict) -> Entry:
  """An entry from its JSON, sharing no list or dict with it (what was read stays as read)."""
  return Entry(**{**d, "overrides": dict(d["overrides"]), "error": list(d.get("error") or [])})


def _when(t: float) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# --- which launcher holds which points ---

class Claims:
  """The points this launcher holds in a sweep: DIR/.launchers/<host>-<pid>-<start>, made at
  its first claim, a line saying who, then a line per point; flocked while it lives. Every
  method but `release` runs under the sweep's lock."""

  def __init__(self, sweep_dir: str, launcher: str):
    self.folder = os.path.join(sweep_dir, LAUNCHERS)
    self.who = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "launcher": launcher}
    self.path = os.path.join(self.folder, f"{self.who['host']}-{os.getpid()}-"
                                          f"{int(self.who['started'] * 1000)}")
    self.file = None
    self.names: set[str] = set()
    self._read: dict[str, tuple] = {}  # another's file -> (inode, bytes read, who, names)

  def others(self) -> list[dict]:
    """The other live launchers, each {pid, host, started, launcher, names}; the files of
    dead ones are removed."""
    try:
      files = sorted(os.listdir(self.folder))
    except FileNotFoundError:
      return []
    out = []
    for name in files:
      path = os.path.join(self.folder, name)
      if path != self.path and not name.endswith(".tmp"):
        holder = self._holder(path)
        if holder:
          out.append(holder)
    return out

  def _holder(self, path: str) -> dict | None:
    try:
      f = open(path, "rb")
    except FileNotFoundError:
      return None
    with f:
      try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:  # its launcher lives
        return self._names(path, f)
      with contextlib.suppress(FileNotFoundError):  # dead: the kernel dropped its lock
        os.remove(path)
      self._read.pop(path, None)
      return None

  def _names(self, path: str, f) -> dict:
    inode = os.fstat(f.fileno()).st_ino
    seen, done, who, names = self._read.get(path, (None, 0, None, []))
    if seen != inode:
      done, who, names = 0, None, []
    f.seek(done)
    data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode(errors="replace").splitlines():
      if who is None:
        try:
          who = json.loads(line)
        except ValueError:
          who = {}
      else:
        names.append(line)
    self._read[path] = (inode, done + end, who, names)
    return {"pid": "?", "host": "?", "started": 0.0, "launcher": "?", **(who or {}),
            "names": names}

  def take(self, names: Iterable[str]) -> None:
    """Hold `names` from now until `release`."""
    new = [n for n in dict.fromkeys(names) if n not in self.names]
    if not new:
      return
    if self.file is None:
      os.makedirs(self.folder, exist_ok=True)
      self.file = open(self.path, "w")
      fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
      self.file.write(json.dumps(self.who) + "\n")
    self.file.write("".join(n + "\n" for n in new))
    self.file.flush()
    self.names.update(new)

  def release(self) -> None:
    """Give every point back (the file goes; the lock with it)."""
    if self.file is None:
      return
    with contextlib.suppress(FileNotFoundError):
      os.remove(self.path)
    self.file.close()
    self.file, self.names = None, set()


def held_line(sweep_dir: str, holder: dict, names: list[str], verb: str = "runs") -> str:
  """What another launcher is doing, in one line."""
  shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
  return (f"sweep {sweep_dir}: another launcher (pid {holder['pid']} on host {holder['host']}, "
          f"{holder['launcher']}, started {_when(holder['started'])}) holds "
          f"{len(names)} point{'s' * (len(names) != 1)} ({shown}); this one {verb} only the rest")


# --- the manifest ---

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
  # Points another launcher holds or ran while this one ran: read, never written, by this one.
  theirs: set[str] = dataclasses.field(default_factory=set, repr=False)
  verb: str = dataclasses.field(default="runs", repr=False)  # what this launch does to points
  _disk: Disk | None = dataclasses.field(default=None, repr=False)
  _seen: dict[str, dict] = dataclasses.field(default_factory=dict, repr=False)  # as on disk
  _claims: Claims | None = dataclasses.field(default=None, repr=False)
  _index: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
  _appended: float | None = dataclasses.field(default=None, repr=False)  # not yet compacted
  _told: set = dataclasses.field(default_factory=set, repr=False)  # launchers announced

  @property
  def path(self) -> str:
    return os.path.join(self.sweep_dir, FILE)

  @property
  def claims(self) -> Claims:
    if self._claims is None:
      self._claims = Claims(self.sweep_dir, self.launcher)
    return self._claims

  def entry(self, name: str) -> Entry:
    i = self._index.get(name)
    if i is None or i >= len(self.points) or self.points[i].name != name:
      self._index = {e.name: i for i, e in enumerate(self.points)}
      i = self._index[name]
    return self.points[i]

  def mine(self, e: Entry) -> bool:
    """Whether this launch selected the point (its counts and exit status say how it went)."""
    return self.selected is None or e.name in self.selected

  def writes(self, e: Entry) -> bool:
    """Whether this launch records the point's changes (selected, and no other launcher's)."""
    return self.mine(e) and e.name not in self.theirs

  def counts(self) -> dict[str, int]:
    """How many of this launch's points are in each status."""
    c = dict.fromkeys(STATUSES, 0)
    for e in self.points:
      if self.mine(e):
        c[e.status] += 1
    return c

  def _head(self) -> dict:
    return {k: getattr(self, k) for k in HEAD}

  def _sync(self) -> Disk:
    """The folder's manifest as it is now (under the lock)."""
    self._disk = read(self.sweep_dir, self._disk)
    return self._disk

  def _changed(self, e: Entry) -> bool:
    """Whether this launch changed the entry since it last read or wrote it."""
    seen = self._seen.get(e.name)
    return seen is None or (_entry_dict(e) != seen and _canonical(_entry_dict(e)) != seen)

  def _adopt(self, e: Entry, d: dict | None) -> None:
    """The entry as the folder has it (`d`), in place."""
    if d is not None:
      for k, v in _entry(d).__dict__.items():
        setattr(e, k, v)
      self._seen[e.name] = d

  # --- writing ---

  def save(self, entries: Iterable[Entry] | None = None) -> None:
    """Record the entries of `entries` this launch changed, a journal line each (a launcher
    saving what it just changed); None: any entry this launch changed, and sweep.json is
    written at once. Nothing changed: nothing is written."""
    with locked(self.sweep_dir):
      self._save(entries)

  def _save(self, entries: Iterable[Entry] | None) -> None:
    disk = self._sync()
    if disk.head is None or (entries is None and
                             list(disk.points) != [e.name for e in self.points]):
      self._rewrite(disk)
      return
    changed = [e for e in (self.points if entries is None else entries)
               if self.writes(e) and self._changed(e)]
    if not changed:
      return
    now = time.time()
    head = {k: getattr(self, k) for k in LAUNCH_HEAD}
    records = [{"t": now, "head": head}] if any(disk.head.get(k) != v
                                                for k, v in head.items()) else []
    records += [{"t": now, "point": _entry_dict(e)} for e in changed]
    if entries is None:  # a whole save: sweep.json at once
      for r in records:
        _apply_record(disk, _canonical(r))
    else:
      _append(self.sweep_dir, disk, records)
      self._appended = self._appended or now
    for e in changed:
      self._seen[e.name] = disk.points[e.name]
    self.updated = now
    if entries is None or disk.journal > disk.snapshot[2] or now - disk.written >= COMPACT_S:
      self._compact(disk)

  def _rewrite(self, disk: Disk) -> None:
    """sweep.json whole from this launch's entries, in its order: those it changed as it has
    them, the others as the folder has them."""
    points = {}
    for e in self.points:
      d = disk.points.get(e.name)
      points[e.name] = (_canonical(_entry_dict(e)) if d is None or (self.writes(e) and
                                                                    self._changed(e)) else d)
    self.updated = time.time()
    disk.head = {**self._head(), **({"created": disk.head["created"]} if disk.head else {})}
    disk.points = points
    _write_snapshot(self.sweep_dir, disk)
    self._seen.update(points)
    self._appended = None

  def _compact(self, disk: Disk) -> None:
    _write_snapshot(self.sweep_dir, disk)
    self._appended = None

  def flush(self) -> None:
    """sweep.json takes the journal in when this launch appended to it COMPACT_S ago or more
    (a launcher calls this as it waits; cheap otherwise)."""
    if self._appended is None or time.time() - self._appended < COMPACT_S:
      return
    with locked(self.sweep_dir):
      disk = self._sync()
      if disk.journal:
        self._compact(disk)
    self._appended = None

  def close(self) -> None:
    """At the end of a launch: sweep.json takes in what this launch appended, the entries of
    points another launcher held are read back as they are now, and this launcher's claims
    are given back."""
    try:
      if self._appended is not None or self.theirs:
        with locked(self.sweep_dir):
          disk = self._sync()
          if self._appended is not None and disk.journal:
            self._compact(disk)
          for name in self.theirs:
            self._adopt(self.entry(name), disk.points.get(name))
      self._appended = None
    finally:
      if self._claims is not None:
        self._claims.release()

  # --- launching ---

  def begin(self, names) -> list[Entry]:
    """The entries of `names` a launch runs (not done, held by no other live launcher), as it
    starts: one an earlier launcher left 'running' is 'preempted' (it resumes), a failed one
    'pending' again (it is retried; its error stays until it restarts)."""
    todo = [e for e in self.points if e.name in names and e.status != DONE
            and e.name not in self.theirs]
    if not todo:
      return []
    with locked(self.sweep_dir):
      held = self._held()
      disk = self._sync()
      for e in todo:
        if e.name in held:
          self._leave(e, disk, held[e.name])
        elif disk.points.get(e.name) not in (None, self._seen.get(e.name)):
          self._adopt(e, disk.points[e.name])  # another launch wrote it since this one read it
          if run_done(e.run_dir):
            e.status = DONE
      todo = [e for e in todo if e.name not in self.theirs and e.status != DONE]
      for e in todo:
        e.status = {RUNNING: PREEMPTED, FAILED: PENDING}.get(e.status, e.status)
      self._save(todo)
    return todo

  def claim(self, names: Iterable[str], adopt_runs: bool = False) -> list[str]:
    """Of `names`, the points this launcher may start now, which it then holds until it ends:
    those no other live launcher holds and not done (one done meanwhile is recorded done). One
    another launch ran since this one read it is left to it, or with `adopt_runs` (Slurm: its
    job is looked up) taken as the folder has it. The points left are another launch's from
    then on (`theirs`)."""
    names = [n for n in names if n not in self.theirs]
    if not names:
      return []
    with locked(self.sweep_dir):
      held = self._held()
      disk = self._sync()
      got, done = [], []
      for n in names:
        e, d = self.entry(n), disk.points.get(n)
        ran = d is not None and d != self._seen.get(n) and d.get("attempts", 0) > e.attempts
        if n in held or (ran and not adopt_runs):
          self._leave(e, disk, held.get(n))
          continue
        if d is not None and d != self._seen.get(n):
          self._adopt(e, d)
        if run_done(e.run_dir):  # another launch finished it since this one read it
          e.status, e.error = DONE, []
          done.append(e)
        else:
          got.append(n)
      self.claims.take(got)
      self._save(done)
    return got

  def _held(self) -> dict[str, dict]:
    """Point name -> the other live launcher holding it; each launcher holding some of this
    launch's points is announced once."""
    held = {}
    for h in self.claims.others():
      ours = [n for n in h["names"] if self.selected is None or n in self.selected]
      key = (h["host"], h["pid"], h["started"])
      if ours and key not in self._told:
        self._told.add(key)
        logging.warning("%s", held_line(self.sweep_dir, h, ours, self.verb))
      held.update(dict.fromkeys(h["names"], h))
    return held

  def _leave(self, e: Entry, disk: Disk, holder: dict | None) -> None:
    """The point is another launch's: read as the folder has it, never written by this one."""
    self.theirs.add(e.name)
    self._adopt(e, disk.points.get(e.name))
    who = f"pid {holder['pid']} on host {holder['host']}" if holder else "another launch"
    logging.info("sweep: point %s: left to %s (%s)", e.name, who, e.status)


def load(sweep_dir: str) -> Manifest | None:
  """The manifest in `sweep_dir` (sweep.json and its journal), None when there is none."""
  path = os.path.join(sweep_dir, FILE)
  try:
    disk = read(sweep_dir)
    if disk.head is None:
      return None
    entries = [_entry(e) for e in disk.points.values()]
    m = Manifest(sweep_dir=sweep_dir, points=entries, **disk.head)
  except (ValueError, TypeError, KeyError, AttributeError) as e:
    raise ConfigError(f"{path} is not a sweep manifest ({type(e).__name__}: {e}); move it "
                      "away to start the sweep there afresh") from e
  m._disk, m._seen = disk, dict(disk.points)
  return m


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
               created=old.created if old else time.time(), selected=selected,
               verb="submits" if launcher == "slurm" else "runs")
  if old:
    m._disk, m._seen, m.updated = old._disk, old._seen, old.updated
  previous = {e.name: e for e in old.points} if old else {}
  for p in points:
    e = previous.get(p.name)
    if e and e.overrides != p.overrides and _canonical(p.overrides) != _canonical(e.overrides):
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


def counts_line(m: Manifest, names: Iterable[str]) -> str:
  """`2 done, 1 running`: the statuses of `names`."""
  statuses = [m.entry(n).status for n in names]
  return ", ".join(f"{statuses.count(s)} {s}" for s in STATUSES if s in statuses)


def _minutes(seconds: float) -> str:
  m, s = divmod(int(seconds), 60)
  return f"{m}m{s:02d}s"

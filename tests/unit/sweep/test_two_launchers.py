"""Two launches of one sweep at once (issue 47, class 3): they share its points and never run
one twice at the same time, sweep.json stays valid JSON under concurrent writers, and the second
says what the first is doing.

The launcher tests run two real `launch/sweep.py` processes with tests/support/workers/fake_run.py
as the points' run (it holds the run directory's lock: a second run of a point at the same time
would exit 1 with BlockingIOError, and every start is a line of starts.txt).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.support import FAKE_SLURM
from rlscale.sweep import manifest as mf
from rlscale.sweep import points
from tests.support.sweep_helpers import FAKE_CONFIG, FAKE_RUN, fake_run_flag, manifest, starts, \
    sweep_cli

_CONFIG = '''"""A sweep of three points of {seconds} s each, of the fake run's config."""
import importlib.util

_spec = importlib.util.spec_from_file_location("fake_sweep_config", {fake!r})
_fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fake)
get_config = _fake.get_config


def sweeps(arg=None):
  return {{"three": [{{"seed": i, "steps": {steps}, "delay": 0.1}} for i in range(3)]}}
'''


def config(tmp_path, seconds: int) -> str:
  """A config declaring sweep "three": seed=0, 1, 2, each a fake run of `seconds`."""
  path = tmp_path / f"three_{seconds}s.py"
  path.write_text(_CONFIG.format(seconds=seconds, fake=FAKE_CONFIG, steps=10 * seconds))
  return str(path)


class Reader(threading.Thread):
  """Reads sweep.json (as json) and the manifest (mf.load) over and over until stopped; what
  failed to read is in `errors`."""

  def __init__(self, sweep_dir):
    super().__init__(daemon=True)
    self.sweep_dir, self.errors, self.reads, self.stop = sweep_dir, [], 0, False

  def run(self):
    path = os.path.join(self.sweep_dir, mf.FILE)
    while not self.stop:
      if os.path.exists(path):
        try:
          with open(path) as f:
            json.load(f)
          mf.load(self.sweep_dir)
          self.reads += 1
        except Exception as e:  # pylint: disable=broad-except
          self.errors.append(repr(e))
      time.sleep(0.005)


def _launch(tmp_path, config, *flags):
  return sweep_cli(tmp_path, "three", fake_run_flag(), "--parallel=1", *flags, config=config,
                   wait=False)


def _wait_for_claims(sweep_dir, timeout=120):
  folder = os.path.join(sweep_dir, mf.LAUNCHERS)
  deadline = time.time() + timeout
  while time.time() < deadline:
    if os.path.isdir(folder) and os.listdir(folder):
      return
    time.sleep(0.05)
  raise AssertionError(f"no launcher claimed a point in {folder}")


def _each_point_ran_once(tmp_path):
  for i in range(3):
    assert len(starts(tmp_path, f"seed={i}")) == 1, (i, starts(tmp_path, f"seed={i}"))
    with open(tmp_path / "sw" / f"seed={i}" / "launch.log") as f:
      assert "BlockingIOError" not in f.read()  # no second run met the first's lock
  assert [(p["status"], p["attempts"]) for p in manifest(tmp_path)["points"]] == [
      ("done", 1)] * 3


@pytest.mark.slow(seconds=10)
def test_the_same_sweep_started_twice_at_once_runs_each_point_once(tmp_path):
  reader = Reader(str(tmp_path / "sw"))
  reader.start()
  short = config(tmp_path, 2)
  procs = [_launch(tmp_path, short), _launch(tmp_path, short)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  reader.stop = True
  reader.join()
  # 0 for the one that ends last; 75 for one that ends while the other still runs its points.
  assert sorted(p.returncode for p in procs)[0] == 0, outs
  assert all(p.returncode in (0, 75) for p in procs), outs
  _each_point_ran_once(tmp_path)
  assert reader.errors == [] and reader.reads > 0
  again = sweep_cli(tmp_path, "three", fake_run_flag(), config=short)
  assert again.returncode == 0, again.stderr
  _each_point_ran_once(tmp_path)  # done: nothing ran
  assert not os.listdir(tmp_path / "sw" / mf.LAUNCHERS)  # every claim given back


@pytest.mark.slow(seconds=25)
def test_the_second_launcher_says_what_the_first_holds(tmp_path):
  long = config(tmp_path, 10)
  first = _launch(tmp_path, long)
  _wait_for_claims(tmp_path / "sw")
  second = _launch(tmp_path, long)
  out2, _ = second.communicate(timeout=600)
  out1, _ = first.communicate(timeout=600)
  line = next(l for l in out2.splitlines() if "another launcher" in l)
  assert (f"sweep {tmp_path / 'sw'}: another launcher (pid {first.pid} on host "
          f"{socket.gethostname()}, local, started ") in line
  assert line.endswith("holds 1 point (seed=0); this one runs only the rest"), line
  assert (first.returncode, second.returncode) in ((0, 75), (75, 0), (0, 0)), out1 + out2
  _each_point_ran_once(tmp_path)
  # The first, done with seed=0, found seed=1 held by the second and said so too.
  assert f"another launcher (pid {second.pid} on host " in out1
  assert "of its points were another launcher's" in out2


def _claimer(sweep_dir, names):
  """A process that opens the sweep, claims `names` and waits (to be killed)."""
  code = (f"import sys, time\nfrom rlscale.sweep import manifest as mf, points\n"
          f"pts = points.points({FAKE_CONFIG!r}, 'three', {sweep_dir!r})\n"
          f"m = mf.open_sweep({sweep_dir!r}, 'three', {FAKE_CONFIG!r}, 'local', pts)\n"
          f"m.save()\nprint(m.claim({names!r}), flush=True)\ntime.sleep(600)\n")
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == repr(names)
  return proc


def test_a_live_launchers_points_are_left_to_it_and_a_killed_ones_are_free(tmp_path):
  sw = str(tmp_path / "sw")
  holder = _claimer(sw, ["seed=0", "seed=1"])
  try:
    m = mf.open_sweep(sw, "three", FAKE_CONFIG, "local", points.points(FAKE_CONFIG, "three", sw))
    [other] = m.claims.others()
    assert (other["pid"], other["host"], other["names"]) == (holder.pid, socket.gethostname(),
                                                             ["seed=0", "seed=1"])
    assert m.claim(["seed=0", "seed=2"]) == ["seed=2"]
    assert m.theirs == {"seed=0"}
    line = mf.held_line(sw, other, other["names"])
    assert line.startswith(f"sweep {sw}: another launcher (pid {holder.pid} on host ")
    assert line.endswith("holds 2 points (seed=0, seed=1); this one runs only the rest")
  finally:
    holder.send_signal(signal.SIGKILL)  # no chance to give its claims back
    holder.wait()
  # The kernel dropped the dead launcher's lock: its file is removed and its points are free.
  m = mf.open_sweep(sw, "three", FAKE_CONFIG, "local", points.points(FAKE_CONFIG, "three", sw))
  assert m.claim(["seed=0", "seed=1"]) == ["seed=0", "seed=1"]
  assert os.listdir(tmp_path / "sw" / mf.LAUNCHERS) == [os.path.basename(m.claims.path)]
  m.close()
  assert os.listdir(tmp_path / "sw" / mf.LAUNCHERS) == []


_WRITER = """
import sys, time
from rlscale.sweep import manifest as mf
mf.COMPACT_S = 0.01  # sweep.json is rewritten often: compactions race with the appends
k, n, rounds, sw = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
m = mf.load(sw)
mine = [e for i, e in enumerate(m.points) if i % n == k]
for r in range(rounds):
  for e in mine:
    e.status, e.attempts, e.job_id = mf.RUNNING if r % 2 else mf.PENDING, r, f"writer{k}"
    m.save([e])
    m.flush()
m.close()
"""


def test_concurrent_writers_keep_sweep_json_valid_and_lose_nothing(tmp_path):
  """Three processes change their own points of one manifest at once, each change saved on
  its own: every read of sweep.json in between is valid JSON, and no change is lost."""
  sw, writers, rounds = str(tmp_path / "sw"), 3, 30
  m = mf.Manifest("w", "c", "local", sw)
  m.points = [mf.Entry(f"p{i}", {"i": i}, os.path.join(sw, f"p{i}")) for i in range(12)]
  m.save()
  reader = Reader(sw)
  reader.start()
  procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(k), str(writers), str(rounds),
                             sw]) for k in range(writers)]
  assert [p.wait(timeout=300) for p in procs] == [0] * writers
  reader.stop = True
  reader.join()
  assert reader.errors == [] and reader.reads > 0
  with open(os.path.join(sw, mf.FILE)) as f:
    final = json.load(f)["points"]  # sweep.json alone: each writer took the journal in
  assert [(p["attempts"], p["job_id"]) for p in final] == [
      (rounds - 1, f"writer{i % writers}") for i in range(12)]
  assert not os.path.exists(os.path.join(sw, mf.JOURNAL))


def test_two_slurm_submissions_at_once_submit_each_point_once(tmp_path, monkeypatch):
  """Two `--launcher=slurm` launches at once (the fakes of tests/support/fake_slurm/ run each
  job as it is submitted): one array holds every point; the other launch submits nothing."""
  env = dict(os.environ, PATH=FAKE_SLURM + os.pathsep + os.environ["PATH"],
             FAKE_SLURM_STATE=str(tmp_path / "slurm.json"))
  monkeypatch.chdir(tmp_path)
  procs = [sweep_cli(tmp_path, "two", "--launcher=slurm", "--run_command=" + " ".join(FAKE_RUN),
                     env=env, wait=False) for _ in range(2)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  with open(tmp_path / "slurm.json") as f:
    submitted = [t for s in json.load(f)["submissions"] for t in s["tasks"]]
  assert sorted(submitted) == [0, 1], outs
  assert [len(starts(tmp_path, f"seed={i}")) for i in (0, 1)] == [1, 1]
  assert sum("nothing to submit" in o or "this one submits only the rest" in o
             for o in outs) == 1, outs

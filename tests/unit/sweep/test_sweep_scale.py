"""A sweep of a thousand points (issue 47, class 6): its dry run, its Slurm submission (split
into arrays where MaxArraySize asks), a relaunch when every point is done (seconds, and no file
touched), and what a status change writes (a journal line, not the whole sweep.json).

The Slurm fakes here (benchmarks/sweep_scale.py's) record each sbatch and run nothing; their
`scontrol show config` says MaxArraySize = $FAKE_MAX_ARRAY_SIZE (default 1001). Timings are
checked on the CPU time the launcher used, which a machine busy with other work does not
inflate; benchmarks/sweep_scale.py reports wall times at 1,000 and 10,000 points.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.support import REPO
from rlscale.sweep import manifest as mf
from rlscale.sweep.launchers import slurm_queue
from tests.support.sweep_helpers import FAKE_CONFIG

_spec = importlib.util.spec_from_file_location(
    "sweep_scale", os.path.join(REPO, "benchmarks", "sweep_scale.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

_SMALL = '''"""The fake run's config with one sweep of {n} points."""
import importlib.util

_spec = importlib.util.spec_from_file_location("fake_sweep_config", {fake!r})
_fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fake)
get_config = _fake.get_config


def sweeps(arg=None):
  return {{"scale": [{{"seed": i}} for i in range({n})]}}
'''


def grpo_sweep(tmp_path, n: int) -> str:
  """configs/grpo.py:tiny with sweep "scale" of `n` points (benchmarks/sweep_scale.py's)."""
  path = tmp_path / "scale_config.py"
  path.write_text(bench._CONFIG.format(n=n, base=os.path.join(REPO, "configs", "grpo.py")))
  return f"{path}:tiny"


def fake_sweep(tmp_path, n: int) -> str:
  """The fake run's config with sweep "scale" of `n` points (seed=0 ... seed=n-1)."""
  path = tmp_path / "fake_scale_config.py"
  path.write_text(_SMALL.format(n=n, fake=FAKE_CONFIG))
  return str(path)


@pytest.fixture
def fakes(tmp_path):
  """The recording Slurm fakes first on PATH (an environment for the launcher's process)."""
  return bench.fake_slurm(str(tmp_path / "fake_slurm"))


def submissions(env) -> list[dict]:
  """What the fake sbatch recorded: [{job, dependency, array}]."""
  path = os.path.join(env["FAKE_DIR"], "submissions")
  out = []
  for line in open(path).read().splitlines() if os.path.exists(path) else []:
    dep = re.search(r"--dependency=(\S+)", line)
    array = re.search(r"#SBATCH --array=(\S+)", line)
    out.append({"job": line.split()[0], "dependency": dep.group(1) if dep else None,
                "array": array.group(1) if array else None})
  return out


def launch(tmp_path, config, *flags, env) -> tuple[float, float]:
  """launch/sweep.py on sweep "scale" in tmp_path/sw, from tmp_path: (wall s, CPU s)."""
  return bench.cli(REPO, config, str(tmp_path / "sw"), *flags, env=env, timeout=600)


@pytest.mark.slow(seconds=25)
def test_a_thousand_point_dry_run_takes_seconds(tmp_path, fakes):
  config = grpo_sweep(tmp_path, 1000)
  for flags in ((), ("--launcher=slurm",)):
    argv = [sys.executable, os.path.join(REPO, "launch", "sweep.py"), f"--config={config}",
            "--sweep=scale", f"--workdir={tmp_path / 'sw'}", "--dry_run", *flags]
    cpu0, t0 = bench._children_cpu(), time.time()
    out = subprocess.run(argv, capture_output=True, text=True, env=fakes, timeout=600)
    cpu, wall = bench._children_cpu() - cpu0, time.time() - t0
    assert out.returncode == 0, out.stderr[-3000:]
    assert cpu < 10, (flags, cpu, wall)
    if flags:  # the array script: a case per point
      assert "#SBATCH --array=0-999\n" in out.stdout and out.stdout.count("     argv=(") == 1000
    else:
      assert out.stdout.count(" --workdir=") == 1001  # the base policy's build, then each point
      assert "# 1000 points in 1000 processes" in out.stdout
  assert not os.path.exists(tmp_path / "sw")  # a dry run writes nothing


@pytest.mark.slow(seconds=15)
def test_a_thousand_point_slurm_submission_is_one_array_in_seconds(tmp_path, fakes):
  wall, cpu = launch(tmp_path, grpo_sweep(tmp_path, 1000), "--launcher=slurm", env=fakes)
  assert wall < 60 and cpu < 60, (wall, cpu)
  base, array = submissions(fakes)  # the base policy (tmp_path/runs/base), then the points
  assert (base["array"], array["array"], array["dependency"]) == (None, "0-999",
                                                                 f"afterok:{base['job']}")
  m = mf.load(str(tmp_path / "sw"))
  assert [e.job_id for e in m.points] == [f"{array['job']}_{i}" for i in range(1000)]
  assert {e.status for e in m.points} == {mf.RUNNING}
  assert not os.path.exists(tmp_path / "sw" / mf.JOURNAL)  # sweep.json took it in at the end


def test_more_points_than_max_array_size_are_several_arrays(tmp_path, fakes):
  """MaxArraySize 4: ten points are arrays of task ids 0-3, 0-3 and 0-1; with --parallel each
  waits for the one before, so that two points at most run at once."""
  config = fake_sweep(tmp_path, 10)
  env = dict(fakes, FAKE_MAX_ARRAY_SIZE="4")
  launch(tmp_path, config, "--launcher=slurm", "--parallel=2", env=env)
  first, second, third = submissions(env)
  assert [s["array"] for s in (first, second, third)] == ["0-3%2", "0-3%2", "0-1%2"]
  assert [s["dependency"] for s in (first, second, third)] == [
      None, f"afterany:{first['job']}", f"afterany:{second['job']}"]
  m = mf.load(str(tmp_path / "sw"))
  jobs = [first["job"]] * 4 + [second["job"]] * 4 + [third["job"]] * 2
  assert [e.job_id for e in m.points] == [f"{j}_{i % 4}" for i, j in enumerate(jobs)]
  script = (tmp_path / "sw" / "slurm" / "points-2.sh").read_text()
  assert f"  1) run_dir={tmp_path / 'sw' / 'seed=5'}\n" in script  # task 1 of the second array
  assert "(point i is point 4 + i of the sweep" in script

  # The dry run shows the same three scripts; without --parallel the arrays run at once.
  out = subprocess.run([sys.executable, os.path.join(REPO, "launch", "sweep.py"),
                        f"--config={config}", "--sweep=scale", "--workdir=elsewhere",
                        "--launcher=slurm", "--dry_run"], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  assert re.findall(r"#SBATCH --array=(\S+)", out.stdout) == ["0-3", "0-3", "0-1"]
  assert "--dependency" not in out.stdout


def test_max_array_size_is_read_from_the_cluster_or_slurms_default(tmp_path, fakes,
                                                                    monkeypatch):
  monkeypatch.setenv("PATH", fakes["PATH"])
  monkeypatch.setenv("FAKE_MAX_ARRAY_SIZE", "40001")
  assert slurm_queue.max_array_size() == 40001
  broken = tmp_path / "broken"
  broken.mkdir()
  (broken / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_ctl_conf error: Unable to "
                                   "contact slurm controller' >&2\nexit 1\n")
  (broken / "scontrol").chmod(0o755)
  monkeypatch.setenv("PATH", str(broken))
  assert slurm_queue.max_array_size() == slurm_queue.DEFAULT_MAX_ARRAY_SIZE == 1001
  monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no scontrol at all
  assert slurm_queue.max_array_size() == 1001


@pytest.mark.slow(seconds=6)
@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_a_relaunch_when_every_point_is_done_is_quick_and_touches_nothing(tmp_path, fakes,
                                                                          launcher):
  config = grpo_sweep(tmp_path, 1000)
  bench.all_done(REPO, config, str(tmp_path / "sw"), 1000)
  launch(tmp_path, config, f"--launcher={launcher}", env=fakes)  # records them done
  before = bench.files(str(tmp_path / "sw"))
  time.sleep(0.05)
  wall, cpu = launch(tmp_path, config, f"--launcher={launcher}", env=fakes)
  assert bench.files(str(tmp_path / "sw")) == before  # no file written, made or removed
  assert cpu < 10, (wall, cpu)
  assert submissions(fakes) == []


def _manifest(tmp_path, n: int) -> mf.Manifest:
  m = mf.Manifest("w", "c", "local", str(tmp_path / "sw"))
  m.points = [mf.Entry(f"p{i}", {"i": i}, str(tmp_path / "sw" / f"p{i}")) for i in range(n)]
  m.save()
  return m


def test_a_status_change_appends_a_line_and_sweep_json_follows(tmp_path, monkeypatch):
  m = _manifest(tmp_path, 1000)
  path, journal = m.path, os.path.join(m.sweep_dir, mf.JOURNAL)
  snapshot = os.stat(path)
  for i, status in enumerate([mf.RUNNING, mf.DONE] * 50):  # 100 changes of 50 points
    e = m.points[i // 2]
    e.status, e.attempts = status, 1
    m.save([e])
  # sweep.json (~300 kB) is as it was: each change is a line of the journal.
  assert (os.stat(path).st_mtime_ns, os.stat(path).st_size) == (snapshot.st_mtime_ns,
                                                                snapshot.st_size)
  assert os.path.getsize(journal) < 100 * 400
  assert [e.status for e in mf.load(m.sweep_dir).points[:51]] == [mf.DONE] * 50 + [mf.PENDING]
  m.flush()  # not yet COMPACT_S since the first line: nothing
  assert os.path.exists(journal)
  monkeypatch.setattr(mf, "COMPACT_S", 0.0)
  m.flush()  # now sweep.json takes the journal in
  assert not os.path.exists(journal)
  with open(path) as f:
    assert [p["status"] for p in json.load(f)["points"][:51]] == [mf.DONE] * 50 + [mf.PENDING]


def test_a_torn_journal_line_is_left_alone(tmp_path):
  """A writer killed mid-line leaves half a line: readers skip it, the next writer starts a
  line of its own after it."""
  m = _manifest(tmp_path, 3)
  m.points[0].status = mf.RUNNING
  m.save([m.points[0]])
  with open(os.path.join(m.sweep_dir, mf.JOURNAL), "a") as f:
    f.write('{"t": 1, "point": {"name": "p1", "stat')
  assert mf.load(m.sweep_dir).points[1].status == mf.PENDING
  m.points[2].status = mf.FAILED
  m.save([m.points[2]])
  assert [e.status for e in mf.load(m.sweep_dir).points] == [mf.RUNNING, mf.PENDING, mf.FAILED]
  m.close()
  with open(m.path) as f:
    assert [p["status"] for p in json.load(f)["points"]] == ["running", "pending", "failed"]


def test_a_whole_save_with_nothing_changed_writes_nothing(tmp_path):
  m = _manifest(tmp_path, 10)
  before = bench.files(m.sweep_dir)
  time.sleep(0.05)
  m = mf.load(m.sweep_dir)
  m.save()
  m.close()
  assert bench.files(m.sweep_dir) == before

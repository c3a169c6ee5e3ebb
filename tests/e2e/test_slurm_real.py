"""The Slurm launcher against a real scheduler: the one-node cluster .ci/run starts
(.ci/slurm_cluster.sh: munged, slurmctld, slurmd as root, no accounting database, so sacct is
refused and the run directories decide). The points are tests/support/workers/fake_run.py
(rlscale's flags, checkpoint and exit statuses, a run of sleeps): what is tested is what only a
scheduler shows. tests/unit/sweep/test_slurm.py runs the same launcher against fakes, and a real
GRPO point as two processes.
"""

import os
import shutil
import subprocess
import time

import pytest

from tests.support import REPO
from tests.support.sweep_helpers import fake_run_flag, starts, statuses, sweep_cli

pytestmark = pytest.mark.slow(seconds=60)  # mostly waiting on the scheduler
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def cluster():
  if not shutil.which("sbatch"):
    pytest.skip("no Slurm here: .ci/run starts a one-node cluster (.ci/slurm_cluster.sh start)")
  up = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
  if up.returncode or not up.stdout.strip():
    pytest.skip(f"Slurm does not answer: {up.stderr.strip()}")
  return up.stdout.split()


def _queue() -> list[tuple[str, str, str]]:
  out = subprocess.run(["squeue", "-h", "-o", "%i %T %r"], capture_output=True, text=True,
                       check=True).stdout
  return [tuple(line.split()) for line in out.splitlines() if line.strip()]


def _drain(timeout=TIMEOUT_S) -> None:
  """Wait until the queue is empty. A job requeued after exit 75 waits ~2 minutes for its begin
  time (Slurm's guard against requeue loops); the test moves that to now."""
  end = time.time() + timeout
  while (jobs := _queue()) and time.time() < end:
    for job, state, reason in jobs:
      if state == "PENDING" and reason == "BeginTime":
        subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"],
                       capture_output=True)
    time.sleep(1)
  assert not jobs, jobs


def _launch(tmp_path, sweep, *flags, **kwargs):
  out = sweep_cli(tmp_path, sweep, "--launcher=slurm", fake_run_flag(), *flags, **kwargs)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout + out.stderr


def test_a_point_signalled_requeues_a_failed_one_is_resubmitted_nothing_else(cluster,
                                                                              tmp_path):
  """One array of three points: one runs through; one fails at run time and is resubmitted by
  the next launch, alone; one receives `scancel --signal=USR2` while it runs, saves, exits 75,
  requeues itself and resumes from its step. sacct is refused throughout."""
  err = _launch(tmp_path, "real_slurm")
  assert "submitted 3 points as job array" in err
  job = statuses(tmp_path)["seed=2,steps=300,delay=0.1"]["job_id"]
  log = tmp_path / "sw" / "seed=2,steps=300,delay=0.1" / "starts.txt"
  end = time.time() + TIMEOUT_S
  while not log.exists() and time.time() < end:
    time.sleep(0.5)
  time.sleep(3)  # a few steps in
  subprocess.run(["scancel", "--signal=USR2", job], check=True)
  _drain()
  first, resumed = starts(tmp_path, "seed=2,steps=300,delay=0.1")
  assert first[0] == "0" and int(resumed[0]) > 0 and resumed[4] == "1", (first, resumed)

  err = _launch(tmp_path, "real_slurm")  # reads the run directories: only seed=1 is missing
  assert "accounting storage is disabled" in err  # sacct refused: the run directories decide
  assert "submitted 1 point as job array" in err, err[-2000:]
  _drain()
  err = _launch(tmp_path, "real_slurm")
  assert "nothing to submit (3 done, 0 queued or running" in err, err[-2000:]
  got = statuses(tmp_path)
  assert [got[n]["status"] for n in sorted(got)] == ["done"] * 3
  assert got["seed=1,fail_times=1"]["attempts"] == 2
  assert [s[0] for s in starts(tmp_path, "seed=0")] == ["0"]  # never started again


def test_points_wait_for_their_base_policy_job_and_never_start_when_it_fails(cluster, tmp_path,
                                                                             monkeypatch):
  """A sweep of configs/grpo.py:tiny builds its base policy in a job of its own; the array
  depends on it (afterok): when the build fails, Slurm cancels the points before they start;
  the next launch submits the build and the points again, and they run."""
  monkeypatch.chdir(tmp_path)  # the base's cache, runs/base, is under the working directory
  config = os.path.join(REPO, "configs", "grpo.py") + ":tiny"
  env = dict(os.environ, FAKE_BASE_FAILS="1")  # sbatch hands the launcher's environment on
  err = _launch(tmp_path, "generation_batch", "--only=generation_batch=4$", config=config,
                env=env)
  assert "base policy" in err and "submitted 1 point" in err, err[-2000:]
  _drain()
  point = tmp_path / "sw" / "generation_batch=4"
  assert not (point / "starts.txt").exists()  # cancelled by its dependency, never run
  _launch(tmp_path, "generation_batch", "--only=generation_batch=4$", config=config)
  _drain()
  assert (point / "summary.json").exists()
  base_logs = list((tmp_path / "sw" / "slurm").glob("base-*.log"))
  assert len(base_logs) == 1 and base_logs[0].read_text().count("building the base policy") == 2

"""Run directories written by earlier commits still resume (tests/support/fixtures/old_runs/).

Each fixture is a finished 2-step `configs/grpo.py:tiny` run written by a commit whose run
format differs (ba4a25a: before run_format.json; 038b5a4: format 1). A user
extends it to 4 steps with the same command plus --allow_config_change=train.num_steps; the run
resumes from its step-2 checkpoint (through a migration where the format changed since) and the
steps it adds must be those the old code computed without a break.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support import REPO

FIXTURES = os.path.join(REPO, "tests", "support", "fixtures", "old_runs")
# The fixture's recipe (its README): the 60-step tiny SFT base, partial credit.
SFT = ("--config.init.sft_config=configs/sft.py:tiny,optim.warmup_responses=0,"
       "train.num_steps=60,train.eval_every=0,train.checkpoint_every=0")
MACHINE = ("time/", "memory/", "throughput/", "mfu/", "wall_time")


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _numbers(row):
  return {k: v for k, v in row.items() if not k.startswith(MACHINE)}


def _resume(tmp_path, commit: str, *flags: str):
  """A copy of the fixture of `commit` extended to 4 steps with `flags`: (its folder, the
  finished process). On one device, as it was written (the tests' 8 simulated devices would lay
  it out anew); from a folder of its own (the fixture's init.cache_dir is the relative
  runs/base)."""
  run = tmp_path / f"grpo_tiny_{commit}"
  shutil.copytree(os.path.join(FIXTURES, f"grpo_tiny_{commit}"), run)
  xla = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count"))
  env = dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS=xla)
  p = subprocess.run([sys.executable, os.path.join(REPO, "launch", "main.py"),
                      "--config=configs/grpo.py:tiny", "--config.task.partial_credit=True", SFT,
                      "--config.train.num_steps=4", *flags, f"--workdir={run}"],
                     cwd=tmp_path, env=env, capture_output=True, text=True)
  return run, p


# ba4a25a: run format 0 (no run_format.json); 038b5a4: format 1 (resolve/experiment.RUN_FORMAT).
COMMITS = ["ba4a25a", "038b5a4"]


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("commit", COMMITS)
def test_an_old_run_resumes_and_adds_the_steps_it_would_have_run(tmp_path, commit):
  run, p = _resume(tmp_path, commit, "--allow_config_change=train.num_steps")
  assert p.returncode == 0, p.stderr[-3000:]
  assert "resumed from the checkpoint of step 2" in p.stderr
  rows = _rows(run / "metrics.jsonl")
  golden = _rows(os.path.join(FIXTURES, "golden", f"grpo_tiny_4steps_{commit}.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
  old = _rows(os.path.join(FIXTURES, f"grpo_tiny_{commit}", "metrics.jsonl"))
  assert rows[:3] == old  # the rows it had are kept as they were
  for mine, theirs in zip(rows[3:], golden[3:]):
    a, b = _numbers(mine), _numbers(theirs)
    common = set(a) & set(b)
    assert set(b) <= set(a), sorted(set(b) - set(a))  # no metric of the old code is lost
    assert {k: a[k] for k in common} == {k: b[k] for k in common}, mine["step"]
  with open(run / "summary.json") as f:
    assert json.load(f)["step"] == 4


@pytest.mark.slow(seconds=30)
def test_a_checkpoint_without_decodes_in_flight_resumed_stale_is_one_line(tmp_path):
  """An old run resumed at rollout.max_staleness = 1 (the change allowed): its checkpoint
  holds no decodes in flight, and the error says so and what to do (before: "this config's
  model or optimizer state differs")."""
  _, p = _resume(tmp_path, "038b5a4", "--config.rollout.max_staleness=1",
                 "--allow_config_change=train.num_steps,rollout.max_staleness")
  assert p.returncode != 0
  last = p.stderr.strip().splitlines()[-1]
  assert "rollout.max_staleness=1" in last and "decodes in flight" in last, p.stderr[-2000:]
  assert "Traceback" not in p.stderr

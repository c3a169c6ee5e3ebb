"""The critical-batch probe end to end: a tiny chain-sum GRPO run branched at a kept step by
launch/cbs_probe.py, one branch killed and resumed, then its report."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import REPO


def _evals(run_dir, metric="eval/reference_logprob"):
  out = {}
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if metric in row:
        out[row["step"]] = row[metric]
  return out


@pytest.mark.slow(seconds=140)
def test_branches_start_from_the_kept_step_and_a_killed_one_resumes(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  # Its own base-policy cache: no other test builds the chain-sum recipe's base.
  cache = str(tmp_path / "base")
  # The parent: an entropy bonus moves the weights every step (the tiny model earns no reward).
  parent = str(tmp_path / "parent")
  subprocess.run([sys.executable, "-m", "rlscale",
                  f"--config={os.path.join(REPO, 'configs', 'grpo_chain_sum.py')}:tiny",
                  f"--workdir={parent}", f"--config.init.cache_dir={cache}",
                  "--config.train.num_steps=4", "--config.train.checkpoint_every=1",
                  "--config.train.keep_period=2", "--config.train.eval_every=1",
                  "--config.eval.reference=True", "--config.rl.entropy_coef=0.05",
                  # Adam's b1 = 0.5: a branch may be as short as 2 steps of the largest batch
                  "--config.optim.b1=0.5"],
                 check=True, env=env, cwd=tmp_path, capture_output=True, timeout=600)
  assert sorted(os.listdir(os.path.join(parent, "checkpoints"))) == ["2", "3", "4"]
  parent_evals = _evals(parent)
  assert len(set(parent_evals.values())) == 5  # steps 0-4: the weights moved every step

  argv = [sys.executable, os.path.join(REPO, "launch", "cbs_probe.py"), parent, "--at=2",
          "--batches=4,8,16", "--seeds=3", "--responses=32", "--evals=2", "--parallel=2",
          "--rates=1"]
  # First launch: stopped (SIGTERM, as a scheduler preempts) once a branch has saved a step.
  first = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  step_dir = os.path.join(parent, "probe", "step_2")
  killed, deadline = None, time.time() + 300
  while killed is None and time.time() < deadline and first.poll() is None:
    time.sleep(0.2)
    for name in sorted(os.listdir(step_dir)) if os.path.isdir(step_dir) else []:
      ckpt = os.path.join(step_dir, name, "checkpoints")
      done = os.path.exists(os.path.join(step_dir, name, "summary.json"))
      if not done and os.path.isdir(ckpt) and any(s.isdigit() for s in os.listdir(ckpt)):
        killed = name
        break
  assert killed, "no branch saved a checkpoint"
  first.send_signal(signal.SIGTERM)
  _, err = first.communicate(timeout=300)
  assert first.returncode == 75, err[-3000:]

  again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  with open(os.path.join(step_dir, "sweep.json")) as f:
    points = {p["name"]: p for p in json.load(f)["points"]}
  assert len(points) == 9 and all(p["status"] == "done" for p in points.values())
  assert points[killed]["attempts"] == 2
  with open(os.path.join(step_dir, killed, "launch.log")) as f:
    assert "resumed from the checkpoint of step" in f.read()
  for name in points:
    evals = _evals(os.path.join(step_dir, name))
    # Every branch starts from the parent's step 2 (not its base, not its last step).
    assert evals[0] == parent_evals[2] != parent_evals[4]
    # ... at its own rate (the sqrt rule from the parent's B = 16); the parent's schedule is
    # constant, so a decaying one's clock is tested in tests/unit/rl/test_optim.py instead.
    with open(os.path.join(step_dir, name, "config.json")) as f:
      cfg = json.load(f)
    b = cfg["rl"]["num_prompts"] * cfg["rl"]["group_size"]
    lr = _evals(os.path.join(step_dir, name), "actor/lr")[1]
    assert lr == pytest.approx(1e-4 * math.sqrt(b / 16), rel=1e-6)
    with open(os.path.join(step_dir, name, "checkpoints", str(32 // b),
                           "meta", "metadata")) as f:
      assert json.load(f)["trainer"]["prompt_offset"] == 2 * 4  # after the parent's 2 x P
    with open(os.path.join(step_dir, name, "summary.json")) as f:
      assert json.load(f)["responses_seen"] == 32
  with open(os.path.join(parent, "probe", "report", "probe.json")) as f:
    result = json.load(f)
  point = result["points"]["2"]
  assert point["n"] == [3, 3, 3]
  assert point["m0"] == pytest.approx(_evals(parent, "eval/reference_prob")[2], rel=1e-12)
  assert result["cost"]["by_step"]["2"]["of_parent_responses"] == pytest.approx(9 * 32 / 64)
  assert os.path.exists(os.path.join(parent, "probe", "report", "report.md"))


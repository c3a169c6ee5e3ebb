"""A real sweep end to end: launch/sweep.py runs tiny GRPO points, their base policy built once."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO



@pytest.mark.slow(seconds=50)
def test_tiny_sweep_runs_each_point_once(tmp_path):
  argv = [sys.executable, os.path.join(REPO, "launch", "sweep.py"),
          f"--config={os.path.join(REPO, 'configs', 'grpo.py')}:tiny", "--sweep=generation_batch",
          "--workdir=sw", "--only=generation_batch=(4|16)$", "--parallel=2"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # one CPU device per point
  out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-5000:]
  with open(tmp_path / "sw" / "sweep.json") as f:
    m = json.load(f)
  # The manifest lists the whole sweep; --only ran two of its three points.
  assert [(p["name"], p["status"], p["attempts"]) for p in m["points"]] == [
      ("generation_batch=4", "done", 1), ("generation_batch=8", "pending", 0),
      ("generation_batch=16", "done", 1)]
  m["points"] = [p for p in m["points"] if p["status"] == "done"]
  # The base policy was built once, before the points, which reused it.
  bases = [n for n in os.listdir(tmp_path / "runs" / "base") if not n.endswith(".lock")]
  assert len(bases) == 1, bases
  assert os.path.exists(tmp_path / "sw" / f"base-{bases[0]}.log")
  for p in m["points"]:
    with open(os.path.join(p["run_dir"] if os.path.isabs(p["run_dir"]) else
                           tmp_path / p["run_dir"], "launch.log")) as f:
      assert "base policy: reusing" in f.read()
    with open(tmp_path / "sw" / p["name"] / "summary.json") as f:
      summary = json.load(f)
    assert summary["step"] == 4
    assert summary["batch"]["generation_batch"] == int(p["name"].split("=")[1])

  again = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  with open(tmp_path / "sw" / "sweep.json") as f:
    assert [p["attempts"] for p in json.load(f)["points"]] == [1, 0, 1]  # nothing started
  assert "2/2 done" in again.stderr

"""What the launchers' tests share: launch/sweep.py as a user runs it, with the fake run
(tests/support/workers/fake_run.py) of the sweeps in tests/support/fixtures/fake_sweep_config.py."""

import json
import os
import subprocess
import sys

from tests.support import REPO, FIXTURES, WORKERS

FAKE_CONFIG = os.path.join(FIXTURES, "fake_sweep_config.py")
FAKE_RUN = [sys.executable, os.path.join(WORKERS, "fake_run.py")]


def sweep_cli(tmp_path, sweep, *flags, config=FAKE_CONFIG, env=None, wait=True):
  """`launch/sweep.py` into tmp_path/sw (the launcher and --run_command are in `flags`)."""
  argv = [sys.executable, os.path.join(REPO, "launch", "sweep.py"), f"--config={config}",
          f"--sweep={sweep}", f"--workdir={tmp_path / 'sw'}", *flags]
  env = env or dict(os.environ)
  if not wait:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
  return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)


def fake_run_flag() -> str:
  return "--run_command=" + " ".join(FAKE_RUN)


def manifest(tmp_path) -> dict:
  with open(tmp_path / "sw" / "sweep.json") as f:
    return json.load(f)


def statuses(tmp_path) -> dict:
  return {e["name"]: e for e in manifest(tmp_path)["points"]}


def starts(tmp_path, point) -> list[tuple[str, ...]]:
  """starts.txt of a point: [(step, 'procid/ntasks', localid, port, restart count), ...]."""
  with open(tmp_path / "sw" / point / "starts.txt") as f:
    return [tuple(line.split()[1:]) for line in f]

"""The cached SFT base policy: built once by runs started together, reused by the others."""

import os
import subprocess
import sys
import types

import pytest

from tests.support import REPO, WORKERS
from tests.support.process_env import free_port, process_env
from rlscale.run import base_policy
from rlscale.config import files as config_files

WORKER = os.path.join(WORKERS, "resolve_base_policy.py")


def _start(run_name, cache, out, num_peers, process=None):
  """One process; `process` = (coordinator port, count, index) for one of several of a run."""
  port, count, index = process or (None, 1, 0)
  env = process_env(port, count, index, devices=1)
  return subprocess.Popen([sys.executable, WORKER, run_name, str(cache), str(out), str(num_peers)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(procs):
  logs = {}
  for name, p in procs.items():
    logs[name], _ = p.communicate(timeout=600)
    assert p.returncode == 0, f"{name}:\n{logs[name][-4000:]}"
  return logs


def _sft_runs(out):
  with open(out / "sft_runs.txt") as f:
    return sorted(tuple(line.split()) for line in f)


def _policy(out, name):
  return (out / f"{name}.txt").read_text()


def _check_cache(cache, policy):
  assert os.path.isfile(os.path.join(policy, "COMPLETE"))
  assert os.path.dirname(policy) == os.path.join(cache, os.path.basename(os.path.dirname(policy)))
  folders = sorted(os.listdir(cache))
  name = os.path.basename(os.path.dirname(policy))
  assert folders == [name, name + ".lock"], folders  # one folder, its lock file beside it


@pytest.mark.slow
def test_two_runs_started_together_build_once(tmp_path):
  cache, out = tmp_path / "cache", tmp_path / "out"
  out.mkdir()
  logs = _finish({name: _start(name, cache, out, 2) for name in ("a", "b")})
  runs = _sft_runs(out)
  assert len(runs) == 1, runs  # exactly one SFT run for both
  builder = runs[0][0]
  waiter = "b" if builder == "a" else "a"
  assert _policy(out, "a.0") == _policy(out, "b.0")
  _check_cache(str(cache), _policy(out, "a.0"))
  assert "base policy: waiting for" in logs[waiter], logs[waiter][-4000:]
  assert "base policy: reusing" in logs[waiter]
  assert "base policy: building" in logs[builder]


@pytest.mark.slow
def test_a_two_process_run_and_another_run_build_once(tmp_path):
  """Only process 0 locks; the processes of a run agree whether to build (sft.run is a collective)."""
  cache, out = tmp_path / "cache", tmp_path / "out"
  out.mkdir()
  port = free_port()
  procs = {f"multi.{i}": _start("multi", cache, out, 3, (port, 2, i)) for i in range(2)}
  procs["single"] = _start("single", cache, out, 3)
  _finish(procs)
  runs = _sft_runs(out)
  assert runs in ([("multi", "0"), ("multi", "1")], [("single", "0")]), runs
  policies = {_policy(out, name) for name in ("multi.0", "multi.1", "single.0")}
  assert len(policies) == 1, policies
  _check_cache(str(cache), policies.pop())


def test_a_given_checkpoint_needs_no_build(tmp_path):
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  with cfg.unlocked():
    cfg.init.cache_dir = str(tmp_path / "cache")
    cfg.init.hf_checkpoint = str(tmp_path / "hf")
  run = types.SimpleNamespace(cfg=cfg)  # a Resolved's config (resolving would check the folder)
  assert base_policy.find_or_build(run) == str(tmp_path / "hf")
  assert not os.path.exists(tmp_path / "cache")  # no lock file either

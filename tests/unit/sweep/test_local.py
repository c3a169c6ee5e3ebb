"""Sweeps: declaration, names, checks before anything runs, and the local launcher.

The launcher tests run tests/support/workers/fake_run.py (a run of sleeps with rlscale's flags, lock,
checkpoint and exit codes) through `launch/sweep.py --run_command=...`; test_sweep_e2e.py runs
real tiny points.
"""

import os
import signal
import time

import pytest

from tests.support import REPO
from rlscale.config.errors import ConfigError
from rlscale.sweep import axes as sw
from rlscale.sweep.launchers import local
from rlscale.sweep import points
from rlscale.sweep import manifest as mf
from tests.support.sweep_helpers import FAKE_CONFIG, fake_run_flag, manifest, starts, sweep_cli


# --- declaration ---

def test_product_zip_chain():
  assert sw.product({"p": [1, 2]}, {"seed": [0, 1]}) == [
      {"p": 1, "seed": 0}, {"p": 1, "seed": 1}, {"p": 2, "seed": 0}, {"p": 2, "seed": 1}]
  assert sw.product({"p": [4, 2], "g": [2, 4]}, sw.fixed(lr=0.1)) == [
      {"p": 4, "g": 2, "lr": 0.1}, {"p": 2, "g": 4, "lr": 0.1}]
  assert sw.zip_axes({"p": [1, 2]}, {"g": [3, 4]}) == [{"p": 1, "g": 3}, {"p": 2, "g": 4}]
  assert sw.chain([{"p": 1}], [{"p": 2}]) == [{"p": 1}, {"p": 2}]
  with pytest.raises(ValueError, match="different lengths"):
    sw.zip_axes({"p": [1, 2], "g": [1]})
  with pytest.raises(ValueError, match="set by two axes"):
    sw.product({"p": [1]}, sw.fixed(p=2))
  with pytest.raises(ValueError, match="list of values"):
    sw.product({"p": 8})


def test_names_are_the_varying_overrides():
  pts = points.points(FAKE_CONFIG, "zipped", "/sw")
  assert [p.name for p in pts] == ["p=8,g=2", "p=4,g=4"]
  assert pts[0].run_dir == "/sw/p=8,g=2"
  assert pts[0].fields == {"rl.num_prompts": 8, "rl.group_size": 2}
  assert pts[0].config_args() == ["--config.rl.num_prompts=8", "--config.rl.group_size=2"]
  # What every point shares is left out of the name.
  assert [p.name for p in points.points(FAKE_CONFIG, "slow", "/sw")] == [
      "seed=0", "seed=1", "seed=2", "seed=3"]
  # Sections keep a key apart from another with the same last part.
  assert points.short_keys(["rl.num_minibatches", "critic.num_minibatches", "seed"]) == {
      "rl.num_minibatches": "rl.num_minibatches",
      "critic.num_minibatches": "critic.num_minibatches", "seed": "seed"}
  assert points.point_name({"optim.lr": 1e-4, "optim.lr_scaling": "sqrt"},
                           {"optim.lr", "optim.lr_scaling"}) == "lr=0.0001,lr_scaling=sqrt"
  long = points.point_name({f"k{i}": "x" * 20 for i in range(10)}, {f"k{i}" for i in range(10)})
  assert len(long) <= points.MAX_NAME


@pytest.mark.parametrize("sweep, message", [
    ("nope", "declares no such sweep; it declares after_edge, after_lr, bad_value, long, lr_edge"),
    ("unknown_field", "override 'rl.num_promts': rl has no field 'num_promts'"),
    ("bad_value", "override steps='many': steps cannot hold it"),
    ("same_dir", "have the same run directory 'p=4,seed=0'"),
])
def test_bad_sweeps_are_refused_naming_the_field(sweep, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    points.points(FAKE_CONFIG, sweep, "/sw")


def test_shipped_sweeps_are_valid():
  """Every sweep of every shipped config names real fields and distinct run directories."""
  for config, names in [("configs/grpo.py", ("batch_invariance", "group_vs_prompts",
                                             "generation_batch", "overlap", "staleness",
                                             "dynamic_sampling")),
                        ("configs/grpo_chain_sum.py", ("dynamic_sampling", "staleness")),
                        ("configs/ppo.py", ("actor_critic",))]:
    for arg in ("", ":tiny"):
      declared = points.declared(os.path.join(REPO, config) + arg)
      assert set(names) <= set(declared)
      # (the chain-sum study's other sweeps hold "{lr}", which only its study resolves)
      for name in names if "chain_sum" in config else declared:
        assert len(points.points(os.path.join(REPO, config) + arg, name, "/sw")) > 1
  full = points.points(os.path.join(REPO, "configs/grpo.py"), "batch_invariance", "/sw")
  assert len(full) == 8 * 2 * 3  # P 8..1024, two lr rules, three seeds
  assert {p.overrides["p"] for p in full} == {8, 16, 32, 64, 128, 256, 512, 1024}
  assert {p.overrides["responses"] for p in full} == {131072}
  for config in ("configs/grpo.py", "configs/grpo_chain_sum.py"):  # on/off x 3 P x 3 seeds
    ds = points.points(os.path.join(REPO, config), "dynamic_sampling", "/sw")
    assert len(ds) == 18 and {p.overrides["rollout.dynamic_sampling"] for p in ds} == {
        False, True}
    assert len({p.overrides["p"] for p in ds}) == 3 and {p.overrides["seed"] for p in ds} == {
        0, 1, 2}
  pairs = points.points(os.path.join(REPO, "configs/grpo.py"), "group_vs_prompts", "/sw")
  assert {p.overrides["p"] * p.overrides["g"] for p in pairs} == {512}


def test_cli_refuses_bad_input_in_one_line(tmp_path):
  out = sweep_cli(tmp_path, "unknown_field")
  assert out.returncode == 2, out.stderr
  assert out.stderr.strip().splitlines()[-1].startswith("error: override 'rl.num_promts'")
  assert not os.listdir(tmp_path)  # nothing ran, no manifest


# --- the local launcher ---

def test_device_slots():
  assert local.device_slots(2, gpus=["0", "1", "2", "3"]) == [{"gpus": ["0", "1"]},
                                                              {"gpus": ["2", "3"]}]
  assert local.device_slots(2, gpus=[], cores=[0, 1, 2, 3]) == [{"cores": [0, 1]},
                                                               {"cores": [2, 3]}]
  assert local.device_slots(3, gpus=[], cores=[0, 1]) == [{"cores": [0]}, {"cores": [1]},
                                                         {"cores": [0]}]
  with pytest.raises(ConfigError, match="--parallel=3 runs need at least as many GPUs"):
    local.device_slots(3, gpus=["0", "1"])


def _sweep(tmp_path, name, *flags, wait=True):
  return sweep_cli(tmp_path, name, fake_run_flag(), *flags, wait=wait)


def _steps(tmp_path, name):
  """The step each start of the point began at."""
  return [s[0] for s in starts(tmp_path, name)]


def test_a_manifest_that_says_done_without_a_summary_is_not_believed(tmp_path):
  """Hand-edited or stale: the run directory decides. A point with a run directory (maybe a
  checkpoint) resumes; one without starts."""
  pts = points.points(FAKE_CONFIG, "three", str(tmp_path))
  m = mf.open_sweep(str(tmp_path), "three", FAKE_CONFIG, "local", pts)
  for e in m.points:
    e.status = mf.DONE
  m.save()
  os.makedirs(pts[1].run_dir)
  m = mf.open_sweep(str(tmp_path), "three", FAKE_CONFIG, "local", pts)
  assert [e.status for e in m.points] == ["pending", "preempted", "pending"]
  assert "said done without summary.json" in m.points[0].error[0]
  assert m.counts()["done"] == 0


def test_points_from_a_checkpoint_need_no_base(tmp_path):
  """init.hf_checkpoint or model.hf_checkpoint: the checkpoint is the base; none is built."""
  from rlscale.sweep.points import Point, base_key
  config = os.path.join(REPO, "configs", "grpo.py:tiny")
  assert base_key(config, Point("a", {}, {}, str(tmp_path / "a"))) is not None
  for field in ("init.hf_checkpoint", "model.hf_checkpoint"):
    point = Point("a", {field: str(tmp_path)}, {field: str(tmp_path)}, str(tmp_path / "a"))
    assert base_key(config, point) is None


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_a_failed_point_never_stops_the_sweep_and_is_retried(tmp_path):
  out = _sweep(tmp_path, "one_fails", "--parallel=2")
  assert out.returncode == 1, out.stderr
  m = manifest(tmp_path)
  assert [(p["name"], p["status"]) for p in m["points"]] == [
      ("seed=0", "done"), ("seed=1", "done"), ("seed=2,fail_times=2", "failed")]
  assert m["sweep"] == "one_fails" and m["launcher"] == "local" and m["git_commit"]
  failed = m["points"][2]
  assert failed["returncode"] == 3 and failed["error"][0].startswith("exited 3;")
  assert failed["error"][-1] == "ValueError: this point is broken"
  assert "failed: seed=2,fail_times=2: exited 3" in out.stderr

  again = _sweep(tmp_path, "one_fails", "--parallel=2")
  assert again.returncode == 1
  assert _steps(tmp_path, "seed=0") == ["0"]  # done: not started again
  assert _steps(tmp_path, "seed=2,fail_times=2") == ["0", "0"]  # retried
  assert manifest(tmp_path)["points"][2]["attempts"] == 2


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_preempted_point_resumes_from_its_checkpoint(tmp_path):
  out = _sweep(tmp_path, "preempted_once")
  assert out.returncode == 75, out.stderr
  assert manifest(tmp_path)["points"][0]["status"] == "preempted"
  out = _sweep(tmp_path, "preempted_once")
  assert out.returncode == 0, out.stderr
  assert _steps(tmp_path, "seed=0,preempt_at=2") == ["0", "2"]
  assert manifest(tmp_path)["points"][0]["status"] == "done"


def test_another_sweep_in_the_same_directory_is_refused(tmp_path):
  assert _sweep(tmp_path, "preempted_once").returncode == 75
  out = _sweep(tmp_path, "three")
  assert out.returncode == 2
  assert "holds sweep 'preempted_once'" in out.stderr


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_killed_launcher_loses_nothing(tmp_path, how):
  """Stop the launcher while two points run: they save; the re-run starts none from scratch
  and finishes all (SIGKILL: the kernel's PDEATHSIG tells the runs)."""
  proc = _sweep(tmp_path, "slow", "--parallel=2", wait=False)
  deadline = time.time() + 60
  while time.time() < deadline:
    if os.path.exists(tmp_path / "sw" / "sweep.json"):
      steps = [tmp_path / "sw" / f"seed={i}" / "step" for i in (0, 1)]
      if all(os.path.exists(s) for s in steps):
        break
    time.sleep(0.1)
  os.kill(proc.pid, getattr(signal, how))
  out, _ = proc.communicate(timeout=60)
  if how == "SIGTERM":
    assert proc.returncode == 75, out
    statuses = [p["status"] for p in manifest(tmp_path)["points"]]
    assert statuses[:2] == ["preempted", "preempted"] and statuses[2:] == ["pending", "pending"]
  again = _sweep(tmp_path, "slow", "--parallel=2")
  assert again.returncode == 0, again.stderr
  for i in range(4):
    steps = _steps(tmp_path, f"seed={i}")
    assert steps.count("0") == 1, (i, steps)
  for i in (0, 1):  # resumed from their checkpoints
    assert len(_steps(tmp_path, f"seed={i}")) == 2
  assert all(p["status"] == "done" for p in manifest(tmp_path)["points"])
  again = _sweep(tmp_path, "slow", "--parallel=2")
  assert again.returncode == 0
  assert all(len(_steps(tmp_path, f"seed={i}")) <= 2 for i in range(4))  # nothing ran


def test_manifest_rebuilt_from_run_directories(tmp_path):
  """A point whose run directory holds summary.json is done, whatever the manifest said."""
  pts = points.points(FAKE_CONFIG, "three", str(tmp_path))
  m = mf.open_sweep(str(tmp_path), "three", FAKE_CONFIG, "local", pts)
  m.save()
  os.makedirs(pts[1].run_dir)
  with open(os.path.join(pts[1].run_dir, "summary.json"), "w") as f:
    f.write("{}")
  m = mf.open_sweep(str(tmp_path), "three", FAKE_CONFIG, "local", pts)
  assert [e.status for e in m.points] == ["pending", "done", "pending"]
  line = mf.progress_line(m, time.time() - 65, [30.0], 2)
  assert line == "sweep three: 1/3 done, 0 running, 2 pending | 1m05s elapsed, ETA 0m30s"


@pytest.mark.slow  # heavy for the default run (README); .ci/run runs it
def test_only_runs_a_subset_and_the_manifest_keeps_the_rest(tmp_path):
  assert _sweep(tmp_path, "three", "--only=seed=0").returncode == 0
  statuses = [(p["name"], p["status"]) for p in manifest(tmp_path)["points"]]
  assert statuses == [("seed=0", "done"), ("seed=1", "pending"), ("seed=2", "pending")]
  # A launch of another subset keeps the first one's entries (it writes only its own).
  pts = points.points(FAKE_CONFIG, "three", str(tmp_path / "sw"))
  m = mf.open_sweep(str(tmp_path / "sw"), "three", FAKE_CONFIG, "local", pts, {"seed=2"})
  m.entry("seed=0").status = "failed"  # not this launch's to write
  m.entry("seed=2").status = "running"
  m.save()
  statuses = [p["status"] for p in manifest(tmp_path)["points"]]
  assert statuses == ["done", "pending", "running"]
  out = _sweep(tmp_path, "three")
  assert out.returncode == 0, out.stderr
  assert [len(_steps(tmp_path, f"seed={i}")) for i in range(3)] == [1, 1, 1]

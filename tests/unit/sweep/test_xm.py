"""The XManager launcher: each work unit's job (against xmanager's mock), and a real sweep through
xm_local's executor with tests/support/workers/fake_run.py standing in for `python -m rlscale`.

HOME is a fresh directory in every test: a sweep must write nothing there (xm_local's database
goes to the sweep directory).
"""

import os
import sys

import pytest

pytest.importorskip("xmanager")

from xmanager import xm, xm_mock  # noqa: E402

from rlscale.config.errors import ConfigError  # noqa: E402
from rlscale.sweep import manifest as mf  # noqa: E402
from rlscale.sweep import points  # noqa: E402
from rlscale.sweep.launchers import xm as xm_launcher  # noqa: E402

from tests.support.sweep_helpers import FAKE_CONFIG, fake_run_flag, manifest, starts, sweep_cli  # noqa: E402


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
  path = tmp_path / "home"
  path.mkdir()
  monkeypatch.setenv("HOME", str(path))
  return path


def test_each_work_unit_runs_its_point(tmp_path):
  pts = points.points(FAKE_CONFIG, "zipped", str(tmp_path / "sw"))
  experiment = xm_mock.MockExperiment()
  with experiment:
    [executable] = experiment.package([xm_launcher.packageable()])
    for job in xm_launcher.jobs(FAKE_CONFIG, pts, ["python", "-m", "rlscale"], executable,
                                xm_mock.MockExecutor()).values():
      experiment.add(job)
  assert sorted(experiment.work_units) == [1, 2]
  argvs = [j.args.to_list(xm.utils.ARGV_ESCAPER) for j in experiment.launched_jobs]
  sw = tmp_path / "sw"
  assert argvs == [
      ["python", "-m", "rlscale", f"--config={FAKE_CONFIG}", f"--workdir={sw}/p=8,g=2",
       "--config.rl.num_prompts=8", "--config.rl.group_size=2"],
      ["python", "-m", "rlscale", f"--config={FAKE_CONFIG}", f"--workdir={sw}/p=4,g=4",
       "--config.rl.num_prompts=4", "--config.rl.group_size=4"]]
  assert [j.env_vars for j in experiment.launched_jobs] == [
      {xm_launcher.LOG_VAR: f"{sw}/p=8,g=2/launch.log"},
      {xm_launcher.LOG_VAR: f"{sw}/p=4,g=4/launch.log"}]


def test_dry_run_prints_a_line_per_work_unit(tmp_path):
  pts = points.points(FAKE_CONFIG, "three", str(tmp_path / "sw"))
  m = mf.Manifest("three", FAKE_CONFIG, "xm", str(tmp_path / "sw"))
  m.points = [mf.Entry(p.name, p.overrides, p.run_dir) for p in pts]
  launcher = xm_launcher.XMLauncher(FAKE_CONFIG, m, pts, parallel=2, command=["run"],
                                    slots=[{"gpus": ["0"]}, {"gpus": ["1"]}])
  lines = launcher.dry_run().splitlines()
  assert len(lines) == 5 and lines[-1] == "# 3 points, 2 at a time on: gpus=0, gpus=1"
  assert lines[1] == (f"run --config={FAKE_CONFIG} --workdir={tmp_path}/sw/seed=0 "
                      f"--config.seed=0 >> {tmp_path}/sw/seed=0/launch.log")
  # A point's devices are its slot's, set as it starts.
  job = xm_launcher.job(None, None, ["run"], "log", {"gpus": ["2", "3"]})
  assert job.env_vars["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_without_xmanager_the_launcher_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "xmanager", None)
  with pytest.raises(ConfigError, match=r"pip install 'rlscale\[xm\]'"):
    xm_launcher.XMLauncher(FAKE_CONFIG, None, [])


def _sweep(tmp_path, name, *flags):
  return sweep_cli(tmp_path, name, fake_run_flag(), "--launcher=xm", *flags)


def test_local_executor_runs_the_sweep_and_a_rerun_skips_done_points(tmp_path, home):
  out = _sweep(tmp_path, "one_fails", "--parallel=2")
  assert out.returncode == 1, out.stderr
  m = manifest(tmp_path)
  assert m["launcher"] == "xm"
  assert [(p["name"], p["status"]) for p in m["points"]] == [
      ("seed=0", "done"), ("seed=1", "done"), ("seed=2,fail_times=2", "failed")]
  ids = [p["job_id"] for p in m["points"]]  # <experiment id>/<work unit id>
  assert len({i.split("/")[0] for i in ids}) == 1 and sorted(i.split("/")[1] for i in ids) == [
      "1", "2", "3"]
  failed = m["points"][2]
  assert failed["returncode"] == 3 and failed["error"][0].startswith("exited 3;")
  assert failed["error"][-1] == "ValueError: this point is broken"
  assert "failed: seed=2,fail_times=2: exited 3" in out.stderr
  with open(tmp_path / "sw" / "seed=0" / "launch.log") as f:
    assert f.read().rstrip().endswith("done")
  assert os.path.exists(tmp_path / "sw" / "xm" / "experiments.sqlite3")
  assert os.listdir(home) == []

  again = _sweep(tmp_path, "one_fails", "--parallel=2")
  assert again.returncode == 1, again.stderr
  assert [s[0] for s in starts(tmp_path, "seed=0")] == ["0"]  # done: no work unit
  assert [s[0] for s in starts(tmp_path, "seed=2,fail_times=2")] == ["0", "0"]  # retried
  m2 = manifest(tmp_path)
  assert m2["points"][2]["attempts"] == 2 and m2["points"][0]["job_id"] == ids[0]
  assert m2["points"][2]["job_id"].split("/")[1] == "1"  # the only unit of a new experiment
  assert os.listdir(home) == []


def test_a_units_exit_status_becomes_its_points_status(tmp_path):
  pts = points.points(FAKE_CONFIG, "three", str(tmp_path / "sw"))
  m = mf.open_sweep(str(tmp_path / "sw"), "three", FAKE_CONFIG, "xm", pts)
  launcher = xm_launcher.XMLauncher(FAKE_CONFIG, m, pts, slots=[{}])
  e = m.points[0]
  e.started = 0.0
  launcher._finish(e, 75)
  assert e.status == "preempted"
  launcher._finish(e, 0)
  assert e.status == "failed" and e.error[0].startswith("exited 0 without writing summary.json")
  os.makedirs(e.run_dir)
  open(os.path.join(e.run_dir, "summary.json"), "w").close()
  launcher._finish(e, 0)
  assert (e.status, e.error) == ("done", [])

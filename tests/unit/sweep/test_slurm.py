"""The Slurm launcher, offline: fake sbatch, srun, squeue, sacct and scontrol (tests/support/fake_slurm/)
run each job here, at once, with Slurm's variables, and keep the jobs' states in a JSON file.

The points are tests/support/workers/fake_run.py (a run of sleeps with rlscale's flags, checkpoint
and exit statuses), except in the slow test: a real GRPO point as two processes of one JAX job,
whose metrics must match the same run in one process.
"""

import json
import os
import subprocess

import pytest

from tests.support import REPO, FIXTURES, FAKE_SLURM
from rlscale.config.errors import ConfigError
from rlscale.sweep import manifest as mf
from rlscale.sweep import points
from rlscale.sweep.launchers import slurm, slurm_config, slurm_queue, slurm_settings
from tests.support.sweep_helpers import FAKE_CONFIG, FAKE_RUN, starts, statuses, sweep_cli

FAKES = FAKE_SLURM


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
  """The fakes first on PATH, their state in tmp_path; returns a reader of that state."""
  monkeypatch.setenv("PATH", FAKES + os.pathsep + os.environ["PATH"])
  monkeypatch.setenv("FAKE_SLURM_STATE", str(tmp_path / "slurm.json"))
  monkeypatch.chdir(tmp_path)

  def state():
    with open(tmp_path / "slurm.json") as f:
      return json.load(f)
  return state


def slurm_cli(tmp_path, sweep, *flags, **kwargs):
  """`launch/sweep.py --launcher=slurm` as a user runs it (the fakes' environment)."""
  return sweep_cli(tmp_path, sweep, "--launcher=slurm", *flags, **kwargs)


def launcher(tmp_path, sweep, config=FAKE_CONFIG, parallel=0, **settings):
  s = slurm_config.get_config()
  s.update(settings)
  pts = points.points(config, sweep, str(tmp_path / "sw"))
  m = mf.open_sweep(str(tmp_path / "sw"), sweep, config, "slurm", pts)
  return slurm.SlurmLauncher(config, m, pts, parallel=parallel, command=FAKE_RUN, settings=s)


# --- the scripts ---

def test_dry_run_prints_the_scripts_with_the_resources(tmp_path, fake_slurm):
  # fake_slurm: the dry run asks scontrol for MaxArraySize, and the fake answers at once (a
  # real client whose controller is down takes ~10 s to say nothing).
  config = os.path.join(REPO, "configs", "grpo.py:tiny")
  text = launcher(tmp_path, "batch_invariance", config, parallel=4, nodes=2, gpus_per_node=8,
                  tasks_per_node=8, cpus_per_task=6, partition="gpu", time="1-00:00:00",
                  account="rl", qos="high", mem="200G", signal_seconds=600,
                  setup="module load cuda/12.4\nsource venv/bin/activate",
                  sbatch_args="--exclusive", srun_args="--cpu-bind=none").dry_run()
  base, array = text.split("#!/bin/bash")[1:]
  for line in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=6",
               "--partition=gpu", "--time=1-00:00:00", "--account=rl", "--qos=high",
               "--mem=200G", "--signal=USR2@600", "--requeue", "--exclusive",
               "--array=0-11%4", "--kill-on-invalid-dep=yes", "--open-mode=append"):
    assert f"#SBATCH {line}\n" in array, line
  assert "module load cuda/12.4\nsource venv/bin/activate\n" in array
  assert "srun --nodes=2 --ntasks=16 --ntasks-per-node=8 --wait=300 --cpu-bind=none" in array
  assert "export JAX_LOCAL_DEVICE_IDS" not in array  # one process per GPU: SLURM_LOCALID's
  assert "scontrol requeue" in array and '-eq 75' in array
  # The base policy: one process on one node, with the node's GPUs and cores, submitted first.
  assert "#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n" in base
  assert "#SBATCH --cpus-per-task=48\n" in base and "--base_policy_only)" in base
  assert "srun --nodes=1 --ntasks=1" in base
  assert "sbatch --parsable --dependency=afterok:<base job 1> " in text
  for script in (base, array):
    check = subprocess.run(["bash", "-n"], input="#!/bin/bash" + script, text=True,
                           capture_output=True)
    assert check.returncode == 0, check.stderr
  pts = points.points(config, "batch_invariance", str(tmp_path / "sw"))
  assert f"  11) run_dir={pts[11].run_dir}\n" in array
  assert " ".join(pts[11].config_args()) + ") ;;" in array

  # One process per node: it drives all of its node's GPUs.
  text = launcher(tmp_path, "two", gpus_per_node=4).dry_run()
  assert "export JAX_LOCAL_DEVICE_IDS=0,1,2,3" in text and "--dependency" not in text
  assert "#SBATCH --array=0-1\n" in text  # --parallel=0: no limit


@pytest.mark.parametrize("settings, message", [
    ({"nodes": 0}, "--slurm.nodes=0: must be an integer >= 1"),
    ({"gpus_per_node": 8, "tasks_per_node": 4}, "--slurm.tasks_per_node=4: with gpus_per_node=8, "
                                                "give 1"),
    ({"time": "4 hours"}, "--slurm.time='4 hours': give minutes or"),
    ({"time": "4", "signal_seconds": 300}, "--slurm.time='4': the runs are signalled"),
    ({"mem": "lots"}, "--slurm.mem='lots': give a size"),
    ({"partition": "gpu a100"}, "--slurm.partition='gpu a100': letters"),
    ({"sbatch_args": "--reservation big"}, "--slurm.sbatch_args='--reservation big': 'big' is "
                                           "not an option"),
    ({"signal_seconds": -1}, "--slurm.signal_seconds=-1: must be an integer >= 0"),
])
def test_bad_settings_are_refused_naming_the_field(settings, message):
  s = slurm_config.get_config()
  s.update(settings)
  with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
    slurm_settings.check(s)


def test_a_site_file_needs_every_field():
  s = slurm_config.get_config()
  del s["qos"]
  s.gpu_type = "h100"
  with pytest.raises(ConfigError, match="--slurm: the settings lack qos and have unknown "
                                        "gpu_type; start a site file from"):
    slurm_settings.check(s)


def test_times_and_array_specs():
  assert [slurm_settings.time_seconds(t) for t in ("30", "30:15", "4:00:00", "1-2", "1-00:01",
                                          "2-00:00:05")] == [1800, 1815, 14400, 93600, 86460,
                                                             172805]
  assert slurm_queue.array_spec([0, 1, 2, 4, 6, 7], 3) == "0-2,4,6-7%3"
  assert slurm_queue.expand_array("12_[0-2,5%2]") == ["12_0", "12_1", "12_2", "12_5"]
  assert slurm_queue.expand_array("12_3") == ["12_3"]


def test_command_line_settings_and_mistakes(tmp_path, fake_slurm):
  """A site file (--slurm=FILE) with single fields overridden; an unknown field in one line."""
  with open(slurm_config.__file__) as f:
    site = f.read().replace('c.partition = ""', 'c.partition = "site"')
  (tmp_path / "mysite.py").write_text(site.replace('c.account = ""', 'c.account = "lab"'))
  out = slurm_cli(tmp_path, "two", "--dry_run", f"--slurm={tmp_path / 'mysite.py'}",
                  "--slurm.partition=debug", "--slurm.nodes=2", "--slurm.tasks_per_node=2",
                  "--parallel=1")
  assert out.returncode == 0, out.stderr
  assert "#SBATCH --partition=debug\n#SBATCH --account=lab\n" in out.stdout
  assert "#SBATCH --array=0-1%1\n" in out.stdout
  assert "srun --nodes=2 --ntasks=4 --ntasks-per-node=2" in out.stdout
  out = slurm_cli(tmp_path, "two", "--dry_run", "--slurm.nodez=2")
  assert (out.returncode, out.stderr.strip()) == (2, "error: Unknown command line flag "
                                                     "'slurm.nodez'")
  assert not os.path.exists(tmp_path / "sw")


# --- submitting and following, with the fakes ---

def test_sweep_submits_requeues_and_retries(tmp_path, fake_slurm):
  """seed=0 runs through; seed=1 fails (then succeeds when retried); seed=2 exits 75 once and
  its task requeues itself and resumes from the checkpoint."""
  run = ["--run_command=" + " ".join(FAKE_RUN), "--parallel=2"]
  out = slurm_cli(tmp_path, "mixed", *run)
  assert out.returncode == 1, out.stderr  # a point failed
  assert "submitted 3 points as job array 1000" in out.stdout
  got = statuses(tmp_path)
  assert {k: (e["status"], e["job_id"]) for k, e in got.items()} == {
      "seed=0": ("done", "1000_0"), "seed=1,fail_times=1": ("failed", "1000_1"),
      "seed=2,preempt_at=2": ("done", "1000_2")}
  error = got["seed=1,fail_times=1"]["error"]
  assert error[0].startswith("slurm job 1000_1 FAILED (exit 3); ")
  assert "ValueError: this point is broken" in error
  # Requeued: the second start resumed at step 2, restart count 1.
  assert [(s[0], s[-1]) for s in starts(tmp_path, "seed=2,preempt_at=2")] == [("0", "0"),
                                                                            ("2", "1")]
  assert fake_slurm()["submissions"][0]["options"]["array"] == "0-2%2"
  log = open(tmp_path / "sw" / "seed=2,preempt_at=2" / "launch.log").read()
  assert "# preempted (exit 75): requeueing 1000_2" in log

  # Again: only the failed point is submitted, and now it runs through.
  out = slurm_cli(tmp_path, "mixed", *run)
  assert out.returncode == 0, out.stderr
  assert fake_slurm()["submissions"][1]["options"]["array"] == "1%2"
  got = statuses(tmp_path)
  assert [e["status"] for e in got.values()] == ["done"] * 3
  assert got["seed=1,fail_times=1"]["job_id"] == "1004_1"
  assert got["seed=1,fail_times=1"]["attempts"] == 2
  assert len(starts(tmp_path, "seed=0")) == 1


def test_queued_jobs_are_left_alone_and_states_read(tmp_path, fake_slurm):
  lc = launcher(tmp_path, "mixed")
  jobs = {"500_0": ("RUNNING", "0:0"), "500_1": ("PENDING", "0:0"),
          "501_2": ("FAILED", "75:0")}  # a run that ran out of requeues: preempted
  with open(tmp_path / "slurm.json", "w") as f:
    json.dump({"next_id": 600, "submissions": [], "jobs": {
        k: {"state": s, "exit": e, "elapsed": 5, "restarts": 0} for k, (s, e) in jobs.items()}},
        f)
  for e, job in zip(lc.m.points, jobs):
    e.status, e.job_id = mf.RUNNING, job
  lc.refresh()
  assert [e.status for e in lc.m.points] == ["running", "running", "preempted"]
  assert lc.m.points[2].duration_s == 5
  lc.run()
  assert [s["tasks"] for s in fake_slurm()["submissions"]] == [[2]]
  assert [(e.status, e.job_id) for e in lc.m.points] == [
      ("running", "500_0"), ("running", "500_1"), ("done", "600_2")]

  # Slurm no longer knows the running ones: they are submitted again (seed=1 fails once).
  with open(tmp_path / "slurm.json", "w") as f:
    json.dump({"next_id": 700, "submissions": [], "jobs": {}}, f)
  lc.run()
  assert [s["tasks"] for s in fake_slurm()["submissions"]] == [[0, 1]]
  assert [e.status for e in lc.m.points] == ["done", "failed", "done"]


def test_base_policy_job_first_and_its_failure(tmp_path, fake_slurm, monkeypatch):
  """Points with a base policy wait for its one job (afterok); when it fails they are cancelled
  and reported failed, with the base job's log."""
  key = str(tmp_path / "cache" / "sft-0123")
  monkeypatch.setattr(points, "base_key", lambda config, point: key)
  lc = launcher(tmp_path, "two")
  monkeypatch.setenv("FAKE_BASE_FAILS", "1")
  assert lc.run()["failed"] == 2
  base, array = fake_slurm()["submissions"]
  assert base["options"]["ntasks-per-node"] == "1" and base["tasks"] == [None]
  assert array["options"]["dependency"] == f"afterok:{base['job']}"
  assert fake_slurm()["jobs"][array["job"] + "_0"]["state"] == "CANCELLED"
  error = lc.m.points[0].error[0]
  assert error.startswith(f"slurm job {array['job']}_0 CANCELLED before its run started (did "
                          "its base policy fail? ")
  log = tmp_path / "sw" / "slurm" / "base-sft-0123.log"
  assert error.endswith(f"{log})") and "building the base policy" in log.read_text()

  monkeypatch.delenv("FAKE_BASE_FAILS")
  assert lc.run()["done"] == 2


def test_two_process_point_gets_slurm_variables(tmp_path, fake_slurm):
  launcher(tmp_path, "two", tasks_per_node=2).run()
  got = sorted(starts(tmp_path, "seed=0"), key=lambda s: s[1])
  assert [s[1:3] for s in got] == [("0/2", "0"), ("1/2", "1")]
  assert got[0][3] == got[1][3] != "None"  # one coordinator port


def test_signal_before_the_time_limit_requeues_and_resumes(tmp_path, fake_slurm, monkeypatch):
  """SIGUSR2 (--signal) reaches the run, which saves and exits 75; the task requeues itself."""
  monkeypatch.setenv("FAKE_SLURM_PREEMPT_AFTER", "1")  # the run takes 2 s
  lc = launcher(tmp_path, "long")
  assert lc.run()["done"] == 1
  (first, *_, r0), (resumed, *_, r1) = starts(tmp_path, "seed=0,steps=40,delay=0.05")
  assert (first, r0, r1) == ("0", "0", "1") and 0 < int(resumed) < 40
  assert fake_slurm()["jobs"]["1000_0"]["restarts"] == 1


# --- a real point as two processes of one JAX job ---

@pytest.mark.slow(seconds=110)
def test_two_process_point_matches_one_process(tmp_path, grpo_single_process_run):
  """The tiny GRPO run of test_distributed.py as a sweep point of 2 Slurm tasks with 4 CPU
  devices each: one jax.distributed job whose metrics match the 8-device single process."""
  from tests.integration.test_distributed import check_like_one
  one = grpo_single_process_run
  config = os.path.join(FIXTURES, "slurm_grpo_config.py") + ":" + one.cache_dir
  env = dict(os.environ, PATH=FAKES + os.pathsep + os.environ["PATH"],
             FAKE_SLURM_STATE=str(tmp_path / "slurm.json"), JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  out = slurm_cli(tmp_path, "two_process", "--slurm.tasks_per_node=2", config=config, env=env)
  run_dir = tmp_path / "sw" / "num_steps=2"
  log = open(run_dir / "launch.log").read() if os.path.exists(run_dir / "launch.log") else ""
  assert out.returncode == 0, out.stdout + out.stderr + log[-5000:]
  assert statuses(tmp_path)["num_steps=2"]["status"] == "done"
  assert "jax.distributed: process 1 of 2, 4 local of 8 devices" in log
  assert log.count("base policy: reusing") == 2  # no second base is built
  check_like_one("grpo.py", one.run_dir, str(run_dir), one.summary)


@pytest.mark.parametrize("killed", [0, 1])
def test_a_point_of_several_processes_requeues_when_one_was_lost(tmp_path, killed):
  """srun returns the highest task status: a SIGKILLed process's 137 beside the survivor's 75.
  Each process records its own (supervise.record_exit), and the job requeues on any 75."""
  import sys
  import types
  task = ("import os, signal, sys; from rlscale.run import supervise; "
          f"me = int(os.environ['SLURM_PROCID']); killed = {killed}; "
          "os.kill(os.getpid(), signal.SIGKILL) if me == killed else None; "
          "supervise.record_exit(75); sys.exit(75)")
  fake = types.SimpleNamespace(s=types.SimpleNamespace(srun_args="", max_requeues=3,
                                                       gpus_per_node=0))
  lines = slurm.SlurmLauncher._launch(fake, "12_0", 1, 2)
  script = "\n".join(["scontrol() { echo \"scontrol $*\"; }", f"run_dir={tmp_path}/run",
                      f"argv=({sys.executable} -c {json.dumps(task)})", *lines])
  env = dict(os.environ, PATH=FAKE_SLURM + os.pathsep + os.environ["PATH"], PYTHONPATH=REPO)
  out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                       timeout=120)
  assert out.returncode == 75, out.stdout + out.stderr
  assert "scontrol requeue 12_0" in out.stdout
  statuses = {f.name: f.read_text().strip() for f in (tmp_path / "run" / ".task_exit").iterdir()}
  assert statuses == {str(1 - killed): "75"}

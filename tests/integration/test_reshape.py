"""A run resumed on another layout (issue 47, class 2): a Slurm requeue may land on fewer or
more devices and hosts. A checkpoint saved on 8 devices resumes on 4, and one saved by 2
processes resumes in 1, through orbax's resharding; a layout the batch plan cannot honour is
refused in one line naming both.

What is bit-identical, and what is held to a tolerance, against the same run never stopped
(conftest's grpo_single_process_run: one process, 8 devices):
* the restored state (every array matches the SHA-256 of the shards it was saved from) and the
  metrics rows up to the checkpoint, which it carries;
* everything the host computes from the sampled tokens (rewards, response lengths, counts,
  evaluations): the per-row sampling keys do not depend on the layout, and the logits' last
  bits, which do, flipped no token here;
* the update's device metrics (actor/*) differ by float32 rounding: the gradients are summed
  over another number of shards (and processes), in another order. They are held to
  test_distributed.py's tolerance for two processes against one, whose cause is the same:
  relative 1e-5 plus 1e-6 (a noise estimate's: times its condition number). Seen: relative
  2.5e-6 at most over 4 steps after the change (a noise scale's EMA), 1.6e-6 on the loss.
A long run's trajectories may part once such a difference flips a sampled token; the bound
holds for the steps compared here.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.integration.test_distributed import (PEER_TIMEOUT_S, _command_line, _launch_two,
                                                check_like_one)
from tests.support import REPO
from tests.support.process_env import process_env


def _one_process(command, devices):
  return subprocess.run(command, env=process_env(None, devices=devices), cwd=REPO,
                        capture_output=True, text=True, timeout=600)


def _layout_changes(workdir):
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f).get("layout_changes")


@pytest.mark.slow(seconds=120)
def test_a_run_saved_on_8_devices_resumes_on_4_and_refuses_3(tmp_path, grpo_single_process_run):
  ref, workdir = grpo_single_process_run, str(tmp_path / "run")
  killed = _one_process(_command_line(ref.cache_dir, workdir, "KILL:update:2"), 8)
  assert killed.returncode == -9, killed.stderr[-3000:]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["1"]

  # 16 responses a step on 3 devices: the plan cannot split them. One line, both layouts.
  refused = _one_process(_command_line(ref.cache_dir, workdir), 3)
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert "Traceback" not in refused.stderr, refused.stderr[-3000:]
  line, = [l for l in refused.stderr.splitlines() if l.startswith("error:")]
  assert line.startswith(f"error: {workdir} holds checkpoints saved on mesh data=8 fsdp=1 "
                         "tensor=1 of 8 devices in 1 process; this launch's mesh data=3 fsdp=1 "
                         "tensor=1 of 3 devices in 1 process cannot go on with them: "), line
  assert "must split over 3 batch shards" in line

  resumed = _one_process(_command_line(ref.cache_dir, workdir), 4)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from the checkpoint of step 1" in resumed.stderr
  assert ("was saved on mesh data=8 fsdp=1 tensor=1 of 8 devices in 1 process and is restored "
          "onto mesh data=4 fsdp=1 tensor=1 of 4 devices in 1 process: orbax resharded its "
          "arrays, each matching its checksum") in resumed.stderr
  assert _layout_changes(workdir) == [{
      "step": 1, "saved_on": "mesh data=8 fsdp=1 tensor=1 of 8 devices in 1 process",
      "resumed_on": "mesh data=4 fsdp=1 tensor=1 of 4 devices in 1 process"}]
  check_like_one("saved on 8 devices, resumed on 4", ref.run_dir, workdir, None)


@pytest.mark.slow(seconds=150)
def test_a_run_saved_by_2_processes_resumes_in_1(tmp_path, grpo_single_process_run):
  """Saved by 2 processes of 4 devices each; resumed in 1 process on 8 devices (the same mesh),
  and on 4 (half the devices: one host of the two)."""
  ref, saved = grpo_single_process_run, tmp_path / "saved"
  procs, logs = _launch_two([_command_line(ref.cache_dir, saved, "KILL:update:2")] * 2,
                            tmp_path, "saved")
  for pid, p in enumerate(procs):  # killed at its update, or stopped when the other was (75)
    assert p.wait(timeout=600 + PEER_TIMEOUT_S) in (-9, 75), logs[pid].read_text()[-3000:]
  assert sorted(os.listdir(saved / "checkpoints")) == ["1"]
  two = "mesh data=8 fsdp=1 tensor=1 of 8 devices in 2 processes"
  for devices in (8, 4):
    workdir = str(tmp_path / f"on{devices}")
    shutil.copytree(saved, workdir)
    resumed = _one_process(_command_line(ref.cache_dir, workdir), devices)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    one = f"mesh data={devices} fsdp=1 tensor=1 of {devices} devices in 1 process"
    assert f"was saved on {two} and is restored onto {one}" in resumed.stderr
    assert _layout_changes(workdir) == [{"step": 1, "saved_on": two, "resumed_on": one}]
    check_like_one(f"saved by 2 processes, resumed in 1 on {devices} devices", ref.run_dir,
                   workdir, None)

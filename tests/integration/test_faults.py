"""Fault injection: runs killed (SIGKILL) or preempted (SIGTERM) mid-step, mid-save and
mid-evaluation, and files damaged, resume to the metrics of an uninterrupted run, bit for bit.

Each run is the real command line in a subprocess (tests/support/workers/faulty_run.py), on the tiny
GRPO config with 4 steps, evaluations and checkpoints every 2 steps (asynchronous saves).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support import REPO, WORKERS

# The only metrics that may differ on resume.
TIMING = ("time/", "throughput/", "memory/", "wall_time")
EXIT_REQUEUE = 75


def _run(fault, workdir, cache, **env):
  args = [f"--config={REPO}/configs/grpo.py:tiny", f"--workdir={workdir}",
          f"--config.init.cache_dir={cache}",
          f"--config.init.sft_config={REPO}/configs/sft.py:tiny",
          "--config.train.tensorboard=False"]
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8", **env)
  out = subprocess.run([sys.executable, os.path.join(WORKERS, "faulty_run.py"), fault,
                        "--", *args], capture_output=True, text=True, env=env, timeout=600)
  return out.returncode, out.stderr


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _same(a_rows, b_rows):
  assert [r["step"] for r in b_rows] == [r["step"] for r in a_rows] == [0, 1, 2, 3, 4]
  for a, b in zip(a_rows, b_rows):
    keys = {k for k in a if not k.startswith(TIMING)}
    assert keys == {k for k in b if not k.startswith(TIMING)}, a["step"]
    for k in sorted(keys):
      assert a[k] == b[k], (a["step"], k, a[k], b[k])  # CPU runs are deterministic: exact


def _checkpoints_are_finite(workdir):
  import jax
  import orbax.checkpoint as ocp
  folder = os.path.join(workdir, "checkpoints")
  steps = sorted(int(n) for n in os.listdir(folder) if n.isdigit())
  assert steps
  for s in steps:
    state = ocp.PyTreeCheckpointer().restore(os.path.join(folder, str(s), "state"))
    for leaf in jax.tree.leaves(state):
      if np.issubdtype(np.asarray(leaf).dtype, np.inexact):
        assert np.all(np.isfinite(leaf)), s


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_sft_base):
  root = tmp_path_factory.mktemp("faults")
  code, err = _run("none", root / "straight", tiny_sft_base)
  assert code == 0, err[-3000:]
  return root, _rows(root / "straight")


@pytest.mark.slow(seconds=30)
@pytest.mark.parametrize("fault", ["KILL:update:3", "KILL:save:1", "KILL:eval:2"])
def test_a_killed_run_resumes_to_the_same_metrics(fault, straight, tmp_path, tiny_sft_base):
  root, want = straight
  code, _ = _run(fault, tmp_path / "run", tiny_sft_base)
  assert code == -9  # killed
  if fault == "KILL:update:3":  # and the crash cut the metrics file's last line
    path = tmp_path / "run" / "metrics.jsonl"
    text = path.read_text()
    path.write_text(text[:-20])
  code, err = _run("none", tmp_path / "run", tiny_sft_base)  # the same command again
  assert code == 0, err[-3000:]
  _same(want, _rows(tmp_path / "run"))
  _checkpoints_are_finite(tmp_path / "run")


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_exits_to_be_requeued(straight, tmp_path, tiny_sft_base):
  root, want = straight
  code, err = _run("TERM:update:3", tmp_path / "run", tiny_sft_base)  # in step 3
  assert code == EXIT_REQUEUE, err[-3000:]
  assert "Traceback" not in err
  assert [line for line in err.splitlines() if "preempted" in line]
  folder = tmp_path / "run" / "checkpoints"
  assert max(int(n) for n in os.listdir(folder) if n.isdigit()) == 3  # nothing lost
  code, err = _run("none", tmp_path / "run", tiny_sft_base)
  assert code == 0, err[-3000:]
  _same(want, _rows(tmp_path / "run"))


def _largest_file(folder):
  files = [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names]
  return max(files, key=os.path.getsize)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_checkpoint_is_skipped_for_the_previous_one(damage, straight, tmp_path, tiny_sft_base):
  """The finished run's last checkpoint is damaged; the same command resumes from step 2."""
  import shutil
  root, want = straight
  shutil.copytree(root / "straight", tmp_path / "run")
  path = _largest_file(tmp_path / "run" / "checkpoints" / "4" / "state")
  data = bytearray(open(path, "rb").read())
  if damage == "truncate":
    data = data[:len(data) // 2]
  else:
    data[len(data) // 2] ^= 0x10
  with open(path, "wb") as f:
    f.write(bytes(data))
  code, err = _run("none", tmp_path / "run", tiny_sft_base)
  assert code == 0, err[-3000:]
  assert "step 4" in err and "damaged" in err.lower(), err[-3000:]
  _same(want, _rows(tmp_path / "run"))
  _checkpoints_are_finite(tmp_path / "run")


def _bytes_under(folder):
  return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(folder)
             for n in names)


@pytest.mark.slow(seconds=25)
def test_a_full_disk_is_one_line_and_the_last_checkpoint_stays(straight, tmp_path, tiny_sft_base):
  """The run directory on a tmpfs that a file fills, right before the save of step 4, to half a
  checkpoint of free space: that save fails as one error line naming the directory, the bytes
  needed and free, and step 2, which stays intact; with room made, the same command resumes
  from it to the uninterrupted metrics. Filled while the logs are written, the run stops in one
  line naming metrics.jsonl and step 2. The disk made read-only, a new run there is refused
  before it starts."""
  root, want = straight
  disk = tmp_path / "disk"
  disk.mkdir()
  # Filled at the second save, not sized ahead: the space a save takes while it is written
  # varies (a CI run sized for 1.8 checkpoints ran out while writing the logs beside step 2).
  half = _bytes_under(root / "straight" / "checkpoints" / "2") // 2
  mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)],
                         capture_output=True, text=True)
  if mount.returncode:
    pytest.skip(f"mounting a tmpfs needs root: {mount.stderr.strip()}")
  filler = disk / "filler"
  try:
    code, err = _run("FILL:save:2", disk / "run", tiny_sft_base, FAULT_FILL_PATH=str(filler),
                     FAULT_FILL_FREE=str(half))
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    assert (f"{disk / 'run' / 'checkpoints'}: No space left on device while saving the "
            f"checkpoint of step 4 (it needs ~") in errors[0], errors[0]
    assert "the last checkpoint, step 2, is intact" in errors[0], errors[0]
    assert sorted(os.listdir(disk / "run" / "checkpoints")) == ["2"]  # the partial one removed
    filler.unlink()
    code, err = _run("none", disk / "run", tiny_sft_base)
    assert code == 0, err[-3000:]
    assert "resumed from the checkpoint of step 2" in err
    _same(want, _rows(disk / "run"))
    # Full while the logs are written (the save of step 2 done): one line naming the file.
    code, err = _run("FILL:update:4", disk / "logs", tiny_sft_base, FAULT_FILL_PATH=str(filler),
                     FAULT_FILL_FREE="0")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert errors[0] == (f"error: {disk / 'logs' / 'metrics.jsonl'}: No space left on device "
                         f"while writing the run's logs. The last checkpoint (step 2) in "
                         f"{disk / 'logs'} is intact. Make room and run the same command "
                         f"again"), errors[0]
    filler.unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)  # read-only now
    code, err = _run("none", disk / "other", tiny_sft_base)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and f"{disk}' is not writable" in errors[0], err[-3000:]
  finally:
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)

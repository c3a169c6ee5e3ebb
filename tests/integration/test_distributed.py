"""Two processes, one mesh: each loads only its rows and gets what one process gets."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.support import REPO, WORKERS
from tests.support.process_env import free_port, process_env
from rlscale.parallel import distributed



@pytest.mark.slow(seconds=35)
def test_two_processes_decode_like_one(tmp_path):
  from tests.support.workers import two_process_decode
  _, want_tokens, want_logp = two_process_decode.run((2, 2, 2))  # this process: 8 devices

  port = free_port()
  procs = []
  for pid in range(2):
    env = process_env(port, 2, pid)
    procs.append(subprocess.Popen(
        [sys.executable, os.path.join(WORKERS, "two_process_decode.py"),
         str(tmp_path / f"out{pid}.npz")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
  for p in procs:
    out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, out.decode()[-3000:]
  for pid in range(2):
    got = np.load(tmp_path / f"out{pid}.npz")
    rows = slice(int(got["start"]), int(got["start"]) + 4)
    np.testing.assert_array_equal(got["tokens"], want_tokens[rows])
    np.testing.assert_array_equal(got["tokens4"], want_tokens[rows])
    assert np.abs(got["logprobs"] - want_logp[rows]).max() <= 1e-5


def test_process_rows_single_process():
  assert distributed.process_rows(6) == slice(0, 6)


# --- one RL run as two processes against the same run in one process ---

TIMING = ("time/", "throughput/", "mfu/", "memory/", "wall_time")  # differ between two runs
# The updates' device metrics are float32 reductions that an all-reduce over two processes may
# add in another order than one over one process's devices. Seen: 1 ulp on actor/ratio, 3e-8 on
# a loss that is exactly 0 in one process.
RTOL, ATOL = 1e-5, 1e-6
# The noise-scale estimates subtract nearly equal squared norms (rlscale/rl/noise_scale.py),
# which magnifies the norms' last bits: seen relative 4.2e-6 and 1.5e-5. The measured norms
# (`grad_sq_small`, `grad_sq_big`) are held to RTOL; an estimate derived from them to RTOL
# times its condition number at that step: (s + b) / |s - b| for tr(Sigma), (B b + b_s s) /
# |B b - b_s s| for |G|^2; the averages (EMAs) and B_simple take the largest so far, B_simple
# twice (a ratio of two).
NOISE_DERIVED = ("/grad_sq_est", "/trace_est", "/grad_sq_ema", "/trace_ema", "/b_simple")
HYPERPARAMS = ("/lr", "/b1", "/b2", "/eps", "/eps_root", "/weight_decay", "/prox_decay")
HOST_SUMS = ("reward/", "response/")  # host metrics summed over processes (rollout.py)
class Float32HostSums(AssertionError):
  """Only host sums over processes differ, and by no more than float32 rounding."""


def _within_tolerance(key):
  return key.startswith(("actor/", "critic/")) and not key.endswith(HYPERPARAMS)


def _run_two_processes(args, tmp_path, timeout=600):
  """Both processes of one run; the logs go to files (a full pipe would block a process)."""
  port = free_port()
  procs, logs = [], []
  for pid in range(2):
    env = process_env(port, 2, pid)
    logs.append(open(tmp_path / f"process{pid}.log", "w+"))
    worker = os.path.join(WORKERS, "two_process_rl.py")
    procs.append(subprocess.Popen([sys.executable, worker, *args], env=env, stdout=logs[-1],
                                  stderr=subprocess.STDOUT))
  deadline = time.time() + timeout
  try:
    # A process that dies leaves the other waiting in a collective: stop it then.
    while any(p.poll() is None for p in procs):
      if any(p.returncode for p in procs) or time.time() > deadline:
        break
      time.sleep(0.5)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  outputs = []
  for log in logs:
    log.seek(0)
    outputs.append(log.read())
    log.close()
  for pid, p in enumerate(procs):
    assert p.returncode == 0, f"process {pid} exited {p.returncode}:\n{outputs[pid][-5000:]}"
  return outputs


def _noise_conditions(rows):
  """{(step, noise prefix): (condition of tr(Sigma), of |G|^2, largest of both so far)} from
  the measured norms of `rows`."""
  out, worst = {}, {}
  for r in rows:
    for k in r:
      if not k.endswith("/grad_sq_small"):
        continue
      p = k[:-len("/grad_sq_small")]
      s, b = r[f"{p}/grad_sq_small"], r[f"{p}/grad_sq_big"]
      bs, bb = r[f"{p}/b_small"], r[f"{p}/b_big"]
      trace = (abs(s) + abs(b)) / max(abs(s - b), 1e-300)
      g2 = (bb * abs(b) + bs * abs(s)) / max(abs(bb * b - bs * s), 1e-300)
      worst[p] = max(worst.get(p, 1.0), trace, g2)
      out[(r["step"], p)] = (trace, g2, worst[p])
    for p, w in worst.items():  # a step without an estimate carries the averages on
      out.setdefault((r["step"], p), (w, w, w))
  return out


def _tolerance(key, step, conditions):
  """The tolerance on `key` at `step`: RTOL, or for a noise estimate RTOL x its condition."""
  if not key.endswith(NOISE_DERIVED) or (step, key.rsplit("/", 1)[0]) not in conditions:
    return RTOL
  trace, g2, worst = conditions[(step, key.rsplit("/", 1)[0])]
  return RTOL * {"/trace_est": trace, "/grad_sq_est": g2, "/b_simple": 2 * worst}.get(
      "/" + key.rsplit("/", 1)[1], worst)


def _compare_rows(one, two):
  """`two`'s metrics against `one`'s, timings left out: (mismatches, float32-rounded host
  sums, (largest difference within tolerance, where), (largest share of it used, where))."""
  assert [r["step"] for r in two] == [r["step"] for r in one]
  mismatches, rounded = [], []
  largest, used = (0.0, None), (0.0, None)
  conditions = _noise_conditions(one)
  for a, b in zip(one, two):
    keys = {k for k in a if not k.startswith(TIMING)}
    assert keys == {k for k in b if not k.startswith(TIMING)}, (a["step"], keys ^ set(b))
    for k in sorted(keys):
      x, y = a[k], b[k]
      if x == y:
        continue
      where = f"step {a['step']} {k}: one process {x!r}, two {y!r}"
      numeric = not isinstance(x, str) and not isinstance(y, str)
      if numeric and _within_tolerance(k):
        diff, tol = abs(x - y), ATOL + _tolerance(k, a["step"], conditions) * abs(x)
        largest = max(largest, (diff, where))
        used = max(used, (diff / tol, where))
        if diff <= tol:
          continue
      elif numeric and k.startswith(HOST_SUMS) and abs(x - y) <= 1e-6 * abs(x):
        rounded.append(where)  # float32 rounding, magnified at most 8 times by reward/std
        continue
      mismatches.append(where)
  return mismatches, rounded, largest, used


def check_like_one(name, one_dir, two_dir, one_summary):
  """The run in `two_dir` (two processes) against the one in `one_dir` (one process, which
  returned `one_summary`, or None for a run resumed, whose compilations are its last launch's):
  the same steps, counts and compilations, metrics within tolerance."""
  rows = {}
  for run, folder in (("one", one_dir), ("two", two_dir)):
    with open(os.path.join(folder, "metrics.jsonl")) as f:
      rows[run] = [json.loads(line) for line in f]
  assert [r["step"] for r in rows["one"]] == [0, 1, 2]
  # Partial credit: the updates have something to learn.
  assert max(r.get("reward/mean", 0) for r in rows["one"]) > 0
  for r1, r2 in zip(rows["one"], rows["two"]):
    for k in ("responses_seen", "tokens_seen"):
      assert r1[k] == r2[k], (r1["step"], k, r1[k], r2[k])
  if one_summary is not None:
    with open(os.path.join(two_dir, "summary.json")) as f:
      assert json.load(f)["compilations"] == one_summary["compilations"]

  mismatches, rounded, largest, used = _compare_rows(rows["one"], rows["two"])
  print(f"{name}: largest difference {largest[0]:.3g} ({largest[1]}); at most {used[0]:.3g} of "
        f"the tolerance {ATOL} + {RTOL} |value| (a noise estimate's: times its condition) "
        f"used ({used[1]})")
  assert not mismatches, "\n".join(mismatches + rounded)
  if rounded:
    raise Float32HostSums("\n".join(rounded))


def _two_processes_like_one(name, tmp_path, cache_dir):
  from tests.support.workers import two_process_rl

  from rlscale.run import base_policy, train

  # One process, 8 devices; builds the SFT base into the cache if missing.
  one_dir = str(tmp_path / "one")
  cfg = two_process_rl.config(name, cache_dir)
  one_summary = train.main(cfg, one_dir)
  base = base_policy.cache_folder(cfg, None)
  assert os.path.isdir(base), base

  # The cache folder is the session's, shared with tests running beside this one (which may
  # build other bases into it): the two processes must name this run's base as reused.
  outputs = _run_two_processes([name, cache_dir, str(tmp_path / "two")], tmp_path)
  for pid, out in enumerate(outputs):
    assert f"base policy: reusing {base}" in out, \
        f"process {pid} did not reuse {base}:\n{out[-3000:]}"
  check_like_one(name, one_dir, str(tmp_path / "two"), one_summary)


# GRPO as two processes: tests/unit/sweep/test_slurm.py runs it as a Slurm point (the processes find
# each other from SLURM_* variables) against conftest's grpo_single_process_run; PPO here
# starts them from JAX_COORDINATOR_ADDRESS and friends.
@pytest.mark.slow(seconds=60)
def test_two_processes_ppo_like_one(tmp_path, tiny_sft_base):
  _two_processes_like_one("ppo.py", tmp_path, tiny_sft_base)


@pytest.mark.slow(seconds=70)
def test_two_processes_with_dynamic_sampling_keep_the_groups_one_keeps(tmp_path, tiny_sft_base):
  """Every process gathers every group's rewards and fills the same slots: the two-process
  run refills like the one-process run (rounds, generated and trained responses, metrics)."""
  _two_processes_like_one("grpo.py+ds", tmp_path, tiny_sft_base)
  with open(tmp_path / "one" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f][1:]
  assert max(r["rollout/rounds"] for r in rows) >= 2, "no step refilled: the test is void"


# --- a process of the run is lost (issue 47, class 1) ---

PEER_TIMEOUT_S = 10
# XLA's service checks the heartbeats at intervals (a 15 s timeout took 16 s, a 100 s one
# 79 s); on top of that come the abort, the supervisor's relay and the loaded 2-core machine
# the tests run on.
LOST_SLACK_S = 20


def _command_line(cache_dir, workdir, fault="none"):
  """tests/support/workers/two_process_rl.py's GRPO run through the command line (supervised,
  as a multi-process run's command is), saving every step at once (synchronously: the
  checkpoint of step 1 is on disk before step 2 begins), with FAULT (faulty_run.py's)."""
  from tests.support.workers import two_process_rl
  sft = os.path.join(REPO, "configs", "sft.py:tiny," + two_process_rl.SFT_ARGS)
  return [sys.executable, os.path.join(WORKERS, "faulty_run.py"), fault, "--",
          "--config=configs/grpo.py:tiny", f"--config.init.cache_dir={cache_dir}",
          f"--config.init.sft_config={sft}", "--config.task.partial_credit=True",
          "--config.train.num_steps=2", "--config.train.eval_every=2",
          "--config.train.checkpoint_every=1", "--config.train.async_checkpoint=False",
          "--config.train.tensorboard=False", f"--config.train.peer_timeout_s={PEER_TIMEOUT_S}",
          f"--workdir={workdir}"]


def _launch_two(commands, tmp_path, tag):
  """Both processes of a run (command `commands[pid]` each), logs in files; the processes and
  the logs' paths."""
  port, procs, logs = free_port(), [], []
  for pid, command in enumerate(commands):
    logs.append(tmp_path / f"{tag}{pid}.log")
    with open(logs[-1], "w") as log:
      procs.append(subprocess.Popen(command, env=process_env(port, 2, pid), cwd=REPO,
                                    stdout=log, stderr=subprocess.STDOUT))
  return procs, logs


@pytest.mark.slow(seconds=150)
@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_process_stops_the_other_in_one_line_and_the_run_resumes(
    victim, tmp_path, grpo_single_process_run):
  """Process `victim` is killed (SIGKILL) in the middle of step 2: the other stops within
  train.peer_timeout_s with one line naming it and exit status 75 (process 0 hosts the
  coordination service: its loss is known at once, process 1's after the timeout); the same
  command again resumes from step 1, and the run ends as the one-process run did."""
  ref = grpo_single_process_run
  workdir, survivor = tmp_path / "two", 1 - victim
  procs, logs = _launch_two(
      [_command_line(ref.cache_dir, workdir, "KILL:update:2" if pid == victim else "none")
       for pid in range(2)], tmp_path, "killed")
  try:
    while procs[victim].poll() is None:
      assert procs[survivor].poll() is None, logs[survivor].read_text()[-3000:]
      time.sleep(0.1)
    lost_at = time.monotonic()
    procs[survivor].wait(timeout=PEER_TIMEOUT_S + LOST_SLACK_S)
    waited = time.monotonic() - lost_at
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  out = logs[survivor].read_text()
  print(f"process {victim} killed: process {survivor} exited {procs[survivor].returncode} "
        f"{waited:.1f} s later: {out.splitlines()[-1]}")
  assert procs[victim].returncode == -signal.SIGKILL, logs[victim].read_text()[-3000:]
  assert procs[survivor].returncode == 75, out[-3000:]
  assert out.splitlines()[-1].startswith(
      f"process {survivor} of 2: lost process {victim} of the run ("), out[-3000:]
  for noise in ("Traceback", "Check failure", "Fatal Python error", "Extension modules"):
    assert noise not in out, out[-3000:]
  report = out.splitlines()[-1].rsplit("(its last output: ", 1)[1].rstrip(")")
  with open(report) as f:  # what XLA and Python wrote, kept aside
    assert "JAX distributed service detected fatal errors" in f.read()
  os.remove(report)
  assert sorted(os.listdir(workdir / "checkpoints")) == ["1"]  # step 2's never began saving

  procs, logs = _launch_two([_command_line(ref.cache_dir, workdir)] * 2, tmp_path, "resumed")
  for pid, p in enumerate(procs):
    assert p.wait(timeout=600) == 0, logs[pid].read_text()[-3000:]
  assert "resumed from the checkpoint of step 1" in logs[0].read_text()
  check_like_one(f"killed process {victim}, resumed", ref.run_dir, str(workdir), None)

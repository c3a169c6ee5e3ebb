"""The supervisor of a multi-process run's process (rlscale/run/supervise.py): XLA's abort after
a lost process becomes one line and exit status 75; anything else passes through as it was.

The reports replayed are real (tests/support/fixtures/lost_process/); the run they end is
tests/integration/test_distributed.py's.
"""

import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support import FIXTURES, REPO
from rlscale.run import supervise

LOST = os.path.join(FIXTURES, "lost_process")


def _read(name):
  with open(os.path.join(LOST, name)) as f:
    return f.read()


def _relay(lines):
  """The relay over `lines` (bytes each): (what it wrote, what it holds at the end, or None)."""
  read, write = os.pipe()
  sink = io.BytesIO()
  relay = supervise._Relay(os.fdopen(read, "rb"), sink)
  with os.fdopen(write, "wb") as f:
    f.writelines(lines)
  held = relay.finish(time.monotonic())
  return sink.getvalue().decode(), held


def test_xlas_report_on_process_0_names_the_process_that_stopped_its_heartbeats():
  text = _read("process0_lost1.txt")
  assert supervise.lost_processes(text, 0)[0] == [1]
  written, held = _relay(text.encode().splitlines(keepends=True))
  assert written.splitlines() == text.splitlines()[:1]  # the last progress line, nothing after
  assert b"".join(held).decode() == "".join(text.splitlines(keepends=True)[1:])


def test_a_lost_process_0_is_named_by_the_others_as_the_services_host():
  text = _read("process1_lost0.txt")
  lost, how = supervise.lost_processes(text, 1)
  assert lost == [0] and "coordination service" in how
  written, held = _relay(text.encode().splitlines(keepends=True))
  # The traceback that began before XLA's report is held with it.
  assert "Traceback" not in written and held is not None


def test_a_collective_whose_peer_closed_it_is_a_lost_process_without_xlas_report():
  lines = [b"I1206 step 3/6\n", b"Traceback (most recent call last):\n", b'  File "x.py"\n',
           b"jax.errors.JaxRuntimeError: UNKNOWN: Gloo AllGather failed: [pair.cc:547] "
           b"Connection closed by peer [127.0.0.1]:2454\n"]
  written, held = _relay(lines)
  assert written == "I1206 step 3/6\n" and held == lines[1:]
  lost, how = supervise.lost_processes(b"".join(held).decode(), 1)
  assert lost == [] and "Connection closed by peer" in how


def test_any_other_traceback_passes_through_whole():
  lines = [b"Traceback (most recent call last):\n", b'  File "x.py", line 1\n',
           b"ValueError: boom\n", b"after\n"]
  written, held = _relay(lines)
  assert written == b"".join(lines).decode() and held is None


def test_held_lines_are_released_when_no_death_follows(monkeypatch):
  monkeypatch.setattr(supervise, "HOLD_S", 0.0)
  lines = [b"W preemption_sync_manager.cc] Failed to retrieve preemption notice from "
           b"coordination service: UNAVAILABLE\n", b"the run goes on\n"]
  written, held = _relay(lines)
  assert written == b"".join(lines).decode() and held is None


def test_a_pipe_left_open_by_the_childs_own_process_does_not_hold_the_end(monkeypatch):
  monkeypatch.setattr(supervise, "DRAIN_S", 0.2)
  read, write = os.pipe()  # the write end stays open: a grader the child started, say
  sink = io.BytesIO()
  relay = supervise._Relay(os.fdopen(read, "rb"), sink)
  os.write(write, b"Polled an error from coordination service\n")
  time.sleep(0.2)
  assert relay.finish(time.monotonic()) == [b"Polled an error from coordination service\n"]
  os.close(write)


# --- the supervisor around a child that plays the run's process ---

CHILD = """
import os, signal, sys, time
if os.environ.get("RLSCALE_SUPERVISOR") != "child":
  from rlscale.run import supervise
  sys.exit(supervise.run())
mode = sys.argv[1]
print("a line of the run", file=sys.stderr, flush=True)
if mode == "report":  # XLA's report, then its abort
  sys.stderr.write(open(sys.argv[2]).read())
  sys.stderr.flush()
  os.abort()
elif mode == "fails":
  sys.exit(3)
elif mode == "killed":
  os.kill(os.getpid(), signal.SIGKILL)
elif mode == "signals":  # what preemption.py does: save, exit 75
  signal.signal(signal.SIGTERM, lambda s, f: (print(f"got {s}", file=sys.stderr, flush=True),
                                              sys.exit(75)))
  print("ready", file=sys.stderr, flush=True)
  time.sleep(60)
"""


def _supervised(tmp_path, *args, index=0):
  script = tmp_path / "child.py"
  script.write_text(CHILD)
  env = dict(os.environ, PYTHONPATH=REPO, JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index))
  env.pop(supervise.ENV, None)
  return subprocess.Popen([sys.executable, str(script), *args], env=env, stderr=subprocess.PIPE,
                          text=True)


@pytest.mark.parametrize("fixture, index, lost", [("process0_lost1.txt", 0, 1),
                                                  ("process1_lost0.txt", 1, 0)])
def test_a_child_aborted_for_a_lost_process_is_one_line_and_exit_75(tmp_path, fixture, index,
                                                                    lost):
  p = _supervised(tmp_path, "report", os.path.join(LOST, fixture), index=index)
  _, err = p.communicate(timeout=60)
  assert p.returncode == 75, err
  lines = err.splitlines()
  assert lines[0] == "a line of the run"
  assert len(lines) == 3, err  # the fixture's line before the report, and the supervisor's
  assert lines[2].startswith(f"process {index} of 2: lost process {lost} of the run (")
  report = lines[2].rsplit("(its last output: ", 1)[1].rstrip(")")
  with open(report) as f:
    assert "Terminating process because the JAX distributed service" in f.read()
  os.remove(report)


def test_a_childs_exit_status_and_death_pass_through(tmp_path):
  p = _supervised(tmp_path, "fails")
  _, err = p.communicate(timeout=60)
  assert (p.returncode, err) == (3, "a line of the run\n")
  p = _supervised(tmp_path, "killed")
  _, err = p.communicate(timeout=60)
  assert p.returncode == -signal.SIGKILL, err


def test_a_signal_to_the_supervisor_reaches_the_child_once(tmp_path):
  p = _supervised(tmp_path, "signals")
  lines = []
  reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
  reader.start()
  deadline = time.time() + 60
  while "ready\n" not in lines and time.time() < deadline:
    time.sleep(0.05)
  p.send_signal(signal.SIGTERM)
  assert p.wait(timeout=60) == 75
  reader.join(timeout=10)
  assert lines.count(f"got {int(signal.SIGTERM)}\n") == 1, lines


def test_one_process_is_not_supervised():
  assert not supervise.wanted({"JAX_NUM_PROCESSES": "1"})
  assert supervise.wanted({"SLURM_NTASKS": "2"})
  assert not supervise.wanted({"SLURM_NTASKS": "2", supervise.ENV: "child"})
  assert not supervise.wanted({"SLURM_NTASKS": "2", supervise.ENV: "off"})


def test_the_same_signal_twice_at_once_is_one_request(monkeypatch):
  """Slurm signals every process of a job: a supervised run's gets a SIGTERM directly and one
  forwarded by its supervisor, milliseconds apart. That is one request, not the second signal
  that stops at once."""
  from rlscale.trainer import preemption
  preemption.reset()
  try:
    preemption._handler(signal.SIGTERM, None)
    preemption._handler(signal.SIGTERM, None)  # no KeyboardInterrupt
    assert preemption.requested()
    with pytest.raises(KeyboardInterrupt):
      preemption._handler(signal.SIGUSR2, None)  # another signal is a second one
    monkeypatch.setattr(preemption, "DUPLICATE_S", 0.0)
    with pytest.raises(KeyboardInterrupt):
      preemption._handler(signal.SIGTERM, None)  # and the same one later
  finally:
    preemption.reset()


WATCHED = """
import os, signal, sys, time
from rlscale.trainer import preemption
preemption.install()
preemption.step_finished()
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(3)
print("still running: waiting for the step's boundary", flush=True)
"""


def test_the_watchdog_takes_the_same_signal_twice_at_once_as_one():
  env = dict(os.environ, PYTHONPATH=REPO, RLSCALE_PREEMPT_GRACE_S="60")
  p = subprocess.run([sys.executable, "-c", WATCHED], env=env, capture_output=True, text=True,
                     timeout=60)
  assert p.returncode == 0 and "still running" in p.stdout, p.stderr

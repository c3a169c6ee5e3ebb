"""Preemption: a SIGTERM or SIGUSR2 asks the run to stop at the next step boundary, save and
requeue.

Schedulers send a signal some seconds before they kill a job: SIGTERM (Slurm's grace period on
preemption, TPU VM maintenance, Kubernetes) or the one Slurm's `--signal` names (SIGUSR2 in the
scripts of rlscale/sweep/launchers/slurm.py, sent before the time limit). The handler only sets a flag;
the loop checks it between steps, finishes the step in flight, saves a checkpoint of it and
exits with EXIT_REQUEUE, so at most the step in flight is lost. A second signal stops at once
(the run still completes the saves it began).

The flag alone would not stop a process that never reaches a step boundary: one validating,
compiling, or in a first step that does not end (Python runs a signal handler only between
bytecodes, and XLA's compiler is one long call). A watchdog thread, woken by the signal itself
(`signal.set_wakeup_fd`), stops such a process at once with EXIT_REQUEUE: before the first step
of this process finished there is nothing new to save, and the last checkpoint is intact. Once
steps run, it gives the step in flight GRACE_S seconds (RLSCALE_PREEMPT_GRACE_S) to reach its
boundary and save, then stops without it.

The same signal again within DUPLICATE_S is the first one delivered twice, not a second: a
scheduler that signals every process of a job (Slurm) reaches a supervised run's process both
directly and through its supervisor, which forwards what it gets (rlscale/run/supervise.py).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

# The exit status of a run that stopped for preemption and wants to be started again with the
# same command: EX_TEMPFAIL of sysexits.h ("temporary failure, the user is invited to retry").
# Launchers requeue on it; any other non-zero status is a failure.
EXIT_REQUEUE = 75

_requested: list[int] = []
_first_at: list[float] = []  # when the first signal came (time.monotonic)
DUPLICATE_S = 1.0
GRACE_S = float(os.environ.get("RLSCALE_PREEMPT_GRACE_S", "30"))
_watching: list[bool] = []
_armed = threading.Event()  # the watchdog acts on signals (install(watchdog=False) stops it)
_steps_finished = threading.Event()  # a step of this process finished: a save is worth a wait


class Preempted(Exception):
  """Raised by the loop after it saved the step in flight; carries the checkpoint's step."""

  def __init__(self, step: int):
    super().__init__(f"preempted: saved step {step}; run the same command again to resume")
    self.step = step


def _duplicate(signum: int, first: int, first_at: float) -> bool:
  return signum == first and time.monotonic() - first_at < DUPLICATE_S


def _handler(signum, frame):
  if _requested:  # the second signal: stop now
    if _first_at and _duplicate(signum, _requested[0], _first_at[0]):
      return
    raise KeyboardInterrupt(f"signal {signum} (second)")
  _requested.append(signum)
  _first_at[:] = [time.monotonic()]


def install(signals=(signal.SIGTERM, signal.SIGUSR2), watchdog: bool = True) -> None:
  """The handlers (from the main thread), and the watchdog that stops a process whose main
  thread cannot reach a step boundary soon."""
  for s in signals:
    signal.signal(s, _handler)
  if not watchdog:
    _armed.clear()
    return
  _armed.set()
  if not _watching:  # one per process (an in-process command line runs again)
    _watching.append(True)
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    # A forked child (the watchdog thread is not copied) must not wake this process's.
    os.register_at_fork(after_in_child=lambda: signal.set_wakeup_fd(-1))
    threading.Thread(target=_watch, args=(read, {int(s) for s in signals}), daemon=True,
                     name="preemption-watchdog").start()


def _watch(fd: int, signals: set[int]) -> None:
  seen, first = 0, None  # first: (signal, when it was read)
  while True:
    for signum in os.read(fd, 64):
      if signum not in signals or not _armed.is_set():
        continue
      if first is not None and _duplicate(signum, *first):
        continue
      seen += 1
      first = first or (signum, time.monotonic())
      if seen > 1:
        _stop_now(f"signal {signum} again: stopping now")
      if not _steps_finished.is_set():
        _stop_now(f"signal {signum} before this process finished a step (setup, validation, "
                  "compilation or the first step): nothing new to save; stopping now")
      threading.Thread(target=_stop_after_grace, args=(signum,), daemon=True).start()


def _stop_after_grace(signum: int) -> None:
  time.sleep(GRACE_S)
  _stop_now(f"signal {signum}: the step in flight did not reach its boundary within "
            f"{GRACE_S:g} s (RLSCALE_PREEMPT_GRACE_S); stopping without saving it")


def _stop_now(why: str) -> None:
  """Exit with EXIT_REQUEUE from any thread, whatever the main thread is doing (os._exit: no
  handler or atexit hook runs; the last saved checkpoint is intact and the run resumes from it)."""
  try:
    sys.stderr.flush()
  except Exception:  # noqa: BLE001  (the stream may be closed; the line is written below)
    pass
  os.write(2, f"preempted: {why}; run the same command again to resume from the last "
              f"checkpoint\n".encode())
  os._exit(EXIT_REQUEUE)


def loop_started() -> None:
  """A loop starts (the base policy's, then the run's): until it finishes a step, a signal
  stops the process at once."""
  _steps_finished.clear()


def step_finished() -> None:
  """The loop finished a step: from now on a signal waits for the step in flight to be saved."""
  _steps_finished.set()


def requested() -> bool:
  return bool(_requested)


def reset() -> None:
  _requested.clear()
  _first_at.clear()
  _steps_finished.clear()

"""Preemption: a SIGTERM or SIGUSR2 asks the run to stop at the next step boundary, save and
requeue.

Schedulers send a signal some seconds before they kill a job: SIGTERM (Slurm's grace period on
preemption, TPU VM maintenance, Kubernetes) or the one Slurm's `--signal` names (SIGUSR2 in the
scripts of rlscale/sweep/slurm.py, sent before the time limit). The handler only sets a flag;
the loop checks it between steps, finishes the step in flight, saves a checkpoint of it and
exits with EXIT_REQUEUE, so at most the step in flight is lost. A second signal stops at once
(the run still completes the saves it began).
"""

from __future__ import annotations

import signal

# The exit status of a run that stopped for preemption and wants to be started again with the
# same command: EX_TEMPFAIL of sysexits.h ("temporary failure, the user is invited to retry").
# Launchers requeue on it; any other non-zero status is a failure.
EXIT_REQUEUE = 75

_requested: list[int] = []


class Preempted(Exception):
  """Raised by the loop after it saved the step in flight; carries the checkpoint's step."""

  def __init__(self, step: int):
    super().__init__(f"preempted: saved step {step}; run the same command again to resume")
    self.step = step


def _handler(signum, frame):
  if _requested:  # the second signal: stop now
    raise KeyboardInterrupt(f"signal {signum} (second)")
  _requested.append(signum)


def install(signals=(signal.SIGTERM, signal.SIGUSR2)) -> None:
  for s in signals:
    signal.signal(s, _handler)


def requested() -> bool:
  return bool(_requested)


def reset() -> None:
  _requested.clear()

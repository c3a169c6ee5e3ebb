"""A process of a multi-process run whose peer is lost: one line and exit status 75.

When a process of a run dies (SIGKILL, the OOM killer, its host lost), the others wait for it
in their next collective. XLA's coordination service ends that wait: process 0, which hosts
the service, declares a process lost once it sent no heartbeat for train.peer_timeout_s
(jax.distributed's heartbeat timeout), and every process that learns it -- at once, when the
process lost is process 0 itself -- aborts from a C++ thread (LOG(FATAL)): exit status 134,
XLA's error, a stack trace and Python's fatal-error dump, and no Python code of this process
runs after it. No launcher requeues on 134, and jaxlib offers no hook (its Python
`missed_heartbeat_callback` cannot receive the status it is called with).

So the command line of a multi-process run supervises itself: the process the launcher
started (this module, which never imports JAX) runs the same command as a child and relays its
stderr line by line. From XLA's first report of a lost process, or a Python traceback whose
exception says a peer is gone (a collective's connection closed by it), the lines are held;
when the child then dies, they go to a file and the supervisor prints one line naming the
process lost and exits with EXIT_REQUEUE (75): run the same command again, on every process,
to resume from the last intact checkpoint. Anything else passes through as it was: the
child's output, its exit status, and its death by a signal, which the supervisor repeats.

Signals: SIGTERM, SIGUSR2 and SIGINT sent to the supervisor are forwarded to the child (which
saves its step and exits 75 on the first two: rlscale/trainer/preemption.py); a scheduler that
signals every process of the job (Slurm) reaches the child directly too, and the child takes
the same signal twice within a second as one. The child lives in a session of its own (a
terminal's Ctrl-C reaches it once, through the supervisor) and dies with the supervisor (Linux:
PR_SET_PDEATHSIG), so a SIGKILL of the process the launcher started still kills the run's.

RLSCALE_SUPERVISOR=off runs a multi-process run's command without it (the child runs with
RLSCALE_SUPERVISOR=child).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from rlscale.parallel import declared  # os.environ only: no JAX

ENV = "RLSCALE_SUPERVISOR"
EXIT_REQUEUE = 75  # rlscale.trainer.preemption.EXIT_REQUEUE (not imported: it would load JAX)
FORWARDED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)
# XLA's reports of a lost process (jaxlib 0.10): the service's, on process 0; the agent's, on
# the process that polled it; the fatal line before the abort; on a process whose connection to
# the service (process 0) broke, the preemption notifier's, which comes first.
XLA_REPORT = re.compile(r"Use error polling to propagate the following error to all tasks"
                        r"|Polled an error from coordination service"
                        r"|JAX distributed service detected fatal errors"
                        r"|Failed to retrieve preemption notice from coordination service")
# A Python exception of the child that says a peer is gone: a collective whose connection the
# peer closed (Gloo on CPU), a barrier of the service failed by a lost task.
PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer|heartbeat timeout"
                       r"|tasks are unhealthy|[Bb]arrier failed because: task is set to ERROR")
TRACEBACK = b"Traceback (most recent call last):"
# Lines held for a report or a traceback that the child's death does not follow within this
# many seconds are released, and the relay goes on.
HOLD_S = 30.0
# How long the child's last lines may take to arrive once it ended.
DRAIN_S = 10.0


def wanted(environ=os.environ) -> bool:
  """Whether this command is a multi-process run's that is not supervised yet."""
  if environ.get(ENV, "on") != "on":
    return False
  try:
    return declared.processes(environ) > 1
  except ValueError:  # a malformed count is jax.distributed's error to report, in the run
    return False


# Where a launcher wants each process's exit status (a folder on the run's file system): srun
# returns the highest task status, so a survivor's 75 beside a SIGKILLed task's 137 is lost
# unless each task says its own (rlscale/sweep/launchers/slurm.py reads them).
EXIT_DIR_ENV = "RLSCALE_TASK_EXIT_DIR"


def record_exit(code: int, environ=os.environ) -> None:
  """Write this process's exit status as `<EXIT_DIR_ENV>/<process index>` when it is set."""
  folder = environ.get(EXIT_DIR_ENV)
  if not folder:
    return
  try:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, str(declared.index(environ) or 0)), "w") as f:
      f.write(f"{code}\n")
  except OSError as e:  # the status still reaches the launcher through srun
    sys.stderr.write(f"warning: could not record exit status {code} in {folder}: {e}\n")


def child_command() -> list[str]:
  """This interpreter running the command line it was started with (a script, -m, -c)."""
  return [sys.executable, *sys.orig_argv[1:]]


def _die_with_parent() -> None:  # in the child, between fork and exec
  try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the child may outlive a killed supervisor
    pass


class _Relay:
  """The child's stderr to ours, line by line. From XLA's report of a lost process on, the
  lines are held (the evidence); a Python traceback is held until its exception line says
  whether a peer is gone. Lines held longer than HOLD_S are released."""

  def __init__(self, source, sink):
    self.source, self.sink = source, sink
    self.held: list[bytes] = []
    self.since: float | None = None  # when the lines began to be held
    self.lost = False  # the held lines tell of a lost process
    self.lock = threading.Lock()
    self.thread = threading.Thread(target=self._run, daemon=True, name="stderr-relay")
    self.thread.start()

  def _write(self, data: bytes) -> None:
    try:
      self.sink.write(data)
      self.sink.flush()
    except (OSError, ValueError):  # our stderr closed: the child's lines have nowhere to go
      pass

  def _run(self) -> None:
    for line in iter(self.source.readline, b""):
      with self.lock:
        self._line(line)

  def _line(self, line: bytes) -> None:
    text = line.decode("utf-8", "replace")
    if self.since is not None and time.monotonic() - self.since > HOLD_S:
      self._release()
    if not self.lost and (XLA_REPORT.search(text) or
                          (self.since is not None and PEER_GONE.search(text))):
      self.lost = True
    if self.since is None and (self.lost or line.startswith(TRACEBACK)):
      self.since = time.monotonic()
    if self.since is None:
      self._write(line)
      return
    self.held.append(line)
    if not self.lost and not line[:1].isspace() and not line.startswith(TRACEBACK):
      self._release()  # a traceback's exception line, and no peer gone in it

  def _release(self) -> None:
    self._write(b"".join(self.held))
    self.held, self.since, self.lost = [], None, False

  def finish(self, ended: float) -> list[bytes] | None:
    """After the child exited (at `ended`, time.monotonic): the lines held that tell of a lost
    process within HOLD_S of its end (None when there are none: the rest is released)."""
    # A process the child started may hold its stderr open after the child's end: the lines
    # that came by then are the child's.
    self.thread.join(timeout=DRAIN_S)
    with self.lock:
      if not self.lost or ended - self.since > HOLD_S:
        self._release()
        return None
      return self.held

  def release(self) -> None:
    with self.lock:
      self._release()


def lost_processes(report: str, me: int | None) -> tuple[list[int], str]:
  """(the processes lost, how) from the held lines: those XLA names; else process 0, which
  hosts the coordination service, when this process's connection to it broke; else none known
  (a collective's connection closed: its first line says which)."""
  named = set()
  for block in re.findall(r"stopped sending heartbeats\):\s*\n((?:[ \t]*[\w/:]+[ \t]*\n)+)",
                          report):
    named.update(int(n) for n in re.findall(r"(?:task:)?(\d+)\s*$", block, re.M))
  named.update(int(n) for n in re.findall(r"[Tt]ask:? ?(\d+) heartbeat timeout", report))
  named.discard(me)
  if named:
    return sorted(named), ("it sent no heartbeat within train.peer_timeout_s: killed, or its "
                           "host lost")
  if me != 0 and XLA_REPORT.search(report):
    return [0], ("the connection to it broke; it hosts jax.distributed's coordination service: "
                 "killed, or its host lost")
  gone = PEER_GONE.search(report)
  line = next((l.strip() for l in report.splitlines() if gone and gone.group(0) in l), "")
  return [], line[:300] or "XLA's coordination service reported it"


def _report_file(lines: list[bytes]) -> str:
  fd, path = tempfile.mkstemp(prefix="rlscale-lost-process-", suffix=".log")
  with os.fdopen(fd, "wb") as f:
    f.writelines(lines)
  return path


def lost_line(lost: list[int], how: str, me: int | None, count: int, report: str) -> str:
  who = f"process {me} of {count}" if me is not None else f"a process of {count}"
  what = (f"process{'es' if len(lost) > 1 else ''} {', '.join(map(str, lost))}" if lost
          else "a process")
  return (f"{who}: lost {what} of the run ({how}); stopping with exit status {EXIT_REQUEUE}: "
          f"run the same command again on every process to resume from the last checkpoint "
          f"(its last output: {report})")


def run() -> int:
  """Run this command as a supervised child; its exit status, 75 for a lost process. (A child
  that died of a signal: the supervisor dies of it too.)"""
  me, count = declared.index(), declared.processes()
  child, early = None, []  # signals that came before the child was started

  def forward(signum, frame):
    del frame
    if child is None:
      early.append(signum)
      return
    try:
      child.send_signal(signum)
    except ProcessLookupError:
      pass

  for s in FORWARDED:
    signal.signal(s, forward)
  sys.stderr.flush()
  child = subprocess.Popen(child_command(), env=dict(os.environ, **{ENV: "child"}),
                           stderr=subprocess.PIPE, start_new_session=True,
                           preexec_fn=_die_with_parent)
  for signum in early:
    forward(signum, None)
  relay = _Relay(child.stderr, getattr(sys.stderr, "buffer", sys.stderr))
  code = child.wait()
  held = relay.finish(time.monotonic())
  if held is not None and code != 0:
    text = b"".join(held).decode("utf-8", "replace")
    lost, how = lost_processes(text, me)
    line = lost_line(lost, how, me, count, _report_file(held))
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    return EXIT_REQUEUE
  if held is not None:
    relay.release()
  if code < 0:  # killed by a signal: die of it too, so the launcher sees what the child met
    sys.stderr.flush()
    if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the others may have a handler here
      signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    return 128 - code
  return code

"""What Slurm says about a sweep's jobs: squeue for live ones, sacct for finished ones; and
Slurm's job-array notation."""

from __future__ import annotations

import dataclasses
import getpass
import re
import shlex
import subprocess

from absl import logging

# sacct/squeue states of a job that is still queued or running: left alone.
QUEUED = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
          "COMPLETING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}


DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default MaxArraySize: task ids 0 to 1000


def max_array_size(timeout: float = 30.0) -> int:
  """The cluster's MaxArraySize (`scontrol show config`): a job array's task ids stay below it.
  Slurm's default, 1001, when scontrol is missing, fails or does not answer within `timeout`
  seconds (a client whose controller is down tries for about 10 s)."""
  try:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                         timeout=timeout)
    m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)\s*$", out.stdout, re.MULTILINE)
    size = int(m.group(1)) if m and not out.returncode else 0
  except (OSError, subprocess.SubprocessError):
    size = 0
  if size > 0:
    return size
  logging.info("sweep: scontrol show config gave no MaxArraySize; assuming Slurm's default, %d",
               DEFAULT_MAX_ARRAY_SIZE)
  return DEFAULT_MAX_ARRAY_SIZE


def array_spec(indices: list[int], parallel: int) -> str:
  """`0-3,5,7-9%2`: the task indices as Slurm's ranges, with the limit on tasks at once."""
  parts, start = [], None
  for k, i in enumerate(indices):
    if start is None:
      start = i
    if k + 1 == len(indices) or indices[k + 1] != i + 1:
      parts.append(str(i) if i == start else f"{start}-{i}")
      start = None
  return ",".join(parts) + (f"%{parallel}" if parallel else "")


def expand_array(job_id: str) -> list[str]:
  """sacct's line for pending tasks, `12_[0-2,5%2]` -> 12_0, 12_1, 12_2, 12_5; others as given."""
  m = re.fullmatch(r"(\d+)_\[([^\]]*)\]", job_id)
  if not m:
    return [job_id]
  out = []
  for part in m.group(2).split("%")[0].split(","):
    lo, _, hi = part.partition("-")
    if lo.isdigit():
      out += [f"{m.group(1)}_{i}" for i in range(int(lo), int(hi or lo) + 1)]
  return out


@dataclasses.dataclass
class JobState:
  state: str  # sacct/squeue's, first word: CANCELLED for `CANCELLED by 1234`
  returncode: int | None = None  # the exit status, or -signal
  elapsed_s: float | None = None


def _returncode(exit_code: str) -> int | None:
  code, _, signal = exit_code.partition(":")
  if not code.isdigit():
    return None
  return -int(signal) if int(code) == 0 and signal.isdigit() and int(signal) else int(code)


def job_states(job_ids: list[str]) -> dict[str, JobState]:
  """Where each job (`<array job>_<task>` or a job id) stands: squeue for live jobs (always
  current), else sacct (the history, when accounting is on). A job neither knows is left out."""
  arrays = sorted({j.partition("_")[0] for j in job_ids})
  states: dict[str, JobState] = {}
  out = _query(["sacct", "-n", "-P", "-X", "-j", ",".join(arrays),
                "--format=JobID,State,ExitCode,ElapsedRaw"])
  for line in out.splitlines():
    fields = line.strip().split("|")
    if len(fields) < 2 or "." in fields[0]:
      continue
    rc = _returncode(fields[2]) if len(fields) > 2 else None
    elapsed = float(fields[3]) if len(fields) > 3 and fields[3].isdigit() else None
    for j in expand_array(fields[0]):
      states[j] = JobState(fields[1].split()[0] if fields[1].strip() else "UNKNOWN", rc, elapsed)
  out = _query(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i %T"])
  for line in out.splitlines():
    fields = line.split()
    if len(fields) == 2 and fields[0].partition("_")[0] in arrays:
      for j in expand_array(fields[0]):
        states[j] = JobState(fields[1], None, None)
  return {j: states[j] for j in job_ids if j in states}


def _query(argv: list[str]) -> str:
  """A status command's output; '' when it is missing or fails (sacct without accounting)."""
  try:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
  except (OSError, subprocess.SubprocessError) as e:
    logging.warning("sweep: %s failed: %s", argv[0], e)
    return ""
  if out.returncode:
    logging.warning("sweep: %s exited %d: %s", shlex.join(argv), out.returncode,
                    out.stderr.strip()[-300:])
  return out.stdout

"""What the fake Slurm commands share: the jobs' states in the JSON file $FAKE_SLURM_STATE.

    {"next_id": 1003, "submissions": [{"job": "1000", "argv": [...], "options": {...}}, ...],
     "jobs": {"1000": {"state": "COMPLETED", "exit": "0:0", "elapsed": 2, "restarts": 0},
              "1001_0": {...}, ...}}

Array tasks are keyed `<array job>_<task>`, as sacct and squeue print them. Every change is
made under a lock, so a job's scontrol call can record a requeue while sbatch waits for it.
"""

import contextlib
import fcntl
import json
import os
import shlex

LIVE = ("PENDING", "RUNNING", "REQUEUED")


@contextlib.contextmanager
def state():
  path = os.environ["FAKE_SLURM_STATE"]
  with open(path + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    d = {"next_id": 1000, "jobs": {}, "submissions": []}
    if os.path.exists(path):
      with open(path) as f:
        d = json.load(f)
    yield d
    with open(path + ".tmp", "w") as f:
      json.dump(d, f, indent=1)
    os.replace(path + ".tmp", path)


def options(args: list[str], command: str) -> tuple[dict, list[str]]:
  """`--name=value` and `--flag` options up to the first other word -> (options, the rest)."""
  opts = {}
  for i, a in enumerate(args):
    if not a.startswith("-"):
      return opts, args[i:]
    if not a.startswith("--"):
      raise SystemExit(f"{command}: error: the fake takes --name=value options only, not {a!r}")
    name, eq, value = a[2:].partition("=")
    opts[name] = value if eq else True
  return opts, []


def directives(script: str) -> list[str]:
  """The #SBATCH options, read as sbatch does: up to the first command."""
  out = []
  with open(script) as f:
    for line in f.read().splitlines()[1:]:
      if line.startswith("#SBATCH"):
        out += shlex.split(line[len("#SBATCH"):])
      elif line.strip() and not line.startswith("#"):
        break
  return out


def array_indices(spec: str) -> list[int]:
  """`0-3,5%2` -> [0, 1, 2, 3, 5]."""
  out = []
  for part in spec.split("%")[0].split(","):
    lo, _, hi = part.partition("-")
    out += range(int(lo), int(hi or lo) + 1)
  return out


def matches(key: str, ids: list[str]) -> bool:
  return any(key == j or key.startswith(j + "_") for j in ids)

"""One run at a time in a run directory: an fcntl.flock on `<workdir>/.lock`.

The kernel releases it when the run dies, however it dies, so a crashed run never blocks the
next; launchers ask `in_use` before starting a point whose earlier run may still be saving.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

LOCK = ".lock"  # in the run directory: held by process 0 of the run that uses it


@contextlib.contextmanager
def held(workdir: str, primary: bool = True):
  """Refuse a second run in `workdir` while one runs there (two runs would interleave their
  checkpoints and metrics). Only the `primary` process (0) of a run takes the lock."""
  if not primary:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, LOCK), "a") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      from rlscale.config.errors import ConfigError
      raise ConfigError(f"--workdir={workdir}: another run is using it (it holds "
                        f"{os.path.join(workdir, LOCK)}); wait for it to end or stop it") from None
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def in_use(workdir: str) -> bool:
  """Whether a run holds `workdir`'s lock now (for launchers deciding whether to start one)."""
  path = os.path.join(workdir, LOCK)
  if not os.path.exists(path):
    return False
  with open(path, "a") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      return True
    fcntl.flock(f, fcntl.LOCK_UN)
    return False

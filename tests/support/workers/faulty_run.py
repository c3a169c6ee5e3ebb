"""A run of the command line that kills itself at a chosen moment (fault injection).

    faulty_run.py FAULT -- <rlscale command-line flags>

FAULT is `none` or `SIGNAL:WHERE:N`: send SIGNAL (KILL or TERM) to this process at the N-th
call of WHERE: `update` (a model's update, mid-step), `save` (right after a checkpoint save was
started, so the save is in flight), `eval` (mid-evaluation). The process exits as the real
command line does. `FILL:WHERE:N` fills the disk instead, right before the N-th call, once the
saves begun before it are written: a file at $FAULT_FILL_PATH takes all but $FAULT_FILL_FREE
bytes of its filesystem's free space.
"""

import os
import shutil
import signal
import sys


def _arm(where: str, n: int, sig: int) -> None:
  from rlscale.checkpoints import checkpointer as checkpointing
  from rlscale.trainer import rl_trainer as rl_loop
  from rlscale.rl import trained
  target = {"update": (trained.Trained, "step"), "save": (checkpointing.Checkpointer, "save"),
            "eval": (rl_loop.RLTrainer, "evaluate")}[where]
  real = getattr(*target)
  calls = [0]

  if sig == "FILL":  # the saves begun so far finish first: what the disk then holds is known
    savers, save = [], checkpointing.Checkpointer.save

    def recorded(self, *args, **kwargs):
      savers.append(self)
      return save(self, *args, **kwargs)

    checkpointing.Checkpointer.save = recorded
    real = getattr(*target)

  def wrapped(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == n and sig == "FILL":
      for saver in savers:
        saver.wait()
      _fill(os.environ["FAULT_FILL_PATH"], int(os.environ["FAULT_FILL_FREE"]))
    elif calls[0] == n and where != "save":
      os.kill(os.getpid(), sig)
    out = real(self, *args, **kwargs)
    if calls[0] == n and where == "save" and sig != "FILL":
      os.kill(os.getpid(), sig)  # the save is in flight (asynchronous)
    return out

  setattr(target[0], target[1], wrapped)


def _fill(path: str, leave: int) -> None:
  free = shutil.disk_usage(os.path.dirname(path)).free
  with open(path, "wb") as f:
    f.write(b"\0" * max(0, free - leave))


if __name__ == "__main__":
  fault, argv = sys.argv[1], sys.argv[3:]
  if fault != "none":
    name, where, n = fault.split(":")
    _arm(where, int(n), "FILL" if name == "FILL" else getattr(signal, f"SIG{name}"))
  from rlscale.run import main
  sys.argv = [sys.argv[0]] + argv
  main.run()

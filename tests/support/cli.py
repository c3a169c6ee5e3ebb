"""A command line run in this process: sys.argv set, stdout and stderr captured, its exit code.

For checks of what a command prints and returns where no real process is needed (a config
mistake is one line on stderr and exit code 2). A run that needs its own process (several JAX
processes, a signal, a fresh interpreter) starts one instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import traceback
import types
from typing import Callable


def run_in_process(entry: Callable[[], object], argv: list[str], prog: str = "main.py",
                   cwd: str | None = None) -> types.SimpleNamespace:
  """`entry()` with sys.argv = [prog, *argv] (in `cwd`): returncode, stdout, stderr as a
  subprocess.run result has them; an exception that escapes is printed as Python would."""
  _forget_absl_flags()
  out, err = io.StringIO(), io.StringIO()
  saved_argv, saved_cwd = sys.argv, os.getcwd()
  saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
  code = 0
  try:
    sys.argv = [prog, *argv]
    if cwd is not None:
      os.chdir(cwd)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        entry()
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
          print(e.code, file=sys.stderr)
      except Exception:  # noqa: BLE001  (what the interpreter would print, and exit 1)
        traceback.print_exc()
        code = 1
  finally:
    sys.argv = saved_argv
    os.chdir(saved_cwd)
    _restore_signals(saved_signals)
  return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def _restore_signals(saved: dict) -> None:
  """The command line installed its preemption handlers and watchdog (rlscale/run/main.py):
  this process (a pytest worker) gets its own handlers back, the watchdog disarmed."""
  from rlscale.trainer import preemption
  preemption.install(watchdog=False)
  preemption.reset()
  for s, handler in saved.items():
    signal.signal(s, handler)


def _forget_absl_flags() -> None:
  """absl keeps parsed flags, and the config flag's per-field overrides (`config.x.y`), in one
  process-wide registry: a second command line parses as a fresh process would only without them."""
  from absl import flags
  for name in [n for n in flags.FLAGS if n.startswith("config.")]:
    delattr(flags.FLAGS, name)
  flags.FLAGS.unparse_flags()

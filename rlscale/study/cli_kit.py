"""What the study's and the probe's commands share (launch/study.py, launch/cbs_probe.py): the
flags that launch points and write the report, their values read once, the run command, and
the report written by a script of the checkout in a process of its own."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from typing import Callable

from absl import flags, logging

from rlscale.run import command_line


def launch_flags(what: str, parallel_note: str = "") -> dict:
  """The flags of a command that runs points (`what`: "points", "branches") and reports."""
  return dict(
      parallel=flags.DEFINE_integer("parallel", 1, f"{what} running at once, each on its own "
                                    "devices (CPU cores, GPUs)" + parallel_note),
      dry_run=flags.DEFINE_bool("dry_run", False, f"list the {what}; run nothing"),
      report=flags.DEFINE_bool("report", True, "write the report at the end"),
      run_command=flags.DEFINE_string("run_command", None, "what runs one point, before its "
                                      "flags (default: this Python's `-m rlscale`)"),
      verbose=flags.DEFINE_bool("verbose", False, "on bad input, show the traceback too"))


def values(holders: dict) -> dict:
  """{name: value} of a command's flag holders."""
  return {k: holder.value for k, holder in holders.items()}


def run_command(value: str | None) -> list[str] | None:
  """--run_command split as a shell would, or None (this Python's `-m rlscale`)."""
  return shlex.split(value) if value else None


def checkout_script(*parts: str) -> str | None:
  """A script of the checkout this package runs from (analysis/...), None when installed
  without one."""
  here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  path = os.path.join(here, *parts)
  return path if os.path.exists(path) else None


def write_report(args: list[str], out: str) -> int:
  """Run the report (`args` after this Python) in a process of its own, say where it went and
  return its exit status."""
  t = time.time()
  rc = subprocess.run([sys.executable, *args]).returncode
  logging.info("report: %s in %.1f s (exit %d)", out, time.time() - t, rc)
  return rc


def main(define: Callable[[], None], run: Callable) -> None:
  define()
  command_line.run_app(run)

"""Where a sweep's points run: on this machine (local.py), on Slurm (slurm.py with its
settings, queue and site config), through XManager (xm.py). `make` picks one."""

from __future__ import annotations

import sys

from rlscale.config.errors import ConfigError

KINDS = ("local", "slurm", "xm")


def make(kind: str, config: str, m, pts, parallel: int, command: list[str] | None = None,
         vectorize: str = "", max_lanes: int = 10):
  """The launcher of `kind` for the points `pts` of manifest `m`: .dry_run() -> text,
  .run() -> manifest counts. `command` runs one point before its flags (default: this
  Python's `-m rlscale`, on every launcher). `vectorize` (points side by side in one process)
  is the local launcher's alone."""
  command = command or [sys.executable, "-m", "rlscale"]
  if vectorize and kind != "local":
    raise ConfigError(f"--vectorize={vectorize} runs points side by side with the local "
                      f"launcher only; with --launcher={kind} each point is its own job")
  if kind == "local":
    from rlscale.sweep.launchers.local import LocalLauncher
    return LocalLauncher(config, m, pts, parallel=parallel, command=command,
                         vectorize=vectorize, max_lanes=max_lanes)
  if kind == "slurm":
    from rlscale.sweep.launchers import slurm
    return slurm.SlurmLauncher(config, m, pts, parallel=parallel, command=command)
  if kind == "xm":
    from rlscale.sweep.launchers import xm
    return xm.XMLauncher(config, m, pts, parallel=parallel, command=command)
  raise ConfigError(f"--launcher={kind!r}: one of {', '.join(KINDS)}")

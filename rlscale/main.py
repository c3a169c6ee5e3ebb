"""The command line: `rlscale --config=configs/grpo.py [--workdir=DIR] [--config.x=y]`.

Also `python -m rlscale` and, in a checkout, `python launch/main.py`, with the same flags.
`--config` names a file as ml_collections expects, or a shipped config (`configs/grpo.py:tiny`,
`grpo.py`, `rlscale.configs.grpo`) found by rlscale.config_files from any directory.
"""

import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rlscale import config_files

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiment config file",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (default: runs/<config>-<hash>)")


def _preempted(signum, frame):
  raise KeyboardInterrupt(f"signal {signum}")  # unwinds the run, which finishes its saves


def main(argv):
  del argv
  signal.signal(signal.SIGTERM, _preempted)
  from rlscale import distributed, logs, train  # after absl parsed flags: JAX starts here
  logs.quiet_libraries()
  distributed.initialize()
  import jax
  logging.info("process %d of %d, %d local devices of %d (%s)", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.default_backend())
  train.main(_CONFIG.value, _WORKDIR.value, config_file=flags.FLAGS["config"].config_filename)


def _located(value: str) -> str:
  path, arg = config_files.find(value)
  if path == value.partition(":")[0]:
    return value  # a file here, as written: train.main sees the same config_file as before
  return path + (":" + arg if arg else "")


def locate_config(argv: list[str]) -> list[str]:
  """argv with its `--config` value made a path that config_flags can open from here."""
  out = list(argv)
  for i, a in enumerate(out):
    if a.startswith("--config="):
      out[i] = "--config=" + _located(a[len("--config="):])
      break
    if a == "--config" and i + 1 < len(out):
      out[i + 1] = _located(out[i + 1])
      break
  return out


def run() -> None:
  """The console script `rlscale`."""
  try:
    argv = locate_config(sys.argv)
  except FileNotFoundError as e:
    sys.exit(f"--config: {e}")  # a user's mistake: one line, no traceback
  flags.mark_flags_as_required(["config"])
  app.run(main, argv=argv)

"""The entry point: python launch/main.py --config=configs/grpo.py [--workdir=DIR] [--config.x=y]."""

import os
import signal
import sys

from absl import app, flags, logging
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)

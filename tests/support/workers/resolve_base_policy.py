"""One process of one run resolving the tiny GRPO config's base policy; run by test_base_policy.py.

Usage: python resolve_base_policy.py RUN_NAME CACHE_DIR OUT_DIR NUM_PEERS
All peers (every process of every run) wait for each other before resolving, so they reach the
cache together. Each call of sft.run appends `RUN_NAME PROCESS_INDEX` to OUT_DIR/sft_runs.txt;
the policy folder it got is written to OUT_DIR/RUN_NAME.PROCESS_INDEX.txt.
For several processes of one run, set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID.
"""

import os
import sys
import time

import jax
from absl import logging

from rlscale.run import base_policy
from rlscale.config import files as config_files
from rlscale.resolve import resolved
from rlscale.parallel import distributed
from rlscale.trainer import sft_trainer as sft

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def count_sft_runs(out_dir, run_name):
  real_run = sft.run

  def counted(run):
    with open(os.path.join(out_dir, "sft_runs.txt"), "a") as f:
      f.write(f"{run_name} {jax.process_index()}\n")
    return real_run(run)

  sft.run = counted


def wait_for_peers(out_dir, me, num_peers, timeout=300):
  """A file barrier across runs (jax.distributed spans only one run)."""
  os.makedirs(os.path.join(out_dir, "ready"), exist_ok=True)
  open(os.path.join(out_dir, "ready", me), "w").close()
  deadline = time.time() + timeout
  while len(os.listdir(os.path.join(out_dir, "ready"))) < num_peers:
    if time.time() > deadline:
      raise TimeoutError(f"{me}: peers did not start within {timeout} s")
    time.sleep(0.05)


def main(run_name, cache_dir, out_dir, num_peers):
  logging.set_verbosity(logging.INFO)
  distributed.initialize()
  config_file = os.path.join(REPO, "configs", "grpo.py:tiny")
  cfg = config_files.load(config_file)
  with cfg.unlocked():
    cfg.init.cache_dir = cache_dir
    cfg.init.sft_config = os.path.join(REPO, "configs", "sft.py:tiny")
  count_sft_runs(out_dir, run_name)
  me = f"{run_name}.{jax.process_index()}"
  wait_for_peers(out_dir, me, num_peers)
  policy = base_policy.find_or_build(resolved.resolve(cfg, None, config_file))
  with open(os.path.join(out_dir, me + ".txt"), "w") as f:
    f.write(os.path.abspath(policy))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))

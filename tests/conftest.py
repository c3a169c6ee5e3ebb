"""Tests run on the CPU with 8 simulated devices; the flag must be set before JAX starts."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sys  # noqa: E402
import types  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402

from rlscale import models  # noqa: E402
from rlscale.parallel import sharding


@pytest.fixture(scope="session")
def rules():
  return sharding.rules_from_config(None)


@pytest.fixture(scope="session")
def mesh1():
  return sharding.make_mesh((1, 1, 1), devices=jax.devices()[:1])


@pytest.fixture(scope="session")
def tiny_cfg():
  """The `tiny` shape with a small vocabulary, to keep tests quick."""
  return models.named("tiny", vocab_size=128)


@pytest.fixture(scope="session")
def rl_base_cache(tmp_path_factory):
  """The base policy cache of the multi-process RL tests: their tiny SFT base is built once."""
  return str(tmp_path_factory.mktemp("rl_base"))


@pytest.fixture(scope="session")
def grpo_single_process_run(tmp_path_factory, rl_base_cache):
  """tests/workers/two_process_rl.py's GRPO run in this process on 8 devices (building the SFT
  base into rl_base_cache): the reference that runs of it as two processes are compared with
  (test_distributed.py, test_sweep_slurm.py). Run once: it takes a minute."""
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
  import two_process_rl

  from rlscale.run import train
  run_dir = str(tmp_path_factory.mktemp("grpo_one") / "one")
  summary = train.main(two_process_rl.config("grpo.py", rl_base_cache), run_dir)
  return types.SimpleNamespace(run_dir=run_dir, cache_dir=rl_base_cache, summary=summary)

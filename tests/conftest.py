"""Tests run on the CPU with 8 simulated devices; the flag must be set before JAX starts."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
def tiny_sft_base(tmp_path_factory):
  """The base-policy cache (init.cache_dir) every end-to-end test shares: each SFT recipe's base
  (configs/sft.py:tiny for the tiny GRPO and PPO configs) is built once per session, by the first
  test that needs it, and found by the others (rlscale/run/base_policy.py)."""
  return str(tmp_path_factory.mktemp("tiny_sft_base"))


@pytest.fixture(scope="session")
def grpo_single_process_run(tmp_path_factory, tiny_sft_base):
  """tests/support/workers/two_process_rl.py's GRPO run in this process on 8 devices (building the SFT
  base into tiny_sft_base): the reference that runs of it as two processes are compared with
  (test_distributed.py, test_sweep_slurm.py). Run once: it takes a minute."""
  from tests.support.workers import two_process_rl

  from rlscale.run import train
  run_dir = str(tmp_path_factory.mktemp("grpo_one") / "one")
  summary = train.main(two_process_rl.config("grpo.py", tiny_sft_base), run_dir)
  return types.SimpleNamespace(run_dir=run_dir, cache_dir=tiny_sft_base, summary=summary)


# --- one session, quick tests first (.ci/run: pytest -m "" runs every test) -----------------


def pytest_collection_modifyitems(session, config, items):
  """The quick tests run before the slow ones; a quick failure stops the session before them."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is not None)  # stable
  config.stash[_HAS_SLOW] = any(item.get_closest_marker("slow") for item in items)


_HAS_SLOW = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if (report.failed and item.get_closest_marker("slow") is None
      and item.config.stash.get(_HAS_SLOW, False)):
    item.session.shouldstop = (f"{item.nodeid} failed: the slow tests after the quick ones are "
                               f"not started")

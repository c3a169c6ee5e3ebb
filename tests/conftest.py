"""Tests run on the CPU with 8 simulated devices; the flag must be set before JAX starts."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

from rlscale import models, sharding  # noqa: E402


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

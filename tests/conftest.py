"""Tests run on the CPU with 8 simulated devices; the flag must be set before JAX starts."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One XLA compilation cache for the test run, shared by the pytest workers and every process a
# test starts (end-to-end runs, sweeps, resumes, two-process workers): a tiny run is almost all
# compilation (~20 of its ~21 s), and the same tiny programs recur across tests and runs. Every
# program compiled once is read back instead (the tiny programs take 0.1-1 s each to compile and
# recur in dozens of processes: tests/integration/test_faults.py took 176 s with only those of
# 1 s or more cached, 138 s with all of them). Numbers cannot change: it is
# the same executable; the cache key holds the program, devices, XLA flags and versions. The
# compilation counts in summary.json count Python traces, which still happen. The process that
# makes the folder (pytest, or pytest-xdist's controller, whose workers inherit the variable)
# removes it in pytest_unconfigure.
_OWN_XLA_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import tempfile
  _OWN_XLA_CACHE = tempfile.mkdtemp(prefix="rlscale-tests-xla-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_XLA_CACHE
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

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
  test that needs it, and found by the others (rlscale/run/base_policy.py). Under pytest-xdist
  the workers share one folder: the base policy's lock lets one build while the others wait."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the run's folder above each worker's own
  folder = root / "tiny_sft_base"
  folder.mkdir(exist_ok=True)
  return str(folder)


# Session fixtures that hold a run in one worker's memory: under pytest-xdist every test using
# one goes to the same worker, which runs it once (tiny_sft_base, a folder, is shared instead).
_ONE_WORKER_FIXTURES = ("grpo_single_process_run",)


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


# A wrapper: its part before `yield` runs before every plain implementation, pytest-xdist's
# included, which turns each item's xdist_group marker into its node id's @group suffix (with
# tryfirst=True, xdist's ran first on the workers and saw no marker: no group took effect).
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(session, config, items):
  """The quick tests run before the slow ones; a quick failure stops the session before them.
  The slow tests that take longest (`@pytest.mark.slow(seconds=N)`, N measured on a 2-core
  machine) start first, so that the workers finish together rather than one waiting on a long
  test started last.

  Under pytest-xdist (--dist loadgroup) each file's quick tests stay on one worker (they share
  module fixtures and compiled functions); a slow test runs wherever a worker is free, with the
  others of its file when they share a module fixture, and with the other users of a fixture
  in _ONE_WORKER_FIXTURES."""
  items.sort(key=_order)  # stable: collection order otherwise
  config.stash[_HAS_SLOW] = any(item.get_closest_marker("slow") for item in items)
  for item in items:
    group = _xdist_group(item)
    if group:
      item.add_marker(pytest.mark.xdist_group(group))
  return (yield)


def _order(item) -> tuple[int, float]:
  slow = item.get_closest_marker("slow")
  return (0, 0) if slow is None else (1, -slow.kwargs.get("seconds", 0))


def _xdist_group(item) -> str | None:
  if item.get_closest_marker("slow") is None:
    return f"quick:{item.path}"
  fixtures = getattr(item, "_fixtureinfo", None)
  defs = fixtures.name2fixturedefs if fixtures else {}
  for name in _ONE_WORKER_FIXTURES:
    if name in defs:
      return name
  if any(d[-1].scope == "module" for d in defs.values()):
    return f"slow:{item.path}"
  return None


_HAS_SLOW = pytest.StashKey[bool]()


def pytest_collection_finish(session):
  """On a pytest-xdist worker (--dist loadgroup), every grouped test's node id must carry its
  group, or the groups silently do nothing (pytest 9 ignores the node id pytest-xdist 3.8
  writes: each worker then built the module fixtures and conftest's one-worker runs itself).
  The worker's UsageError stops the session (pytest-xdist reports it as an INTERNALERROR)."""
  if getattr(session.config.option, "loadgroup", False):
    lost = [i.nodeid for i in session.items
            if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
      raise pytest.UsageError(f"pytest-xdist did not apply the xdist_group of {len(lost)} "
                              f"tests (e.g. {lost[0]}): check the pytest and pytest-xdist "
                              f"versions (setup.py's test extra)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  report = outcome.get_result()
  if (report.failed and item.get_closest_marker("slow") is None
      and item.config.stash.get(_HAS_SLOW, False)):
    item.session.shouldstop = (f"{item.nodeid} failed: the slow tests after the quick ones are "
                               f"not started")


def pytest_unconfigure(config):
  """Removes the test run's XLA compilation cache (only in the process that made it)."""
  if _OWN_XLA_CACHE:
    import shutil
    shutil.rmtree(_OWN_XLA_CACHE, ignore_errors=True)

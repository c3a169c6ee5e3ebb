"""rollout.generation_batch='auto' from XLA's memory analysis (rlscale/sampling/memory_fit.py).

The search and the choice's bookkeeping are checked against made-up byte counts (fast); the
compiled decode calls on the tiny model over 8 devices: what the fit picks, that it allocates
nothing, that the bytes grow with the batch, and that the chosen call runs without compiling
again. Candidates: the divisors of 64 responses that split over 8 batch shards, 8 to 64.
"""

import json
import math

import jax
import numpy as np
import pytest
from flax import nnx

from rlscale import models
from rlscale.parallel import sharding
from rlscale.config.errors import ConfigError
from rlscale.sampling import Sampler, SamplingParams, generate, memory_fit

PROMPT, RESPONSES, UNIT, GROUP = 8, 64, 8, 4


@pytest.fixture(scope="module")
def sampler_and_state():
  """A one-layer tiny model on 8 devices, 3 new tokens: each compile takes a few seconds."""
  cfg = models.named("tiny", vocab_size=128, num_layers=1)
  mesh = sharding.make_mesh((8, 1, 1))
  rules = sharding.rules_from_config(None)
  policy = models.create_sharded(models.CausalLM, cfg, mesh, rules, jax.random.key(0))
  graphdef, state = nnx.split(policy)
  return Sampler(graphdef, SamplingParams(max_new_tokens=3, decode_chunk=4), mesh, rules), state


@pytest.fixture(scope="module")
def whole(sampler_and_state):
  """The fit with the device budget (host memory on CPU): the whole step fits."""
  sampler, state = sampler_and_state
  before = jax.live_arrays()  # held, so that no array of an earlier test is freed meanwhile
  fit = memory_fit.fit_generation_batch(sampler, state, PROMPT, RESPONSES, UNIT, GROUP)
  held = {id(a) for a in before}
  new = [a.shape for a in jax.live_arrays() if id(a) not in held]
  return fit, len(before), new


def _prompts(rows: int, vocab: int = 128):
  """`rows` rows in runs of GROUP copies of a prompt, as an RL step's are."""
  rng = np.random.default_rng(0)
  tokens = np.repeat(rng.integers(3, vocab, (rows // GROUP, PROMPT)), GROUP, 0).astype(np.int32)
  return tokens, np.ones_like(tokens, bool)


def test_fit_chooses_a_call_that_splits_over_the_unit_and_allocates_nothing(whole,
                                                                           sampler_and_state):
  fit, _, new_arrays = whole
  sampler, _ = sampler_and_state
  assert fit.generation_batch % UNIT == 0 and RESPONSES % fit.generation_batch == 0
  assert fit.generation_batch == RESPONSES and fit.bound == "whole step"
  assert fit.compilations == 1 and fit.next_batch is None
  assert 0 < fit.bytes_per_device <= fit.budget_bytes
  assert fit.chosen.analysed and fit.chosen.cache > 0 and fit.chosen.temp > 0
  assert "host memory" in fit.budget_source  # CPU devices report no memory
  assert new_arrays == [] and not sampler._caches  # shapes only: no buffers
  json.dumps(fit.describe())


def test_the_chosen_call_runs_without_compiling_again(whole, sampler_and_state):
  fit, _, _ = whole
  sampler, state = sampler_and_state
  assert sampler.traces == 1  # the fit's trace of the chosen call counts as the run's
  tokens, mask = _prompts(RESPONSES)
  out = generate(sampler, state, tokens, mask, jax.random.key(0), fit.generation_batch,
                 group_size=GROUP)
  assert out.tokens.shape == (RESPONSES, 3)
  assert sampler.traces == 1  # jit's cache held the executable the fit compiled
  sampler.release()


@pytest.mark.slow
def test_a_budget_just_below_a_candidate_picks_the_next_smaller(whole, sampler_and_state):
  sampler, state = sampler_and_state

  def fit(budget, **kw):
    return memory_fit.fit_generation_batch(sampler, state, PROMPT, RESPONSES, UNIT, GROUP,
                                           budget_bytes=budget, **kw)

  need = {b: fit(10**12, candidates=[b]).bytes_per_device for b in (8, 16, 32, 64)}
  # Bytes grow with the batch among calls that prefill alike: 8 and 16 rows prefill every
  # row (1 and 2 rows per shard), 32 and 64 each run of GROUP copies once.
  assert need[8] < need[16] and need[32] < need[64]
  for b in need:
    assert fit(need[b]).generation_batch == max(c for c in need if need[c] <= need[b])
    below = [c for c in need if need[c] < need[b]]
    if below:
      got = fit(need[b] - 1)
      assert got.generation_batch == max(below) and got.bound == "memory"
      assert got.bytes_per_device < need[b] <= got.next_bytes_per_device
      assert got.compilations <= 4  # every call is in jit's cache by now: no compile time
      assert got.compile_s < 1.0


@pytest.mark.slow
def test_a_budget_below_the_smallest_candidate_is_a_config_error(sampler_and_state):
  sampler, state = sampler_and_state
  with pytest.raises(ConfigError, match=r"rollout.generation_batch='auto': no generation .*"
                                        r"needs [\d.]+ MiB per device.*budget of 0.0 MiB "
                                        r"\(given\)"):
    memory_fit.fit_generation_batch(sampler, state, PROMPT, RESPONSES, UNIT, GROUP,
                                    budget_bytes=1000)


# --- the search and the bookkeeping, with made-up bytes ---

@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 13, 32])
def test_largest_fitting_bisects(n):
  candidates = list(range(1, n + 1))
  for last in range(-1, n):
    probes = []
    i = memory_fit.largest_fitting(candidates, lambda c: probes.append(c) or c <= last + 1)
    assert i == last
    assert len(probes) <= 1 + math.ceil(math.log2(n)) if n > 1 else len(probes) == 1


@pytest.fixture
def linear_bytes(monkeypatch, sampler_and_state):
  """call_bytes as 1000 bytes of parameters plus 100 per row: no compilation."""
  def fake(sampler, state, prompt_len, batch, group=1):
    return memory_fit.CallBytes(batch, 1000, 100 * batch, 0, 0, 0, -1, cache=90 * batch,
                                rollout=0, analysed=True, compile_s=0.0)
  monkeypatch.setattr(memory_fit, "call_bytes", fake)
  return sampler_and_state


@pytest.mark.parametrize("budget,want,bound,nxt", [
    (10**9, 4096, "whole step", None), (1000 + 100 * 512, 512, "memory", 1024),
    (1000 + 100 * 512 - 1, 256, "memory", 512), (1000 + 100 * 8, 8, "memory", 16)])
def test_fit_bounds_and_compile_counts(linear_bytes, budget, want, bound, nxt):
  sampler, state = linear_bytes
  fit = memory_fit.fit_generation_batch(sampler, state, PROMPT, 4096, UNIT, budget_bytes=budget)
  assert (fit.generation_batch, fit.bound, fit.next_batch) == (want, bound, nxt)
  assert len(fit.candidates) == 10  # 8, 16, ..., 4096
  assert fit.compilations <= 1 + math.ceil(math.log2(10))


def test_a_call_that_prefills_once_can_fit_where_a_smaller_one_does_not(monkeypatch,
                                                                          sampler_and_state):
  """16 rows (2 per shard) prefill every row, 32 rows each run of 4 once: 32 fits, 16 not."""
  def fake(sampler, state, prompt_len, batch, group=1):
    temp = 5000 if group == 1 else 0
    return memory_fit.CallBytes(batch, 1000, 100 * batch, temp, 0, 0, -1, cache=90 * batch,
                                rollout=0, analysed=True, compile_s=0.0)
  monkeypatch.setattr(memory_fit, "call_bytes", fake)
  sampler, state = sampler_and_state
  fit = memory_fit.fit_generation_batch(sampler, state, PROMPT, 64, UNIT, 4, budget_bytes=5000)
  assert (fit.generation_batch, fit.next_batch, fit.bound) == (32, 64, "memory")
  assert fit.measured[32] < fit.budget_bytes < fit.measured[64]


def test_the_row_cap_bounds_before_memory(linear_bytes):
  sampler, state = linear_bytes
  fit = memory_fit.fit_generation_batch(sampler, state, PROMPT, 4096, UNIT, budget_bytes=10**9,
                                        max_rows_per_device=4)
  assert (fit.generation_batch, fit.bound, fit.next_batch) == (32, "row cap", None)


def test_no_candidate_that_fits_names_the_field(linear_bytes):
  sampler, state = linear_bytes
  with pytest.raises(ConfigError, match=r"rollout.generation_batch='auto'.* fits; the least, "
                                        r"8 rows per call, needs"):
    memory_fit.fit_generation_batch(sampler, state, PROMPT, 4096, UNIT, budget_bytes=1500)
  with pytest.raises(ConfigError, match="splits over 8"):
    memory_fit.fit_generation_batch(sampler, state, PROMPT, 4096, UNIT, candidates=[12])

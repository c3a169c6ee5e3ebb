"""`rollout.generation_batch='auto'`: the largest decode call that fits the device memory.

The Sampler compiles one decode call per (rows, prompt length). This module compiles that call
abstractly for candidate generation batches (shapes and shardings only: no buffer is allocated
and nothing runs), reads XLA's memory analysis of each, and keeps the largest candidate whose
per-device bytes fit the budget. Memory grows with the batch among calls that prefill alike
(see `_search`), so a bisection per prefill group compiles O(log n) of the n candidates.
Past the critical generation batch (benchmarks/generation_scaling.py) a larger call only adds
memory, so candidates above MAX_GENERATION_BATCH_PER_DEVICE rows per batch shard
(rlscale/plan/batch.py) are not tried.

What one call needs per device, from `Compiled.memory_analysis()` (sizes are per device: the
program XLA compiles is one device's part of the SPMD program):
  argument_size_in_bytes  the inputs: parameters, prompts, and the KV cache when the call reads it
  output_size_in_bytes    the rollout and the returned KV cache
  temp_size_in_bytes      scratch XLA allocates for the call (activations, logits, loop carries)
  alias_size_in_bytes     outputs written into donated inputs: counted once, not twice
  generated_code_size_in_bytes  the executable's code where it lives on the device (0 on CPU)
  peak_memory_in_bytes    XLA's own peak; on CPU it leaves out the temporaries, so it is kept
                          for the record, not used
The call's bytes are arguments + outputs + temporaries - aliased + code, with one correction:
`_decode` never reads the donated cache (only its shapes), so with jit's default
keep_unused=False XLA drops it from the arguments and aliases nothing, while the Sampler still
holds that cache until the call returns. The arguments are therefore the larger of XLA's figure
and the arguments' shapes, the cache included.

The compiled calls are left in the Sampler's call cache, as a call of that shape would leave
them: the run's first call of the chosen shape reuses the executable without tracing or
compiling again (jit's cache matches the abstract arguments with the real ones).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from rlscale.parallel import distributed
from rlscale.parallel import sharding
from rlscale.config.errors import ConfigError
from rlscale.plan.batch import MAX_GENERATION_BATCH_PER_DEVICE, divisors
from rlscale.sampling.decode import Sampler, shared_prefill

SAFETY_FRACTION = 0.9  # of the device's memory: headroom for fragmentation and XLA's runtime


@dataclasses.dataclass(frozen=True)
class CallBytes:
  """XLA's memory analysis of one decode call, per device."""
  batch: int  # rows of the call over all devices
  arguments: int  # the larger of XLA's argument bytes and the arguments' shapes (see above)
  outputs: int
  temp: int
  alias: int
  code: int
  peak: int  # XLA's peak_memory_in_bytes (-1: not reported); for the record
  cache: int  # the KV cache of the call
  rollout: int  # the call's Rollout output
  analysed: bool  # False: no memory analysis on this backend, shapes only (no temporaries)
  compile_s: float

  @property
  def total(self) -> int:
    """Bytes the call needs on a device while it runs."""
    return self.arguments + self.outputs + self.temp - self.alias + self.code


@dataclasses.dataclass(frozen=True)
class FitResult:
  """The choice of `fit_generation_batch` and the numbers behind it (bytes are per device)."""
  generation_batch: int
  bytes_per_device: int  # the chosen call during the step's last call (earlier rollouts held)
  next_batch: int | None  # the smallest larger candidate compiled (it did not fit), if any
  next_bytes_per_device: int | None
  budget_bytes: int
  budget_source: str
  bound: str  # "memory" | "row cap" | "whole step"
  compilations: int  # calls lowered and compiled by the fit (a repeat fit hits jit's cache)
  compile_s: float
  candidates: tuple[int, ...]  # the batches the search chose among, ascending
  measured: dict[int, int]  # batch -> bytes per device, every candidate tried
  chosen: CallBytes

  def describe(self) -> dict[str, Any]:
    """JSON-able, for summary.json and the benchmark's line."""
    return {"generation_batch": self.generation_batch, "bound": self.bound,
            "bytes_per_device": self.bytes_per_device, "next_batch": self.next_batch,
            "next_bytes_per_device": self.next_bytes_per_device,
            "budget_bytes": self.budget_bytes, "budget_source": self.budget_source,
            "compilations": self.compilations, "compile_s": round(self.compile_s, 2),
            "candidates": list(self.candidates),
            "measured": {str(b): n for b, n in sorted(self.measured.items())},
            "analysed": self.chosen.analysed}

  def summary_line(self) -> str:
    nxt = (f"; {self.next_batch} needs {_mib(self.next_bytes_per_device)}"
           if self.next_batch else "")
    return (f"generation batch {self.generation_batch} (auto, bound: {self.bound}): "
            f"{_mib(self.bytes_per_device)} per device of a {_mib(self.budget_bytes)} budget "
            f"({self.budget_source}){nxt}; {self.compilations} compilations, "
            f"{self.compile_s:.1f} s")


def fit_generation_batch(sampler: Sampler, params_state, prompt_len: int, responses: int,
                         unit: int, group_size: int = 1, budget_bytes: int | None = None,
                         candidates: Sequence[int] | None = None,
                         fraction: float = SAFETY_FRACTION,
                         max_rows_per_device: int = MAX_GENERATION_BATCH_PER_DEVICE) -> FitResult:
  """The largest generation batch whose decode call fits `budget_bytes` per device.

  Candidates are the divisors of `responses` (P x G) that are multiples of `unit` (batch
  shards x processes), so that no call is padded, at most `max_rows_per_device` rows per batch
  shard. `params_state` is the policy's parameters (arrays or ShapeDtypeStructs with their
  shardings). `budget_bytes` None: `device_budget(params_state, fraction)`. Raises ConfigError,
  naming the field, the bytes and the budget, when no candidate fits.
  """
  if candidates is None:
    candidates = [d for d in divisors(responses) if d % unit == 0]
  candidates = sorted(candidates)
  if not candidates or any(c % unit or responses % c for c in candidates):
    raise ConfigError(f"rollout.generation_batch='auto': no generation batch among "
                      f"{candidates} divides {responses} responses and splits over {unit} "
                      f"batch shards x processes")
  source = "given"
  if budget_bytes is None:
    budget_bytes, source = device_budget(params_state, fraction)
  shards = sharding.batch_divisor(sampler.mesh, sampler.rules)
  allowed = [c for c in candidates if c <= max_rows_per_device * shards] or candidates[:1]
  measure = _Measure(sampler, params_state, prompt_len, responses, group_size, unit)
  chosen = _search(allowed, measure, budget_bytes)
  if chosen is None:
    need = min(measure.calls, key=measure)
    raise ConfigError(_too_big(measure.calls[need], measure(need), budget_bytes, source, unit))
  measure.count_run_trace(chosen)
  return _result(allowed, chosen, candidates, measure, budget_bytes, source)


def _search(allowed: list[int], measure: _Measure, budget: int) -> int | None:
  """The largest candidate that fits (None if none does).

  Memory grows with the batch among calls that prefill alike, but not across them: a call
  whose batch shards hold whole groups prefills each prompt once, and can need less than a
  smaller call that prefills every row. So the candidates are bisected per prefill group,
  the class of the largest first, each later class only above the best so far.
  """
  classes: dict[int, list[int]] = {}
  for c in allowed:
    classes.setdefault(measure.group(c), []).append(c)
  best = None
  for cands in sorted(classes.values(), key=lambda cs: -cs[-1]):
    cands = [c for c in cands if best is None or c > best]
    i = largest_fitting(cands, lambda b: measure(b) <= budget)
    if i >= 0:
      best = cands[i]
  return best


def largest_fitting(candidates: Sequence[int], fits: Callable[[int], bool]) -> int:
  """The index of the largest candidate that fits (-1 if none), `fits` being monotone (true
  up to some candidate, false past it): the largest first (the whole step often fits), then
  a bisection, 1 + ceil(log2 n) calls of `fits` at most."""
  n = len(candidates)
  if n == 0:
    return -1
  if fits(candidates[-1]):
    return n - 1
  lo, hi = -1, n - 1  # candidates[lo] fits (or lo = -1), candidates[hi] does not
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if fits(candidates[mid]):
      lo = mid
    else:
      hi = mid
  return lo


def device_budget(params_state=None, fraction: float = SAFETY_FRACTION) -> tuple[int, str]:
  """Bytes per device a decode call may use, and where the figure comes from.

  On GPU/TPU: the device's bytes_limit x `fraction`, less what is in use now besides the
  parameters (optimizer states, a reference policy, a critic: the call's arguments count the
  parameters already). On CPU, where devices report no memory: the host's physical memory
  shared by the local devices, x `fraction`, less the live arrays besides the parameters on
  the first device. Over several processes, the smallest budget of any of them, so that every
  process makes the same choice.
  """
  dev = jax.local_devices()[0]
  stats = dev.memory_stats() or {}
  live = [x for x in jax.tree.leaves(params_state) if isinstance(x, jax.Array)]
  params = _tree_bytes(live)  # what of the parameters is on the device now
  if "bytes_limit" in stats:
    limit, held = stats["bytes_limit"], stats.get("bytes_in_use", 0) - params
    what = f"{dev.platform} bytes_limit {_mib(limit)}"
  else:
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // jax.local_device_count()
    held = _live_bytes(dev) - params
    what = f"host memory / {jax.local_device_count()} local devices = {_mib(limit)}"
  held = max(held, 0)
  budget = int(limit * fraction) - held
  if jax.process_count() > 1:
    budget = int(-distributed.global_max(-budget))
  return budget, f"{what} x {fraction} - {_mib(held)} held besides the parameters"


def call_bytes(sampler: Sampler, params_state, prompt_len: int, batch: int,
               group: int = 1) -> CallBytes:
  """Compile the Sampler's call for `batch` x `prompt_len` prompt tokens, with the prompts'
  runs of `group` copies prefilled once, from shapes alone, and read its memory analysis."""
  state = jax.tree.map(_abstract, params_state)
  shape = (batch, prompt_len)
  call, _ = sampler.call_for(state, shape, group)
  args = sampler.abstract_args(state, shape)
  cache = args[1]
  t = time.perf_counter()
  compiled = call.lower(*args).compile()
  seconds = time.perf_counter() - t
  rollout_out, _ = compiled.out_info
  shaped = _tree_bytes(args)  # the key counts 0
  sizes = dict(cache=_tree_bytes(cache), rollout=_tree_bytes(rollout_out), compile_s=seconds)
  m = compiled.memory_analysis()
  if m is None:  # this backend reports nothing: the shapes, without temporaries
    return CallBytes(batch, shaped, sizes["cache"] + sizes["rollout"], 0, 0, 0, -1,
                     analysed=False, **sizes)
  return CallBytes(batch, max(m.argument_size_in_bytes, shaped), m.output_size_in_bytes,
                   m.temp_size_in_bytes, m.alias_size_in_bytes, m.generated_code_size_in_bytes,
                   getattr(m, "peak_memory_in_bytes", -1), analysed=True, **sizes)


class _Measure:
  """Bytes per device of the step's last call for a candidate batch, each compiled once."""

  def __init__(self, sampler, params_state, prompt_len, responses, group_size, unit):
    self.sampler, self.params_state, self.prompt_len = sampler, params_state, prompt_len
    self.responses, self.group_size = responses, group_size
    self.procs = max(1, unit // sharding.batch_divisor(sampler.mesh, sampler.rules))
    self.calls: dict[int, CallBytes] = {}
    self.traces_before = sampler.traces
    self.known = set(sampler._calls)  # calls the Sampler had compiled before the fit

  def group(self, batch: int) -> int:
    """The prefill's run length in a call of `batch` rows, as `generate` computes it."""
    shards = sharding.batch_divisor(self.sampler.mesh, self.sampler.rules)
    return shared_prefill(self.group_size, batch // self.procs, batch, shards)

  def __call__(self, batch: int) -> int:
    if batch not in self.calls:
      self.calls[batch] = call_bytes(self.sampler, self.params_state, self.prompt_len, batch,
                                     self.group(batch))
    c = self.calls[batch]
    earlier = (self.responses // batch - 1) * c.rollout  # generate() holds them to the end
    return c.total + earlier

  def count_run_trace(self, batch: int) -> None:
    """Sampler.traces counts the run's compilations: the chosen call's trace, when the fit
    made it, is the one the run's first call would have made; the others are the fit's."""
    key = ((batch, self.prompt_len), self.group(batch))
    made = key in self.sampler._calls and key not in self.known
    self.sampler.traces = self.traces_before + int(made)


def _result(allowed, chosen, candidates, measure: _Measure, budget, source) -> FitResult:
  """The choice, the smallest larger candidate compiled (none of them fits) and the bound."""
  larger = [b for b in sorted(measure.calls) if b > chosen]
  nxt = larger[0] if larger else None
  if chosen == candidates[-1]:
    bound = "whole step"
  elif chosen == allowed[-1]:
    bound = "row cap"
  else:
    bound = "memory"
  measured = {b: measure(b) for b in measure.calls}
  return FitResult(chosen, measured[chosen], nxt, measured.get(nxt), budget, source, bound,
                   len(measure.calls), sum(c.compile_s for c in measure.calls.values()),
                   tuple(candidates), measured, measure.calls[chosen])


def _too_big(call: CallBytes, needed: int, budget: int, source: str, unit: int) -> str:
  return (f"rollout.generation_batch='auto': no generation batch that splits over {unit} "
          f"batch shards x processes fits; the least, {call.batch} rows per call, needs "
          f"{_mib(needed)} per device (arguments {_mib(call.arguments)} of which KV cache "
          f"{_mib(call.cache)}, outputs {_mib(call.outputs)}, temporaries {_mib(call.temp)}), "
          f"over the budget of {_mib(budget)} ({source}); shorten rollout.max_new_tokens or "
          f"the prompts, or shard the batch over more devices")


def _abstract(x):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))


def _device_bytes(x) -> int:
  """Bytes of one device's shard of an array or ShapeDtypeStruct (0 for PRNG keys)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    return 0
  s = getattr(x, "sharding", None)
  shape = s.shard_shape(x.shape) if s is not None else x.shape
  return math.prod(shape) * np.dtype(x.dtype).itemsize


def _tree_bytes(tree) -> int:
  return sum(_device_bytes(x) for x in jax.tree.leaves(tree))


def _live_bytes(dev) -> int:
  """Bytes of the live arrays' shards on `dev`."""
  return sum(_device_bytes(a) for a in jax.live_arrays() if dev in a.sharding.device_set)


def _mib(n: int | None) -> str:
  return "?" if n is None else f"{n / 2**20:.1f} MiB"

"""The batch plan: every size of a step, derived once from the config.

A batch-size study varies one quantity, so one object owns it. `plan(cfg)` reads the config
and the mesh and returns a `BatchPlan`; the loop, the algorithms, the optimizer's scaling rule,
the noise-scale report and the analysis scripts read their sizes from it and from nowhere
else. Its checks are the config's size errors: each names the field, its value and what is
allowed, before anything is compiled.

Units: an RL step samples P prompts x G responses; each trained model cuts them
into `num_minibatches` optimizer steps per epoch over `num_epochs` epochs, and runs each
mini-batch in passes of `microbatch` rows. The batch B of a run, the one the learning-rate
rules, B_simple and every figure use, is the actor's responses per optimizer step,
P x G / num_minibatches (also given in prompts, B / G).

`microbatch` and `generation_batch` may be "auto": the plan picks a divisor for memory and
speed and says which (see `auto_microbatch`, `auto_generation_batch`). On a run's mesh
(`plan_for`) the micro-batch's tokens are also bounded by memory (`TrainMemory`): an estimate
of a training pass's activation bytes per token against what the device has left once the
parameters, gradients and optimizer moments are resident.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import ml_collections

from rlscale.config.errors import ConfigError

AUTO = "auto"

# Rows of one forward/backward pass per device, at most. Small passes are faster on CPUs
# (one pass of 512 responses takes ~1.8x the time of eight passes of 64: caches), and on
# accelerators the bound below in tokens is the one that binds for real sequence lengths.
MAX_MICRO_ROWS_PER_DEVICE = 64
# Tokens of one pass per device, at most: activations of a pass grow with its tokens (the
# float32 logits alone are tokens x vocab x 4 bytes, twice with their gradient).
MAX_MICRO_TOKENS_PER_DEVICE = 16384
# Responses of one compiled decode call, at most: past the critical generation batch a
# larger call only adds KV-cache memory (benchmarks/generation_scaling.py).
MAX_GENERATION_BATCH_PER_DEVICE = 1024
# KV-cache bytes of one decode call per device, at most.
MAX_KV_CACHE_BYTES_PER_DEVICE = 4 << 30
# Memory of a host whose devices report none (CPU), shared by its local devices: the
# activation budget of the automatic micro-batch there (the memory benchmark's 12 GB bound, docs/performance.md).
CPU_MEMORY_BYTES = 12 << 30
# Of the device's memory, the share a training pass may plan for: headroom for fragmentation,
# XLA's runtime and what the estimate leaves out.
MEMORY_FRACTION = 0.9
# Bytes per token of a step's rollout held on the devices while it trains: the tokens and
# their mask, the sampled and recomputed log-probabilities, a reference's or a critic's value.
ROLLOUT_BYTES_PER_TOKEN = 16


@dataclasses.dataclass(frozen=True)
class ModelBatch:
  """How one trained model (the actor, PPO's critic, the SFT policy) consumes a step."""
  name: str
  minibatch: int  # rows per optimizer step
  num_minibatches: int  # optimizer steps per epoch
  num_epochs: int  # passes over the step's rows
  microbatch: int  # rows per forward/backward pass
  microbatch_auto: bool  # chosen by the plan
  microbatch_bound: str = ""  # auto: what bounded the choice (row cap, token cap, memory, ...)
  shared_prompt: int = 1  # G when each micro-batch's groups run their prompt once, else 1
  pack: bool = False  # shared_prompt > 1 and its responses packed when they fit (rl/packing.py)

  @property
  def optimizer_steps(self) -> int:
    """Optimizer steps per step of the run."""
    return self.num_minibatches * self.num_epochs

  @property
  def num_micro(self) -> int:
    """Passes per mini-batch."""
    return self.minibatch // self.microbatch


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  num_prompts: int  # P per step (SFT: demonstrations per step)
  group_size: int  # G (SFT: 1)
  generation_batch: int  # responses per compiled decode call (0: no sampling, SFT)
  num_steps: int  # steps of the run
  models: Mapping[str, ModelBatch]  # by name: "actor" (and "critic"), or "policy" for SFT
  shards: int  # batch shards of the mesh
  processes: int
  memory: "TrainMemory | None" = None  # the memory bound of auto micro-batches, when known

  @property
  def responses(self) -> int:
    """Responses (rows) per step: P x G."""
    return self.num_prompts * self.group_size

  @property
  def total_responses(self) -> int:
    return self.num_steps * self.responses

  @property
  def main(self) -> ModelBatch:
    """The model whose batch is the run's: the actor (the policy for SFT)."""
    return self.models.get("actor") or next(iter(self.models.values()))

  @property
  def batch(self) -> int:
    """B: responses per optimizer step of the actor, the run's batch size."""
    return self.main.minibatch

  def effective_batch(self, informative: float) -> float:
    """The effective B of a step that trained on `informative` responses with signal (a
    group of equal rewards has none under a group-relative advantage): informative responses
    per optimizer step of the actor. The nominal B when every response carries signal;
    dynamic sampling (rollout.dynamic_sampling) refills steps to keep it there."""
    return informative / self.main.num_minibatches

  @property
  def batch_prompts(self) -> float:
    """B in prompts: B / G."""
    return self.batch / self.group_size

  def describe(self) -> dict[str, Any]:
    """The plan as JSON-able numbers (written to summary.json, read by analysis)."""
    out = {"num_prompts": self.num_prompts, "group_size": self.group_size,
           "responses_per_step": self.responses, "batch": self.batch,
           "batch_prompts": self.batch_prompts, "generation_batch": self.generation_batch,
           "num_steps": self.num_steps, "total_responses": self.total_responses,
           "batch_shards": self.shards, "processes": self.processes}
    for name, m in self.models.items():
      out[name] = {"minibatch": m.minibatch, "num_minibatches": m.num_minibatches,
                   "num_epochs": m.num_epochs, "microbatch": m.microbatch,
                   "microbatch_auto": m.microbatch_auto,
                   "optimizer_steps_per_step": m.optimizer_steps,
                   "shared_prompt": m.shared_prompt > 1, "pack_responses": m.pack}
      if m.microbatch_bound:
        out[name]["microbatch_bound"] = m.microbatch_bound
    if self.memory is not None:
      out["train_memory"] = self.memory.describe()
    return out

  def summary_line(self) -> str:
    parts = [f"P={self.num_prompts} x G={self.group_size} = {self.responses} responses/step",
             f"B={self.batch} responses ({self.batch_prompts:g} prompts) per optimizer step",
             f"{self.num_steps} steps"]
    if self.generation_batch:
      parts.append(f"generation batch {self.generation_batch}")
    for m in self.models.values():
      auto = f" (auto: {m.microbatch_bound})" if m.microbatch_bound else (
          " (auto)" if m.microbatch_auto else "")
      parts.append(f"{m.name}: {m.num_minibatches} x {m.minibatch} rows, {m.num_epochs} "
                   f"epoch(s), micro-batch {m.microbatch}{auto}"
                   + (", each prompt once per group" if m.shared_prompt > 1 else "")
                   + (", responses packed" if m.pack else ""))
    if self.memory is not None:
      parts.append(self.memory.summary_line())
    return "; ".join(parts)


def divisors(n: int) -> list[int]:
  """The divisors of n, ascending, in O(sqrt(n)) steps (a config's 10**9 rows takes
  milliseconds, not minutes)."""
  small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
  return small + [n // d for d in reversed(small) if d * d != n]


def micro_rows_cap(seq_len: int, memory_tokens: int | None = None) -> tuple[int, str]:
  """Rows of one pass per device at most, and which bound set it: MAX_MICRO_ROWS_PER_DEVICE
  ("row cap"), MAX_MICRO_TOKENS_PER_DEVICE ("token cap") or `memory_tokens`, the tokens
  per device the memory estimate allows ("memory"; None: unknown)."""
  seq = max(seq_len, 1)
  caps = [(MAX_MICRO_ROWS_PER_DEVICE, "row cap"), (MAX_MICRO_TOKENS_PER_DEVICE // seq, "token cap")]
  if memory_tokens is not None:
    caps.append((memory_tokens // seq, "memory"))
  rows, bound = min(caps, key=lambda cb: cb[0])
  return max(1, rows), bound


def auto_microbatch(minibatch: int, shards: int, seq_len: int, need_two: bool,
                    memory_tokens: int | None = None, unit: int = 0) -> int | None:
  """The largest divisor of the mini-batch that splits over the batch shards (over `unit`, a
  multiple of them, when given), keeps a pass within `micro_rows_cap` rows per device (the row
  and token caps, and the memory bound when given), and leaves two or more passes when the
  noise scale needs them (None if none does)."""
  rows, _ = micro_rows_cap(seq_len, memory_tokens)
  unit = unit or shards
  fits = [d for d in divisors(minibatch) if d % unit == 0 and (not need_two or d < minibatch)]
  small = [d for d in fits if d <= rows * shards]
  return max(small) if small else (min(fits) if fits else None)


def _micro_bound(micro: int, minibatch: int, shards: int, seq_len: int, need_two: bool,
                 memory_tokens: int | None) -> str:
  """What bounded an automatic micro-batch, in words for the plan's line."""
  rows, bound = micro_rows_cap(seq_len, memory_tokens)
  if micro > rows * shards:
    return f"{bound}, exceeded: no smaller divisor splits over the shards"
  if micro == minibatch:
    return "whole mini-batch"
  if need_two and minibatch <= rows * shards:
    return "two passes for the noise scale"
  return bound


def auto_generation_batch(responses: int, unit: int, kv_bytes_per_row: int) -> int:
  """The largest divisor of the step's responses that splits over `unit` (batch shards x
  processes) and keeps a decode call within the per-device row and KV-cache bounds, so that
  no call is padded; the whole step when it fits."""
  per_device = max(1, min(MAX_GENERATION_BATCH_PER_DEVICE,
                          MAX_KV_CACHE_BYTES_PER_DEVICE // max(kv_bytes_per_row, 1)))
  fits = [d for d in divisors(responses) if d % unit == 0]
  small = [d for d in fits if d <= per_device * unit]
  return max(small) if small else min(fits)


def _int(errors: list[str], field: str, value: Any, auto: bool = False) -> int:
  if auto and value == AUTO:
    return 0
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    allowed = "a positive integer or 'auto'" if auto else "a positive integer"
    errors.append(f"{field}={value!r} must be {allowed}")
    return 0
  return value


def _model(errors, name, prefix, section, rows, shards, seq_len, noise,
           memory: "TrainMemory | None" = None, group: int = 1,
           shared: Any = False, pack: bool = False) -> ModelBatch | None:
  """A model's mini- and micro-batches from its config section (rl or critic). `shared`
  (train.shared_prompt, 'auto' or a bool): micro-batches of whole groups of `group` on every
  batch shard run each prompt once (models/shared_prompt.py); 'auto' prefers such a
  micro-batch and takes it when one fits; `pack` (train.pack_responses) packs its responses."""
  n_mb = _int(errors, f"{prefix}.num_minibatches", section["num_minibatches"])
  epochs = _int(errors, f"{prefix}.num_epochs", section["num_epochs"])
  micro = _int(errors, f"{prefix}.microbatch", section["microbatch"], auto=True)
  if not (n_mb and epochs and rows) or errors:
    return None
  if rows % n_mb:
    what = "sft.batch_size" if prefix == "sft" else "P*G responses per step"
    errors.append(f"{prefix}.num_minibatches={n_mb} does not divide {what} ({rows}); "
                  f"divisors: {divisors(rows)}")
    return None
  label = "the mini-batch" if name in ("actor", "policy") else f"the {name}'s mini-batch"
  minibatch = rows // n_mb
  auto = section["microbatch"] == AUTO
  bound = ""
  if auto:
    mem_tokens = memory.max_tokens(name) if memory is not None else None
    micro = None
    if shared is not False and group >= 2:
      micro = auto_microbatch(minibatch, shards, seq_len, noise, mem_tokens, group * shards)
      if micro is not None and micro > micro_rows_cap(seq_len, mem_tokens)[0] * shards:
        micro = None  # whole groups only past the row, token or memory bound: rows instead
    micro = micro or auto_microbatch(minibatch, shards, seq_len, noise, mem_tokens)
    if micro is None:
      errors.append(f"{prefix}.microbatch='auto': no divisor of the mini-batch ({minibatch} rows) "
                    f"splits over {shards} batch shards" + (" in two or more passes (the noise "
                    "scale needs them; set noise.enabled=False)" if noise else ""))
      return None
    bound = _micro_bound(micro, minibatch, shards, seq_len, noise, mem_tokens)
  elif minibatch % micro:
    source = "sft.batch_size" if prefix == "sft" else f"{rows} / {prefix}.num_minibatches"
    errors.append(f"{prefix}.microbatch={micro} does not divide {label} ({minibatch} rows "
                  f"= {source}); divisors: {divisors(minibatch)}")
  elif micro % shards:
    errors.append(f"{prefix}.microbatch={micro} must split over {shards} batch shards (the "
                  f"mesh's batch axes)")
  elif noise and minibatch // micro < 2:
    errors.append(f"{prefix}.microbatch={micro} leaves one pass per mini-batch ({minibatch} "
                  f"rows): the noise scale needs two or more; lower it, set it to 'auto', or set "
                  f"noise.enabled=False")
  on = shared is not False and group >= 2 and micro and micro % (group * shards) == 0
  if shared is True and not errors and group < 2:
    errors.append(f"train.shared_prompt=True needs groups of 2 or more responses "
                  f"(rl.group_size={group})")
  elif shared is True and not on and not errors:
    errors.append(f"train.shared_prompt=True needs micro-batches of whole groups on every batch "
                  f"shard: {prefix}.microbatch={micro} is not a multiple of rl.group_size x "
                  f"batch shards ({group} x {shards}); set it to 'auto' or False")
  return ModelBatch(name, minibatch, n_mb, epochs, micro, auto, bound, group if on else 1,
                    bool(on and pack))


def _shared_prompt(errors: list[str], cfg) -> Any:
  """train.shared_prompt: 'auto', True or False (False when responses are single tokens: no
  response position feeds another; 'auto' is also False when a model takes several optimizer
  steps per epoch, whose mini-batches it would make whole groups)."""
  value = cfg["train"]["shared_prompt"]
  if value != AUTO and not isinstance(value, bool):
    errors.append(f"train.shared_prompt={value!r} must be 'auto', True or False")
    return False
  new_tokens = cfg["rollout"]["max_new_tokens"]
  if isinstance(new_tokens, int) and new_tokens < 2:
    return False
  return value


def _pack(errors: list[str], cfg) -> bool:
  """train.pack_responses: True or False (taken with shared-prompt training only)."""
  value = cfg["train"]["pack_responses"]
  if not isinstance(value, bool):
    errors.append(f"train.pack_responses={value!r} must be True or False")
    return False
  return value


def _steps(errors: list[str], train: Mapping[str, Any], per_step: int) -> int:
  total = train["total_responses"] or 0
  if total:
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
      errors.append(f"train.total_responses={total!r} must be a positive integer (or 0: run "
                    f"train.num_steps steps)")
      return 0
    if per_step and total % per_step:
      errors.append(f"train.total_responses={total} is not a whole number of steps of "
                    f"{per_step} responses")
    return total // per_step if per_step else 0
  return _int(errors, "train.num_steps", train["num_steps"])


def plan(cfg: Mapping[str, Any], *, shards: int = 1, processes: int = 1, seq_len: int = 0,
         kv_bytes_per_row: int = 0, gen_shards: int | None = None,
         memory: "TrainMemory | None" = None) -> BatchPlan:
  """The plan of `cfg` (a ConfigDict or the dict of a run's config.json) on a mesh with
  `shards` batch shards over `processes` processes; `gen_shards` are the sampler's batch
  shards when it has a mesh of its own (mesh.roles='split'), else the trainer's.

  `seq_len` (prompt + response tokens), `kv_bytes_per_row` (the KV cache of one response) and
  `memory` (the activation bound of a training pass) size the automatic choices; 0 or None
  means unknown. Raises ConfigError naming every bad field.
  """
  return _plan(ml_collections.ConfigDict(cfg), shards, processes, seq_len, kv_bytes_per_row, gen_shards, memory)


def _plan(cfg, shards, processes, seq_len, kv_bytes_per_row, gen_shards, memory) -> BatchPlan:
  errors: list[str] = []
  kind = cfg["kind"]
  noise = "noise" in cfg and bool(cfg.noise.enabled)  # SFT has none
  if kind == "sft":
    s = cfg["sft"]
    rows = _int(errors, "sft.batch_size", s["batch_size"])
    section = {"num_minibatches": 1, "num_epochs": 1, "microbatch": s["microbatch"]}
    models = {"policy": _model(errors, "policy", "sft", section, rows, shards, seq_len, False,
                               memory)}
    p, g, gen = rows, 1, 0
  else:
    r = cfg["rl"]
    p = _int(errors, "rl.num_prompts", r["num_prompts"])
    g = _int(errors, "rl.group_size", r["group_size"])
    rows = p * g
    shared = _shared_prompt(errors, cfg)
    if shared == AUTO and any(s["num_minibatches"] != 1 for s in
                              [r] + ([cfg["critic"]] if "critic" in cfg else [])):
      # Mini-batches of whole groups would change what each optimizer step sees (32 prompts
      # instead of 128 random responses): 'auto' keeps the per-row shuffle; True takes it.
      shared = False
    pack = _pack(errors, cfg)
    models = {"actor": _model(errors, "actor", "rl", r, rows, shards, seq_len, noise, memory,
                              g, shared, pack)}
    if "critic" in cfg:
      models["critic"] = _model(errors, "critic", "critic", cfg["critic"], rows, shards, seq_len,
                                noise, memory, g, shared, pack)
    gen_value, gen_unit = cfg["rollout"]["generation_batch"], (gen_shards or shards) * processes
    refill = cfg["rollout"]["dynamic_sampling"] is True and g
    if refill and gen_value == AUTO:  # dynamic sampling's calls hold whole groups per process
      gen_unit = math.lcm(gen_unit, g * processes)
    gen = _generation_batch(errors, gen_value, rows, gen_unit, kv_bytes_per_row)
    if refill and rows and rows % (gen_shards or shards):
      errors.append(f"rollout.dynamic_sampling=True assembles the step on the sampler's "
                    f"devices: rl.num_prompts x rl.group_size = {rows} must split over its "
                    f"{gen_shards or shards} batch shards")
    if refill and gen and gen % (g * processes):
      errors.append(f"rollout.dynamic_sampling=True decodes whole groups per call: "
                    f"rollout.generation_batch={gen} must be a multiple of rl.group_size x "
                    f"processes ({g} x {processes})")
  if p and p % processes:
    errors.append(f"{'sft.batch_size' if kind == 'sft' else 'rl.num_prompts'}={p} must split "
                  f"over {processes} processes")
  steps = _steps(errors, cfg["train"], rows)
  if memory is not None and not errors:
    errors += _fit_errors(kind, memory, models, rows, shards, seq_len, gen,
                          (gen_shards or shards) * processes, kv_bytes_per_row,
                          kind != "sft" and cfg["rollout"]["dynamic_sampling"] is True)
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
  return BatchPlan(p, g, gen, steps, models, shards, processes, memory)


def _gib(n: float) -> str:
  return f"{n / 2**30:.3g} GiB"


def _fit_errors(kind: str, memory: "TrainMemory", models, rows: int, shards: int,
                seq_len: int, gen: int, gen_unit: int, kv_bytes_per_row: int,
                refill: bool = False) -> list[str]:
  """What cannot fit a device whatever the micro-batch: the models' state, one row's training
  pass, one decode call's KV cache, the step's rollout. One error each, with the numbers."""
  free = memory.budget  # the device's share less the models' state
  device = f"of {_gib(free + memory.resident)} a device: {memory.source}"
  if free <= 0:
    return [f"the model's state (parameters, gradients, optimizer moments of each trained copy) "
            f"takes {_gib(memory.resident)} per device, more than its share ({device}): shard "
            f"it over more devices (mesh.shape's fsdp and tensor axes) or choose a smaller model"]
  errors = []
  for name in models:
    row = memory.bytes_per_token.get(name, 0) * seq_len
    if row > free:
      errors.append(f"one row of {seq_len} tokens needs {_gib(row)} of activations in the "
                    f"{name}'s training pass, more than the {_gib(free)} left per device after "
                    f"the state ({device}): shorten rollout.max_new_tokens or "
                    f"task.max_prompt_len, or set train.remat and train.logprob_chunk")
  field = "sft.batch_size" if kind == "sft" else "rl.num_prompts x rl.group_size"
  held = rows + (2 * (gen or rows) if refill else 0)  # dynamic sampling: two calls besides
  rollout = -(-held // shards) * seq_len * ROLLOUT_BYTES_PER_TOKEN
  if rollout > free:
    errors.append(f"{field} = {rows} rows of {seq_len} tokens per step"
                  + (f" (and two decode calls of dynamic sampling, {held - rows} rows)"
                     if held > rows else "") + f" hold {_gib(rollout)} per "
                  f"device while the step trains (~{ROLLOUT_BYTES_PER_TOKEN} bytes a token over "
                  f"{shards} batch shards), more than the {_gib(free)} left after the state "
                  f"({device}): fewer prompts or responses per step, or more devices")
  if gen and kv_bytes_per_row:
    kv = -(-gen // gen_unit) * kv_bytes_per_row
    if kv > free:
      what = ("one row" if gen <= gen_unit else
              f"rollout.generation_batch={gen} ({-(-gen // gen_unit)} rows per device)")
      errors.append(f"the KV cache of {what} of {seq_len} tokens takes {_gib(kv)} per device, "
                    f"more than the {_gib(free)} left after the state ({device}): "
                    + ("shorten rollout.max_new_tokens" if gen <= gen_unit else
                       "lower rollout.generation_batch or set it to 'auto'"))
  return errors


def _generation_batch(errors, value, rows: int, unit: int, kv_bytes_per_row: int) -> int:
  if value == AUTO:
    return auto_generation_batch(rows, unit, kv_bytes_per_row) if rows and rows % unit == 0 else 0
  value = _int(errors, "rollout.generation_batch", value, auto=True)
  if value and value % unit:
    errors.append(f"rollout.generation_batch={value} must split over {unit} batch shards x "
                  f"processes")
  return min(value, rows)


def plan_for(cfg, env, errors: list[str] | None = None, memory: bool = True) -> BatchPlan | None:
  """The plan of a run (its config, checked) on its mesh, with the task's sequence length,
  the model's KV cache and the training pass's memory (`train_memory_of`; not with `memory`
  False: train.remat or train.logprob_chunk is bad) sizing the automatic choices.

  With `errors` (the resolve step's list, where a part of `env` that could not be built is
  None), the plan's errors are appended and None returned; without, they raise ConfigError.
  """
  import jax
  from rlscale.parallel import sharding
  built = env.mesh is not None and env.rules is not None
  shards = sharding.batch_divisor(env.mesh, env.rules) if built else 1
  gen_shards = sharding.batch_divisor(env.meshes.sampler, env.rules) if built else 1
  seq_len, kv_bytes, mem, m = 0, 0, None, env.model_cfg
  if env.task is not None and m is not None:
    seq_len = env.task.max_prompt_len + cfg.rollout.max_new_tokens if "rollout" in cfg else 0
    if seq_len:
      itemsize = 2 if cfg.model.dtype in ("bfloat16", "float16") else 4
      kv_bytes = 2 * m.num_layers * m.num_kv_heads * m.head_dim * seq_len * itemsize
    seq_len = seq_len or env.task.max_prompt_len + env.task.max_answer_len
    if built and memory:
      mem = train_memory_of(cfg, m, seq_len, env.mesh)
  try:
    return _plan(cfg, shards, jax.process_count(), seq_len, kv_bytes, gen_shards, mem)
  except ConfigError as e:
    if errors is None:
      raise
    errors += [line.strip() for line in str(e).splitlines()[1:]]
    return None


# --- the memory bound of a training pass (plan_for) ---


@dataclasses.dataclass(frozen=True)
class TrainMemory:
  """Activation bytes per token of each trained model's pass against a per-device budget."""
  bytes_per_token: Mapping[str, int]  # by model name: actor / critic / policy
  budget: int  # bytes per device for a pass's activations (device memory - resident state)
  resident: int  # bytes per device of parameters, gradients and optimizer moments
  source: str  # where the device's memory figure came from

  def max_tokens(self, name: str) -> int:
    """Tokens of one pass per device that fit the budget (0 when the state alone does not)."""
    return max(self.budget, 0) // max(self.bytes_per_token.get(name, 1), 1)

  def describe(self) -> dict[str, Any]:
    return {"bytes_per_token": dict(self.bytes_per_token), "budget": self.budget,
            "resident": self.resident, "source": self.source}

  def summary_line(self) -> str:
    per = ", ".join(f"{k} {v / 2**10:.0f} KiB" for k, v in self.bytes_per_token.items())
    return (f"training pass ~{per} of activations per token against {self.budget / 2**30:.2f} "
            f"GiB per device ({self.source}, less {self.resident / 2**30:.2f} GiB of state)")


def device_memory() -> tuple[int, str]:
  """Bytes of one device's memory and where the figure comes from: the device's bytes_limit
  where JAX reports it (GPU, TPU), else CPU_MEMORY_BYTES shared by the host's local devices."""
  import jax
  dev = jax.local_devices()[0]
  stats = dev.memory_stats() or {}
  if "bytes_limit" in stats:
    return int(stats["bytes_limit"]), f"{dev.platform} bytes_limit x {MEMORY_FRACTION}"
  n = jax.local_device_count()
  return (CPU_MEMORY_BYTES // n, f"CPU default {CPU_MEMORY_BYTES / 2**30:g} GiB per host / "
          f"{n} devices x {MEMORY_FRACTION}")


def train_memory_of(cfg, model_cfg, seq_len: int, mesh) -> TrainMemory:
  """The memory bound of the run's training passes (models/memory.py has the estimate).

  Resident per device: every trained model's state (models/memory.state_bytes) plus a frozen
  copy of the policy for a KL reference (rl.kl_coef) or a proximal policy (rl.prox_com),
  sharded over the model axes (fsdp x tensor). The budget is the device's memory x
  MEMORY_FRACTION less that; each model's passes take it in turn.
  """
  from rlscale.models import memory
  remat, chunk = cfg.train.remat, cfg.train.logprob_chunk
  pd = cfg.model.param_dtype
  policy = model_cfg.num_params()
  resident = memory.state_bytes(policy, pd, cfg.optim.state_dtype)
  per_token = {}
  if cfg.kind == "sft":
    per_token["policy"] = memory.activation_bytes_per_token(model_cfg, seq_len, remat, chunk)
  else:
    per_token["actor"] = memory.activation_bytes_per_token(model_cfg, seq_len, remat, chunk)
    copies = bool(cfg.rl.kl_coef) + bool(cfg.rl.prox_com)
    resident += copies * memory.state_bytes(policy, pd, trained=False)
  if "critic" in cfg:
    head = 0 if model_cfg.tie_embeddings else model_cfg.vocab_size * model_cfg.d_model
    critic = policy - head + model_cfg.d_model + 1
    resident += memory.state_bytes(critic, pd, cfg.critic.optim.state_dtype)
    per_token["critic"] = memory.activation_bytes_per_token(model_cfg, seq_len, remat, chunk,
                                                            head=False)
  model_shards = mesh.shape.get("fsdp", 1) * mesh.shape.get("tensor", 1)
  resident //= model_shards
  limit, source = device_memory()
  return TrainMemory(per_token, int(limit * MEMORY_FRACTION) - resident, resident, source)

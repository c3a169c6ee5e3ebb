"""The batch plan: every size of a step, derived once from the config.

A batch-size study varies one quantity, so one object owns it. `plan(cfg)` reads the config
and the mesh and returns a `BatchPlan`; the loop, the algorithms, the optimizer's scaling rule,
the noise-scale report and the analysis scripts read their sizes from it and from nowhere
else. Its checks are the config's size errors: each names the field, its value and what is
allowed, before anything is compiled.

Units (DESIGN.md): an RL step samples P prompts x G responses; each trained model cuts them
into `num_minibatches` optimizer steps per epoch over `num_epochs` epochs, and runs each
mini-batch in passes of `microbatch` rows. The batch B of a run, the one the learning-rate
rules, B_simple and every figure use, is the actor's responses per optimizer step,
P x G / num_minibatches (also given in prompts, B / G).

`microbatch` and `generation_batch` may be "auto": the plan picks a divisor for memory and
speed and says which (see `auto_microbatch`, `auto_generation_batch`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

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


class ConfigError(ValueError):
  """A config field with a value that cannot work; the message names it."""


@dataclasses.dataclass(frozen=True)
class ModelBatch:
  """How one trained model (the actor, PPO's critic, the SFT policy) consumes a step."""
  name: str
  minibatch: int  # rows per optimizer step
  num_minibatches: int  # optimizer steps per epoch
  num_epochs: int  # passes over the step's rows
  microbatch: int  # rows per forward/backward pass
  microbatch_auto: bool  # chosen by the plan

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
    """B: responses per optimizer step of the actor, the run's batch size (DESIGN.md)."""
    return self.main.minibatch

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
                   "optimizer_steps_per_step": m.optimizer_steps}
    return out

  def summary_line(self) -> str:
    parts = [f"P={self.num_prompts} x G={self.group_size} = {self.responses} responses/step",
             f"B={self.batch} responses ({self.batch_prompts:g} prompts) per optimizer step",
             f"{self.num_steps} steps"]
    if self.generation_batch:
      parts.append(f"generation batch {self.generation_batch}")
    for m in self.models.values():
      parts.append(f"{m.name}: {m.num_minibatches} x {m.minibatch} rows, {m.num_epochs} "
                   f"epoch(s), micro-batch {m.microbatch}{' (auto)' if m.microbatch_auto else ''}")
    return "; ".join(parts)


def divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def auto_microbatch(minibatch: int, shards: int, seq_len: int, need_two: bool) -> int | None:
  """The largest divisor of the mini-batch that splits over the batch shards, keeps a pass
  within MAX_MICRO_ROWS_PER_DEVICE rows and MAX_MICRO_TOKENS_PER_DEVICE tokens per device,
  and leaves two or more passes when the noise scale needs them (None if none does)."""
  rows = max(1, min(MAX_MICRO_ROWS_PER_DEVICE, MAX_MICRO_TOKENS_PER_DEVICE // max(seq_len, 1)))
  fits = [d for d in divisors(minibatch) if d % shards == 0 and (not need_two or d < minibatch)]
  small = [d for d in fits if d <= rows * shards]
  return max(small) if small else (min(fits) if fits else None)


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


def _model(errors, name, prefix, section, rows, shards, seq_len, noise) -> ModelBatch | None:
  """A model's mini- and micro-batches from its config section (rl or critic)."""
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
  if auto:
    micro = auto_microbatch(minibatch, shards, seq_len, noise)
    if micro is None:
      errors.append(f"{prefix}.microbatch='auto': no divisor of the mini-batch ({minibatch} rows) "
                    f"splits over {shards} batch shards" + (" in two or more passes (the noise "
                    "scale needs them; set noise.enabled=False)" if noise else ""))
      return None
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
  return ModelBatch(name, minibatch, n_mb, epochs, micro, auto)


def _steps(errors: list[str], train: Mapping[str, Any], per_step: int) -> int:
  total = train.get("total_responses", 0) or 0
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
         kv_bytes_per_row: int = 0, gen_shards: int | None = None) -> BatchPlan:
  """The plan of `cfg` (a ConfigDict or the dict of a run's config.json) on a mesh with
  `shards` batch shards over `processes` processes; `gen_shards` are the sampler's batch
  shards when it has a mesh of its own (mesh.roles='split'), else the trainer's.

  `seq_len` (prompt + response tokens) and `kv_bytes_per_row` (the KV cache of one response)
  size the automatic choices; 0 means unknown. Raises ConfigError naming every bad field.
  """
  errors: list[str] = []
  kind = cfg["kind"]
  noise = bool(cfg.get("noise", {}).get("enabled", False))
  if kind == "sft":
    s = cfg["sft"]
    rows = _int(errors, "sft.batch_size", s["batch_size"])
    section = {"num_minibatches": 1, "num_epochs": 1, "microbatch": s["microbatch"]}
    models = {"policy": _model(errors, "policy", "sft", section, rows, shards, seq_len, False)}
    p, g, gen = rows, 1, 0
  else:
    r = cfg["rl"]
    p = _int(errors, "rl.num_prompts", r["num_prompts"])
    g = _int(errors, "rl.group_size", r["group_size"])
    rows = p * g
    models = {"actor": _model(errors, "actor", "rl", r, rows, shards, seq_len, noise)}
    if "critic" in cfg:
      models["critic"] = _model(errors, "critic", "critic", cfg["critic"], rows, shards, seq_len,
                                noise)
    gen = _generation_batch(errors, cfg["rollout"]["generation_batch"], rows,
                            (gen_shards or shards) * processes, kv_bytes_per_row)
  if p and p % processes:
    errors.append(f"{'sft.batch_size' if kind == 'sft' else 'rl.num_prompts'}={p} must split "
                  f"over {processes} processes")
  steps = _steps(errors, cfg["train"], rows)
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
  return BatchPlan(p, g, gen, steps, models, shards, processes)


def _generation_batch(errors, value, rows: int, unit: int, kv_bytes_per_row: int) -> int:
  if value == AUTO:
    return auto_generation_batch(rows, unit, kv_bytes_per_row) if rows and rows % unit == 0 else 0
  value = _int(errors, "rollout.generation_batch", value, auto=True)
  if value and value % unit:
    errors.append(f"rollout.generation_batch={value} must split over {unit} batch shards x "
                  f"processes")
  return min(value, rows)


def batch_shards(mesh_shape, rules, device_count: int) -> int:
  """Batch shards of a mesh of `mesh_shape` (one -1 allowed) over `device_count` devices."""
  from rlscale import sharding
  shape = [int(s) for s in mesh_shape]
  if -1 in shape:
    shape[shape.index(-1)] = device_count // max(1, math.prod(s for s in shape if s != -1))
  axes = rules.get("batch") or ()
  axes = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(dict(zip(sharding.MESH_AXES, shape))[a] for a in axes)


def plan_for(cfg, env) -> BatchPlan:
  """The plan of a run on its mesh, with the task's sequence length and the model's KV cache
  sizing the automatic choices."""
  import jax
  from rlscale import sharding
  seq_len = env.task.max_prompt_len + cfg.rollout.max_new_tokens if "rollout" in cfg else 0
  m = env.model_cfg
  kv_bytes = 0
  if seq_len:
    itemsize = 2 if cfg.model.dtype in ("bfloat16", "float16") else 4
    kv_bytes = 2 * m.num_layers * m.num_kv_heads * m.head_dim * seq_len * itemsize
  return plan(cfg, shards=sharding.batch_divisor(env.mesh, env.rules),
              processes=jax.process_count(), seq_len=seq_len or env.task.max_prompt_len +
              env.task.max_answer_len, kv_bytes_per_row=kv_bytes,
              gen_shards=sharding.batch_divisor(env.meshes.sampler, env.rules))

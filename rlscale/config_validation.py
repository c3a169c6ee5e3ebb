"""Check a whole config before any compute; every error names the field and its value.

The owners of each part check it: the batch plan (rlscale/batch.py) every size, the
algorithm's file its own fields (rlscale/rl/algorithm.py), the optimizer module its section,
SamplingParams the rollout's. What is left here is what no constructor sees: the mesh
against the devices, the model and task names, the run's schedule.
"""

from __future__ import annotations

import math

import jax
import ml_collections

from rlscale import batch, optim, sharding, tasks
from rlscale.batch import ConfigError
from rlscale.sampling import SamplingParams

__all__ = ["ConfigError", "validate"]


def _mesh(errors: list[str], cfg) -> int:
  """Batch shards of the config's mesh on this run's devices (1 when the mesh is wrong)."""
  shape = [int(s) for s in cfg.mesh.shape]
  n = jax.device_count()
  known = math.prod(s for s in shape if s != -1)
  if len(shape) != 3 or shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    errors.append(f"mesh.shape={tuple(shape)} must be 3 positive sizes (data, fsdp, tensor), "
                  f"at most one -1")
    return 1
  if (-1 in shape and n % known) or (-1 not in shape and known != n):
    errors.append(f"mesh.shape={tuple(shape)} does not fit {n} devices")
    return 1
  try:
    rules = sharding.rules_from_config(cfg.mesh.rules)
  except ValueError as e:
    errors.append(f"mesh.rules: {e}")
    return 1
  return batch.batch_shards(shape, rules, n)


def _common(errors: list[str], cfg) -> None:
  if cfg.task.name not in tasks.NAMES:
    errors.append(f"task.name={cfg.task.name!r} is not one of {tasks.NAMES}")
  for f in ("dtype", "param_dtype"):
    if cfg.model[f] not in ("float32", "bfloat16", "float16"):
      errors.append(f"model.{f}={cfg.model[f]!r}: use float32, bfloat16 or float16")
  if not cfg.model.hf_checkpoint:
    from rlscale.models import NAMED
    if cfg.model.name not in NAMED:
      errors.append(f"model.name={cfg.model.name!r} is not one of {sorted(NAMED)}")
  errors += optim.check(cfg.optim, "optim")
  for f in ("eval_every", "checkpoint_every", "log_every", "total_responses",
            "eval_every_responses", "peak_flops"):
    if f in cfg.train and cfg.train[f] < 0:
      errors.append(f"train.{f}={cfg.train[f]} must be >= 0")


def _rl(errors: list[str], cfg) -> None:
  from rlscale.rl import algorithm
  errors += algorithm.check(cfg)
  if "critic" in cfg:
    errors += optim.check(cfg.critic.optim, "critic.optim")
  ro = cfg.rollout
  if ro.temperature <= 0:
    errors.append(f"rollout.temperature={ro.temperature} must be > 0 for RL sampling")
  try:
    SamplingParams(max_new_tokens=ro.max_new_tokens, temperature=max(ro.temperature, 0.0),
                   top_k=ro.top_k, top_p=ro.top_p, decode_chunk=ro.decode_chunk)
  except ValueError as e:  # "sampling: a=1 must ...; b=2 must ..."
    errors += ["rollout." + m for m in str(e).removeprefix("sampling: ").split("; ")]
  if not 0 < cfg.noise.decay < 1:
    errors.append(f"noise.decay={cfg.noise.decay} must be in (0, 1)")
  if not cfg.target.metric:
    errors.append("target.metric is empty")


def validate(cfg: ml_collections.ConfigDict) -> batch.BatchPlan:
  """Raise ConfigError listing every problem found in `cfg`; the batch plan when none."""
  errors: list[str] = []
  shards = _mesh(errors, cfg)
  _common(errors, cfg)
  if cfg.kind != "sft":
    _rl(errors, cfg)
  if cfg.kind != "sft" and "rl" not in cfg:
    raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
  try:
    plan = batch.plan(cfg, shards=shards, processes=jax.process_count())
  except ConfigError as e:
    errors += str(e).splitlines()[1:]
    plan = None
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(e.strip() for e in errors))
  return plan

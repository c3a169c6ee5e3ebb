"""Check a whole config before any compute; every error names the field and its value."""

from __future__ import annotations

import math

import jax
import ml_collections

from rlscale import optim, sharding, tasks
from rlscale.rl.advantages import ADVANTAGES
from rlscale.rl.losses import AGGREGATIONS, KL_ESTIMATORS


class ConfigError(ValueError):
  pass


def _positive(errors, cfg, section, *names):
  for n in names:
    v = cfg[section][n]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
      errors.append(f"{section}.{n}={v!r} must be a positive number")


def _mesh(errors, cfg) -> int:
  """Number of batch shards the mesh gives, after checking its shape."""
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
  if -1 in shape:
    shape[shape.index(-1)] = n // known
  try:
    rules = sharding.rules_from_config(cfg.mesh.rules)
  except ValueError as e:
    errors.append(f"mesh.rules: {e}")
    return 1
  axes = rules.get("batch") or ()
  axes = axes if isinstance(axes, tuple) else (axes,)
  return math.prod(dict(zip(sharding.MESH_AXES, shape))[a] for a in axes)


def _common(errors, cfg) -> int:
  if cfg.task.name not in tasks.NAMES:
    errors.append(f"task.name={cfg.task.name!r} is not one of {tasks.NAMES}")
  for f in ("dtype", "param_dtype"):
    if cfg.model[f] not in ("float32", "bfloat16", "float16"):
      errors.append(f"model.{f}={cfg.model[f]!r}: use float32, bfloat16 or float16")
  if not cfg.model.hf_checkpoint:
    from rlscale.models import NAMED
    if cfg.model.name not in NAMED:
      errors.append(f"model.name={cfg.model.name!r} is not one of {sorted(NAMED)}")
  _positive(errors, cfg, "optim", "lr")
  _positive(errors, cfg, "train", "num_steps")
  for f in ("eval_every", "checkpoint_every", "log_every"):
    if cfg.train[f] < 0:
      errors.append(f"train.{f}={cfg.train[f]} must be >= 0")
  if cfg.optim.schedule not in ("constant", "cosine", "linear"):
    errors.append(f"optim.schedule={cfg.optim.schedule!r}; known: constant, cosine, linear")
  if cfg.optim.lr_scaling not in optim.RULES:
    errors.append(f"optim.lr_scaling={cfg.optim.lr_scaling!r}; known: {optim.RULES}")
  if cfg.optim.reference_batch is not None and cfg.optim.reference_batch <= 0:
    errors.append(f"optim.reference_batch={cfg.optim.reference_batch} must be positive")
  for f in ("total_responses", "eval_every_responses", "peak_flops"):
    if cfg.train[f] < 0:
      errors.append(f"train.{f}={cfg.train[f]} must be >= 0")
  return _mesh(errors, cfg)


def _divides(errors, name, value, what, total):
  if value <= 0 or total % value:
    errors.append(f"{name}={value} does not divide {what} ({total})")


def _ppo(errors, cfg, shards: int) -> None:
  r, c = cfg.rl, cfg.critic
  for name in ("gamma", "lam"):
    if not 0 <= r[name] <= 1:
      errors.append(f"rl.{name}={r[name]} must be in [0, 1]")
  if r.dual_clip and r.dual_clip <= 1:
    errors.append(f"rl.dual_clip={r.dual_clip} must be > 1 (or 0 to turn it off)")
  if r.prox_com < 0:
    errors.append(f"rl.prox_com={r.prox_com} must be >= 0 (0: standard PPO)")
  if c.value_clip < 0 or c.warmup_steps < 0:
    errors.append(f"critic.value_clip={c.value_clip}, critic.warmup_steps={c.warmup_steps} "
                  f"must be >= 0")
  _positive(errors, cfg, "critic", "num_minibatches", "num_epochs", "microbatch")
  if errors:
    return
  total = r.num_prompts * r.group_size
  _divides(errors, "critic.num_minibatches", c.num_minibatches, "P*G responses per step", total)
  if not errors:
    mb = total // c.num_minibatches
    _divides(errors, "critic.microbatch", c.microbatch, "the critic's mini-batch", mb)
    if c.microbatch % shards:
      errors.append(f"critic.microbatch={c.microbatch} must split over {shards} batch shards")
    if not errors and cfg.noise.enabled and mb // c.microbatch < 2:
      errors.append(f"critic.microbatch={c.microbatch} leaves one micro-batch per mini-batch "
                    f"({mb}): the noise scale needs two or more")
  if c.optim.lr <= 0:
    errors.append(f"critic.optim.lr={c.optim.lr} must be a positive number")
  if c.optim.lr_scaling not in optim.RULES:
    errors.append(f"critic.optim.lr_scaling={c.optim.lr_scaling!r}; known: {optim.RULES}")


def validate(cfg: ml_collections.ConfigDict) -> None:
  """Raise ConfigError listing every problem found in `cfg`."""
  errors: list[str] = []
  shards = _common(errors, cfg)  # the mesh spans every process
  if cfg.kind == "sft":
    _positive(errors, cfg, "sft", "batch_size", "microbatch")
    _divides(errors, "sft.microbatch", cfg.sft.microbatch, "sft.batch_size", cfg.sft.batch_size)
    if cfg.sft.microbatch > 0 and cfg.sft.microbatch % shards:
      errors.append(f"sft.microbatch={cfg.sft.microbatch} must split over {shards} batch shards")
  elif cfg.kind in ("grpo", "ppo"):
    r, ro = cfg.rl, cfg.rollout
    _positive(errors, cfg, "rl", "num_prompts", "group_size", "num_minibatches", "num_epochs",
              "microbatch")
    _positive(errors, cfg, "rollout", "max_new_tokens", "generation_batch", "decode_chunk")
    if not errors:
      total = r.num_prompts * r.group_size
      _divides(errors, "rl.num_minibatches", r.num_minibatches, "P*G responses per step", total)
      if not errors:
        _divides(errors, "rl.microbatch", r.microbatch, "the mini-batch P*G/num_minibatches",
                 total // r.num_minibatches)
      if r.microbatch % shards:
        errors.append(f"rl.microbatch={r.microbatch} must split over {shards} batch shards "
                      f"(the mesh's batch axes)")
      if ro.generation_batch % shards:
        errors.append(f"rollout.generation_batch={ro.generation_batch} must split over {shards} "
                      f"batch shards")
      if total % jax.process_count():
        errors.append(f"P*G={total} must split over {jax.process_count()} processes")
      if r.num_prompts % jax.process_count():
        errors.append(f"rl.num_prompts={r.num_prompts} must split over {jax.process_count()} "
                      f"processes")
      mb = total // r.num_minibatches
      if not errors and cfg.noise.enabled and mb // r.microbatch < 2:
        errors.append(f"rl.microbatch={r.microbatch} leaves one micro-batch per mini-batch ({mb}): "
                      f"the noise scale needs two or more; lower rl.microbatch or set "
                      f"noise.enabled=False")
      if cfg.train.total_responses and cfg.train.total_responses % total:
        errors.append(f"train.total_responses={cfg.train.total_responses} is not a whole number "
                      f"of steps of P*G={total} responses")
    if not 0 < cfg.noise.decay < 1:
      errors.append(f"noise.decay={cfg.noise.decay} must be in (0, 1)")
    if not cfg.target.metric:
      errors.append("target.metric is empty")
    if cfg.kind == "grpo":
      if r.group_size < 2 and r.advantage in ("grpo", "rloo"):
        errors.append(f"rl.group_size={r.group_size}: advantage {r.advantage!r} needs groups of 2+")
      if r.advantage not in ADVANTAGES:
        errors.append(f"rl.advantage={r.advantage!r}; known: {sorted(ADVANTAGES)}")
    else:
      _ppo(errors, cfg, shards)
    for name, table, value in (("rl.loss_aggregation", AGGREGATIONS, r.loss_aggregation),
                               ("rl.kl_estimator", KL_ESTIMATORS, r.kl_estimator)):
      if value not in table:
        errors.append(f"{name}={value!r}; known: {sorted(table)}")
    if r.old_logprobs not in ("sampler", "recompute"):
      errors.append(f"rl.old_logprobs={r.old_logprobs!r}; known: sampler, recompute")
    if not 0 <= r.clip_eps_low < 1 or r.clip_eps_high < 0:
      errors.append(f"rl.clip_eps_low={r.clip_eps_low}, rl.clip_eps_high={r.clip_eps_high}: "
                    f"need 0 <= low < 1 and high >= 0")
    if r.kl_coef < 0 or r.entropy_coef < 0:
      errors.append(f"rl.kl_coef={r.kl_coef}, rl.entropy_coef={r.entropy_coef} must be >= 0")
    if ro.temperature <= 0:
      errors.append(f"rollout.temperature={ro.temperature} must be > 0 for RL sampling")
    if not 0 < ro.top_p <= 1 or ro.top_k < 0:
      errors.append(f"rollout.top_p={ro.top_p} must be in (0, 1], rollout.top_k={ro.top_k} >= 0")
  else:
    errors.append(f"kind={cfg.kind!r}; known: sft, grpo, ppo")
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(errors))

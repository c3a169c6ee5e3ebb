"""The optimizer from the config: AdamW with warmup and decay, clipping, and a logged lr."""

from __future__ import annotations

from typing import Any, Mapping

import optax


def schedule(cfg: Mapping[str, Any], total_steps: int) -> optax.Schedule:
  """Linear warmup over `warmup_steps`, then constant or cosine decay to `final_lr_frac`."""
  lr, warmup = float(cfg["lr"]), int(cfg.get("warmup_steps", 0))
  kind = cfg.get("schedule", "constant")
  if kind == "constant":
    main = optax.constant_schedule(lr)
  elif kind == "cosine":
    main = optax.cosine_decay_schedule(lr, max(total_steps - warmup, 1),
                                       alpha=float(cfg.get("final_lr_frac", 0.0)))
  elif kind == "linear":
    main = optax.linear_schedule(lr, lr * float(cfg.get("final_lr_frac", 0.0)),
                                 max(total_steps - warmup, 1))
  else:
    raise ValueError(f"optim.schedule={kind!r}; known: constant, cosine, linear")
  if warmup <= 0:
    return main
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), main], [warmup])


def make(cfg: Mapping[str, Any], total_steps: int) -> optax.GradientTransformation:
  """Clip by global norm, then AdamW; hyperparameters are injected so that they can be logged."""
  adam = optax.inject_hyperparams(optax.adamw)(
      learning_rate=schedule(cfg, total_steps), b1=float(cfg.get("b1", 0.9)),
      b2=float(cfg.get("b2", 0.999)), eps=float(cfg.get("eps", 1e-8)),
      weight_decay=float(cfg.get("weight_decay", 0.0)))
  clip = cfg.get("grad_clip", 0.0)
  return optax.chain(optax.clip_by_global_norm(clip), adam) if clip else adam


def hyperparams(opt_state) -> dict[str, Any]:
  """The injected hyperparameters (learning rate, betas, eps) of a state made by `make`."""
  for s in (opt_state if isinstance(opt_state, tuple) else (opt_state,)):
    if hasattr(s, "hyperparams"):
      return dict(s.hyperparams)
  return {}

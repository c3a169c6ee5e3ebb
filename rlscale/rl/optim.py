"""The optimizer from the config: AdamW with batch-size scaling rules, a schedule counted in
responses, global-norm clipping, and hyperparameters that are logged.

Scaling rules, for a batch of B responses per optimizer step against the
`reference_batch` B0 at which `lr` was tuned, k = B / B0:
  none: lr;  linear: lr * k (Goyal et al. 2017);  sqrt: lr * sqrt(k) (Malladi et al. 2022).
With `adam_scaling`, beta -> 1 - k (1 - beta) for beta1 and beta2 (clipped to [0, 0.9999]) and
eps -> eps / sqrt(k). Warmup and decay are counted in responses, so runs with different batch
sizes follow the same schedule per sample.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax

RULES = ("none", "linear", "sqrt")
SCHEDULES = ("constant", "cosine", "linear")
STATE_DTYPES = ("", "float32")  # optim.state_dtype: '' keeps the parameters' dtype


@dataclasses.dataclass(frozen=True)
class Scaled:
  """The hyperparameters a batch of `batch` responses per optimizer step gets."""
  lr: float
  b1: float
  b2: float
  eps: float
  k: float  # batch / reference_batch


def scale(cfg: Mapping[str, Any], batch: float) -> Scaled:
  rule = cfg["lr_scaling"]
  if rule not in RULES:
    raise ValueError(f"optim.lr_scaling={rule!r}; known: {RULES}")
  ref = float(cfg["reference_batch"] or batch)
  k = batch / ref
  lr = float(cfg["lr"]) * {"none": 1.0, "linear": k, "sqrt": math.sqrt(k)}[rule]
  b1, b2, eps = float(cfg["b1"]), float(cfg["b2"]), float(cfg["eps"])
  if cfg["adam_scaling"]:
    clip = lambda b: min(max(1.0 - k * (1.0 - b), 0.0), 0.9999)
    b1, b2, eps = clip(b1), clip(b2), eps / math.sqrt(k)
  return Scaled(lr, b1, b2, eps, k)


def schedule(cfg: Mapping[str, Any], lr: float, total_responses: float,
             responses_per_step: float) -> optax.Schedule:
  """lr at optimizer step s, where step s has consumed s * responses_per_step responses.

  Linear warmup over `warmup_responses`, then constant, or cosine/linear decay to
  lr * final_lr_frac at `total_responses`.
  """
  kind = cfg["schedule"]
  if kind not in SCHEDULES:
    raise ValueError(f"optim.schedule={kind!r}; known: {', '.join(SCHEDULES)}")
  warm = float(cfg["warmup_responses"])
  final = lr * float(cfg["final_lr_frac"])
  span = max(total_responses - warm, 1.0)

  def fn(step):
    seen = step * responses_per_step
    frac = jnp.clip((seen - warm) / span, 0.0, 1.0)
    if kind == "constant":
      main = jnp.full_like(frac, lr)
    elif kind == "cosine":
      main = final + (lr - final) * 0.5 * (1 + jnp.cos(math.pi * frac))
    else:
      main = lr + (final - lr) * frac
    if warm > 0:
      return jnp.where(seen < warm, lr * seen / warm, main)
    return main

  return fn


def runtime(cfg: Mapping[str, Any], scaled: Scaled) -> dict[str, float]:
  """The optimizer's numbers that are arguments of the compiled update rather than constants of
  it, so that runs differing only in them share one program: the peak rate after the scaling
  rule, and the clip norm when clipping is on (0 removes the clip from the program)."""
  out = {"lr": scaled.lr}
  if cfg["grad_clip"]:
    out["grad_clip"] = float(cfg["grad_clip"])
  return out


def make(cfg: Mapping[str, Any], *, batch: float, total_responses: float,
         responses_per_step: float,
         values: Mapping[str, Any] | None = None) -> tuple[optax.GradientTransformation, Scaled]:
  """Clip by global norm, then AdamW with the scaled hyperparameters (injected, so logged).

  `batch`: responses per optimizer step; `responses_per_step`: responses consumed per optimizer
  step (batch / num_epochs); `total_responses`: the run's length, where decay ends. `values`:
  `runtime`'s numbers as the compiled update's arguments (traced); None: the config's, as
  constants. The state's tree is the same either way.
  """
  s = scale(cfg, batch)
  values = runtime(cfg, s) if values is None else values
  # float32 hyperparameters whatever the parameters' dtype: optax would keep them in it, and
  # b2 = 0.999 rounds to 1.0 in bfloat16, whose bias correction 1 - b2^t = 0 makes every
  # update NaN (float32 parameters: unchanged).
  adam = optax.inject_hyperparams(optax.adamw, hyperparam_dtype=jnp.float32)(
      learning_rate=schedule(cfg, values["lr"], total_responses, responses_per_step), b1=s.b1,
      b2=s.b2, eps=s.eps, weight_decay=float(cfg["weight_decay"]))
  opt = (optax.chain(optax.clip_by_global_norm(values["grad_clip"]), adam) if cfg["grad_clip"]
         else adam)
  state_dtype = cfg["state_dtype"]
  if state_dtype not in STATE_DTYPES:
    raise ValueError(f"optim.state_dtype={state_dtype!r}; known: '', 'float32'")
  return (in_dtype(opt, jnp.dtype(state_dtype)) if state_dtype else same_dtypes(opt)), s


def same_dtypes(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """`inner` whose state keeps the dtypes it was made in (optim.state_dtype=''): Adam's moments
  of bfloat16 parameters stay bfloat16. The float32 hyperparameters (see `make`) promote the
  moments' arithmetic to float32; the new moments are stored back in their own dtype, so the
  state is a fixed-type carry of the update's loop over optimizer steps."""

  def update(updates, state, params=None):
    out, new = inner.update(updates, state, params)
    return out, jax.tree.map(lambda n, o: n.astype(o.dtype), new, state)

  return optax.GradientTransformation(inner.init, update)


def in_dtype(inner: optax.GradientTransformation, dtype) -> optax.GradientTransformation:
  """`inner` computed in `dtype` whatever the parameters' dtype: gradients and parameters are
  cast to it, so Adam's moments live in it (float32 moments of bfloat16 parameters: a bf16
  second moment loses the small squared gradients); each update is cast back to its
  gradient's dtype before it is applied. The state is `inner`'s own, so `hyperparams` reads it.
  """
  cast = lambda tree: jax.tree.map(lambda x: x.astype(dtype), tree)

  def init(params):
    return inner.init(cast(params))

  def update(updates, state, params=None):
    out, state = inner.update(cast(updates), state, None if params is None else cast(params))
    return jax.tree.map(lambda u, g: u.astype(g.dtype), out, updates), state

  return optax.GradientTransformation(init, update)


def branched(fresh, parent):
  """A branch's optimizer state (init.branch_from): the parent's moments (Adam's mu, nu and
  the count its bias correction reads, so warm moments are not inflated), the branch's own
  injected hyperparameters and schedule clock (its learning rate by its rule at its batch, its
  warmup and decay over its own responses; the parent's would be read from the state)."""
  def pick(f, p):
    if hasattr(f, "hyperparams") and hasattr(f, "inner_state"):
      return f._replace(inner_state=p.inner_state)
    return p
  is_inject = lambda x: hasattr(x, "hyperparams") and hasattr(x, "inner_state")  # noqa: E731
  return jax.tree.map(pick, fresh, parent, is_leaf=is_inject)


def hyperparams(opt_state) -> dict[str, Any]:
  """The injected hyperparameters (learning rate, betas, eps) of a state made by `make`."""
  if hasattr(opt_state, "hyperparams"):
    return dict(opt_state.hyperparams)
  for s in opt_state if isinstance(opt_state, tuple) else ():
    if hasattr(s, "hyperparams"):
      return dict(s.hyperparams)
  return {}

"""One model being trained (the actor, or PPO's critic): state, update, and its instruments.

Everything a batch-size study records per model lives here once: the optimizer with its
scaling rule, the jitted update, and the host-side reading of its metrics (gradient norms,
noise scale in responses and in prompts, the hyperparameters in effect).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from rlscale.rl import optim
from rlscale.plan.batch import ModelBatch
from rlscale.rl import noise_scale, ptx
from rlscale.rl.update import TrainState, UpdateOptions, make_update


class Trained:
  """`batch` (from the batch plan) says how this model consumes a step's rows."""

  def __init__(self, name: str, forward, loss, params, optim_cfg: Mapping[str, Any], *,
               batch: ModelBatch, group_size: int, total_responses: int, aggregation: str,
               max_len: int, mesh, rules, noise_cfg: Mapping[str, Any], prox_com: float = 0.0,
               ptx_coef: float = 0.0, demos=None, count_rows: bool = False, lanes=None,
               lane_setup: list | None = None, compile_ahead: bool = False):
    """`count_rows`: the step's batch may hold rows without loss (dynamic sampling).
    `compile_ahead`: a packed update compiles every bucket at its first call. `lanes`:
    runs side by side (rlscale/parallel/lanes.py), `params` with the lane axis and
    `lane_setup` each lane's (loss, optimizer section): their numbers are the update's
    per-lane arguments, the first lane's sizes everyone's."""
    self.name, self.batch, self.group_size = name, batch, group_size
    self.lanes = lanes
    self.optim_cfg = optim_cfg
    self.lr_scale: float | None = None  # optim.lr_batch='effective': this step's (follow_batch)
    self.opt_batch = batch.minibatch  # responses per optimizer step
    sizes = dict(batch=self.opt_batch, total_responses=total_responses,
                 responses_per_step=self.opt_batch / batch.num_epochs)
    optimizer, self.scaled = optim.make(optim_cfg, **sizes)
    # The numbers the compiled update takes as arguments (one program for every learning
    # rate, clip and loss coefficient of a sweep): the optimizer's and the loss's.
    hyper_of = lambda lo, oc: {**optim.runtime(oc, optim.make(oc, **sizes)[1]),
                               **getattr(lo, "hyper", {})}
    self.hyper = hyper_of(loss, optim_cfg)
    if lanes is not None:  # each lane's, on its device
      self.hyper = lanes.stack([{k: np.float32(v) for k, v in hyper_of(lo, oc).items()}
                                for lo, oc in lane_setup])
    logging.info("%s: %d responses per optimizer step, k=%.3g of the reference batch: lr %.3g, "
                 "b1 %.4g, b2 %.4g, eps %.3g", name, self.opt_batch, self.scaled.k,
                 self.scaled.lr, self.scaled.b1, self.scaled.b2, self.scaled.eps)
    # Batch-size-invariant PPO: the proximal policy's EWMA has a centre of mass of prox_com
    # optimizer steps at the reference batch, k times more at a k times smaller batch.
    self.prox_decay = None
    if prox_com:
      com = prox_com / self.scaled.k
      self.prox_decay = com / (com + 1.0)
    self.measure_noise = bool(noise_cfg["enabled"]) and batch.num_micro >= 2
    # Shared-prompt training shuffles by whole groups at every step: prompts only.
    self.shared = batch.shared_prompt > 1
    self.prompt_level = self.measure_noise and (
        self.shared or (bool(noise_cfg["prompt_level"]) and batch.microbatch % group_size == 0))
    # B_simple's running averages, per lane (one for a run alone).
    self.noises = [{u: noise_scale.NoiseScale(f"{name}/noise_{u}", noise_cfg["decay"])
                    for u in ("responses", "prompts")} for _ in range(len(lanes or [0]))]
    self.noise = self.noises[0]
    options = UpdateOptions(
        microbatch=batch.microbatch, max_len=max_len, num_minibatches=batch.num_minibatches,
        num_epochs=batch.num_epochs, aggregation=aggregation, group_size=group_size,
        measure_noise=self.measure_noise, prox_decay=self.prox_decay,
        ptx=(ptx_coef, ptx.nll) if demos is not None else None, count_rows=count_rows,
        shared_prompt=batch.shared_prompt, pack=batch.pack, compile_ahead=compile_ahead)
    self.update = make_update(
        forward, lambda values: optim.make(optim_cfg, **sizes, values=values)[0], loss, options,
        mesh=mesh, rules=rules, lanes=lanes)
    self.demos, self.opt_steps_taken = demos, None  # PPO-ptx rows (rl/ptx.py), or None
    prox = jax.tree.map(jnp.copy, params) if self.prox_decay is not None else None
    if lanes is None:
      self.state = self.update.place(
          TrainState(params, jax.jit(optimizer.init)(params), jnp.zeros((), jnp.int32), prox))
    else:
      init = lambda p: TrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32), None)
      self.state = lanes.map(init, (True,), name="init")(params)._replace(prox=prox)

  @property
  def params(self):
    return self.state.params

  def follow_batch(self, effective_rows: int) -> None:
    """This step's effective batch: with optim.lr_batch='effective' the scaling rule's lr
    follows effective_rows / num_minibatches responses per optimizer step instead of the
    nominal batch (the update is scaled by the rule's ratio of the two; Adam's moment
    adjustment stays at the nominal batch)."""
    if self.optim_cfg["lr_batch"] == "effective":
      b = max(effective_rows / self.batch.num_minibatches, 1e-9)
      self.lr_scale = optim.scale(self.optim_cfg, b).lr / self.scaled.lr

  def step(self, batch, key, by_group: bool):
    """Dispatch one update; returns the device metrics."""
    demos = None
    if self.demos is not None:
      if self.opt_steps_taken is None:  # once per process life: after a restore, its count
        self.opt_steps_taken = ptx.steps_taken(self.state)
      n = self.batch.num_minibatches * self.batch.num_epochs
      demos = self.demos.batch(self.opt_steps_taken, n)
      self.opt_steps_taken += n
    self.state, metrics = self.update(self.state, batch, key, by_group and self.prompt_level,
                                      demos, self.lr_scale, self.hyper)
    if self.lr_scale is not None:
      metrics = {**metrics, "lr_scale": self.lr_scale}
    if self.update.packer is not None:  # the packed rows per shard over the unpacked ones
      rows = self.update.packer.rows
      metrics = {**metrics, "packed_rows_frac": (self.update.packed_rows or rows) / rows}
    return metrics

  def hyperparams(self) -> dict[str, Any]:
    """The optimizer's injected hyperparameters in effect, on the host ([lanes] each for runs
    side by side: one fetch for all of them)."""
    return {k: np.asarray(v) for k, v in jax.device_get(
        optim.hyperparams(self.state.opt_state)).items()}

  def read(self, metrics: Mapping[str, Any], by_group: bool, lane: int = 0,
           hyperparams: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Host metrics under `<name>/`: the update's, the noise scale, the hyperparameters (for
    runs side by side: of `lane`, whose values of `hyperparams()` the caller passes)."""
    noise = self.noises[lane]
    out = {f"{self.name}/{k}": v for k, v in metrics.items() if not k.startswith("noise/")}
    for k in ("rows_big", "micro_used_min"):  # dynamic sampling: the rows measured on
      if f"noise/{k}" in metrics:
        out[f"{self.name}/noise_{k}"] = metrics[f"noise/{k}"]
    if "noise/grad_sq_small" in metrics:
      unit, per = (("prompts", self.group_size) if (by_group or self.shared) and self.prompt_level
                   else ("responses", 1))
      small, big = self.batch.microbatch, self.opt_batch
      measured = metrics.get("noise/micro_used_min", 2) >= 2
      if measured and metrics.get("noise/rows_big", big) < big:
        # Rows without loss (dynamic sampling's holes): the sizes the gradients were taken on.
        small, big = 1.0 / metrics["noise/inv_rows_small"], metrics["noise/rows_big"]
      if measured and small < big:
        raw = {"grad_sq_small": metrics["noise/grad_sq_small"], "b_small": small / per,
               "grad_sq_big": metrics["noise/grad_sq_big"], "b_big": big / per}
        g2, trace = noise_scale.estimates(raw["grad_sq_small"], raw["grad_sq_big"],
                                          raw["b_small"], raw["b_big"])
        out.update(noise[unit].update(g2, trace))
        # The measured squared norms and the sizes they were taken at: the estimates are
        # differences of the norms, so these say how much a norm's last bits can move them.
        out.update({f"{noise[unit].prefix}/{k}": float(v) for k, v in raw.items()})
      else:  # fewer than two micro-batches held loss: no estimate this step
        out.update(noise[unit].current())
      other = "responses" if unit == "prompts" else "prompts"
      out.update(noise[other].current())  # every step carries both B_simple values
    if hyperparams is None:
      hyperparams = optim.hyperparams(self.state.opt_state)
    for name, value in hyperparams.items():
      out[f"{self.name}/{'lr' if name == 'learning_rate' else name}"] = float(value)
    if self.prox_decay is not None:
      out[f"{self.name}/prox_decay"] = self.prox_decay
    return out

  def noise_state(self, lane: int = 0) -> dict[str, Any]:
    return {u: n.state() for u, n in self.noises[lane].items()}

  def load_noise_state(self, state: Mapping[str, Any], lane: int = 0) -> None:
    for u, s in state.items():
      self.noises[lane][u].load(s)

"""The loop every trainer shares (SFT and RL): steps, evaluation, checkpoints, metrics.

A trainer says what one step is; the loop does the rest once: resume from the latest
checkpoint in the workdir, evaluate at step or sample-axis marks, save, fetch a step's device
metrics only after the next step was dispatched, stop on a non-finite metric
before it reaches a checkpoint, track the target, and keep per-phase times that add up to
the step. An interrupted run (an exception, Ctrl-C, SIGTERM) still completes the saves it
began.

What a trainer provides is the `Trainer` protocol below; the RL and SFT trainers satisfy it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from rlscale.trainer import preemption
from rlscale.checkpoints import storage
from rlscale.checkpoints.checkpointer import (Checkpointer, CheckpointMismatch, StorageError,
                                              describe_layout)
from rlscale.config.errors import ConfigError
from rlscale.metrics.writer import MetricsWriter, Progress
from rlscale.resolve import experiment


class NonFiniteError(FloatingPointError):
  pass


@dataclasses.dataclass
class Pending:
  """A step whose update was dispatched and whose metrics are not yet on the host.

  Step N lasts from the end of step N-1's bookkeeping (`t_start`) to the end of its own; its
  phases lie inside that span and `time/other` is the remainder. `update_phase` is the time
  from `t_update` until the metrics arrive, less the `update_phases` measured inside it.
  """
  step: int
  device: Any  # metrics still on the device: {group: {name: scalar}}
  host: dict[str, Any]  # metrics known on the host already
  phases: dict[str, float]
  t_start: float
  t_update: float
  update_phase: str = "update"
  update_phases: dict[str, float] = dataclasses.field(default_factory=dict)
  info: Any = None  # the trainer's own


@runtime_checkable
class Trainer(Protocol):
  """What one step is, for the loop: the RL trainer (trainer/rl_trainer.py) and the SFT trainer
  (trainer/sft_trainer.py) implement it."""
  sample_key: str  # the counter that is the sample axis, e.g. responses_seen
  samples_per_step: int
  counters: dict[str, Any]  # sample-axis counts the trainer keeps (checkpointed)

  def state(self) -> Any:
    """The checkpointed arrays."""

  def load(self, state: Any, meta: dict[str, Any]) -> None:
    """Restore `state()` and `meta()` of a checkpoint."""

  def meta(self) -> dict[str, Any]:
    """Host state (JSON) saved beside the arrays."""

  def fill_counters(self, missing: list[str]) -> None:
    """Set the `counters` a checkpoint of an older version lacks (named in `missing`)."""

  def begin(self, step: int) -> Any:
    """Dispatch what needs no host sync (e.g. the decode)."""

  def complete(self, step: int, begun: Any, t_start: float) -> "Pending":
    """The rest of the step, its update dispatched."""

  def metrics(self, pending: "Pending", fetched: dict[str, Any]) -> dict[str, Any]:
    """Host metrics of a finished step from its fetched device metrics."""

  def rates(self, pending: "Pending", wall: float) -> dict[str, float]:
    """Throughput of a finished step that lasted `wall` seconds."""

  def evaluate(self, step: int, stop=None) -> dict[str, float]:
    """The held-out evaluation at `step`; `stop` (trainer/evaluation.Stop): in stages."""

  def progress(self, row: dict[str, Any], last_eval: dict[str, float]) -> dict[str, Any]:
    """The few numbers of the console's progress line."""

  def finish(self, counters: dict[str, Any], last_eval: dict[str, float]) -> dict[str, Any]:
    """Write the run's outputs (policy, summary.json); the summary."""


def _non_finite(fetched: dict[str, Any]) -> list[str]:
  return [f"{group}/{k}={v}" for group, m in fetched.items() for k, v in m.items()
          if not np.isfinite(v)]


@jax.jit
def _finite_leaves(state):
  return jax.tree.map(lambda x: jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact)
                      else jnp.bool_(True), state)


def non_finite_leaves(state) -> list[str]:
  """Paths of the state's arrays that hold a NaN or an Inf (one boolean per array fetched).
  A dict's entries are checked one by one: they may lie on different meshes (split roles: the
  models on the trainer's devices, the decodes in flight on the sampler's)."""
  parts = state.items() if isinstance(state, dict) else [(None, state)]
  out = []
  for key, part in parts:
    flags = jax.device_get(_finite_leaves(part))
    prefix = "" if key is None else f"[{key!r}]"
    out += [prefix + jax.tree_util.keystr(path)
            for path, ok in jax.tree_util.tree_flatten_with_path(flags)[0] if not ok]
  return out


class Loop:
  def __init__(self, trainer: Trainer, cfg, workdir: str, num_steps: int, eval_at_start: bool,
               *, written: ml_collections.ConfigDict):
    """`cfg`: the run's typed config (Resolved.cfg; a ConfigDict reads the same); `written`:
    the config as config.json records it (Resolved.raw)."""
    self.trainer, self.cfg, self.workdir = trainer, cfg, workdir
    self.written = written
    self.steps, self.eval_at_start = num_steps, eval_at_start
    t = cfg.train
    self.ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), t.keep_checkpoints,
                             t.async_checkpoint, keep_period=t.keep_period)
    self.target = cfg.target if "target" in cfg else None  # SFT has none
    self.counters: dict[str, Any] = {"step": 0, "wall_time": 0.0, "seed": cfg.seed}
    self.last_eval: dict[str, float] = {}
    self.metrics_rows: str | None = None
    self.steps_run = 0
    self.save_seconds: float | None = None  # reported as time/checkpoint of the next step
    # step -> the sample axis before and after it, for steps whose samples vary (dynamic
    # sampling generates more than P x G when it refills); evaluation marks fall between.
    self.seen: dict[int, tuple[int, int]] = {}
    self.eval_seen = 0  # the sample axis at the last evaluation (target.stop_margin)
    self.writer: MetricsWriter | None = None

  # --- schedule ---

  def _due(self, every: int, step: int) -> bool:
    return step == self.steps or bool(every and step % every == 0)

  def eval_due(self, step: int) -> bool:
    e = self.cfg.train.eval_every_responses
    if e:  # at fixed sample marks, the x every batch size shares
      n = self.trainer.samples_per_step
      before, after = self.seen.get(step, ((step - 1) * n, step * n))
      return step == self.steps or before // e < after // e
    return self._due(self.cfg.train.eval_every, step)

  def eval_stop(self, step: int):
    """How the evaluation at `step` scores the held-out set: None, the whole set (without
    eval.adaptive); in stages until the target metric's side of the target is settled,
    before the run reached its target; the first stage alone after it (the study reads the
    first crossing: no later evaluation moves it)."""
    e = self.cfg.eval
    if not self.target or not e.adaptive:
      return None
    from rlscale.trainer.evaluation import Stop
    return Stop(self.target.metric, float(self.target.value), float(e.adaptive_z),
                first_only="responses_to_target" in self.counters)

  def _evaluate(self, step: int) -> dict[str, float]:
    stop = self.eval_stop(step)
    return self.trainer.evaluate(step) if stop is None else self.trainer.evaluate(step, stop)

  def checkpoint_due(self, step: int) -> bool:
    return self._due(self.cfg.train.checkpoint_every, step) or self.stopped()

  def stopped(self) -> bool:
    """target.stop: the run ends at its first evaluation at or past (1 + target.stop_margin)
    x its responses to target (at the crossing itself with no margin), after a checkpoint."""
    t, c = self.target, self.counters
    if not (t and t.stop and "responses_to_target" in c):
      return False
    margin = float(t.stop_margin)
    return not margin or self.eval_seen >= (1.0 + margin) * c["responses_to_target"]

  # --- the run ---

  def restore(self, at_most: int | None = None) -> int:
    """Resume from the newest intact checkpoint (no later than `at_most`); the step, 0 for a
    new run."""
    try:  # skips damaged steps
      step, state, meta = self.ckpt.restore_latest(self.trainer.state(), at_most)
    except CheckpointMismatch as e:  # a user's change (--allow_config_change), in one line
      if "in_flight" in str(e):  # the decodes in flight a stale run's checkpoint keeps
        k = self.cfg.rollout.max_staleness if "rollout" in self.cfg else 0
        raise ConfigError(
            f"{e}: the checkpoint keeps another number of decodes in flight than "
            f"rollout.max_staleness={k} does (one saved at another k, or before a stale run's "
            f"checkpoint kept its decodes); resume with the max_staleness it was saved with "
            f"(0 for a checkpoint without decodes in flight), or give another --workdir") from e
      raise ConfigError(f"{e}: this config's model or optimizer state differs from the one "
                        f"the checkpoints were saved with; resume with that config, or give "
                        f"another --workdir") from e
    start = step or 0
    branch = self.cfg.init.branch_from if "init" in self.cfg else ""
    if not start and branch:
      self._branch(branch, self.cfg.init.branch_step)
    # A restore again at an earlier step (runs side by side aligning their lanes) forgets
    # what the first one read: its crossing, its last evaluation.
    self.counters = {"step": 0, "wall_time": 0.0, "seed": self.cfg.seed}
    self.last_eval, self.metrics_rows, self.eval_seen = {}, None, 0
    if start:
      self.trainer.load(state, meta.pop("trainer", {}))
      self.last_eval = meta.pop("last_eval", {})  # a finished run's summary keeps its evaluation
      self.eval_seen = meta.pop("eval_seen", 0)  # older checkpoints: the next evaluation's
      self.metrics_rows = meta.pop("metrics", None)  # metrics.jsonl up to this step
      missing = [k for k in self.trainer.counters if k not in meta]
      for k in self.trainer.counters:
        if k in meta:
          self.trainer.counters[k] = meta.pop(k)
      if missing:  # a checkpoint of an older version
        self.trainer.fill_counters(missing)
      self.counters.update(meta)
      if self.ckpt.layout_change:  # a requeue on other devices or hosts: kept in summary.json
        saved, now = self.ckpt.layout_change
        self.counters["layout_changes"] = [*self.counters.get("layout_changes", []), {
            "step": start, "saved_on": describe_layout(saved), "resumed_on": describe_layout(now)}]
      logging.info("resumed from the checkpoint of step %d in %s", start, self.workdir)
    return start

  def _branch(self, parent: str, step: int) -> None:
    """A new branch (init.branch_from): the trainer's arrays from the parent's checkpoint of
    `step`; this run's counters start from zero."""
    ckpt = Checkpointer(os.path.join(parent, "checkpoints"), keep=None, async_save=False,
                        create=False)
    try:
      state, meta = ckpt.restore(step, self.trainer.state())
    except CheckpointMismatch as e:
      if "in_flight" in str(e):  # a stale parent's (or branch's) decodes in flight
        raise ConfigError(
            f"init.branch_from={parent!r}: {e}: the run it branches from and this branch keep "
            "decodes in flight of other numbers or shapes (rollout.max_staleness, the batch); "
            "a branch restores them only to drop them, so it needs the parent's "
            "max_staleness and batch, or a parent saved at max_staleness=0") from e
      raise ConfigError(f"init.branch_from={parent!r}: {e}: the branch's model or optimizer "
                        "differs from the run it branches from") from e
    finally:
      ckpt.close()
    self.trainer.branch(state, meta.get("trainer", {}), parent, step)
    logging.info("branched from the checkpoint of step %d of %s", step, parent)

  def run(self) -> tuple[dict[str, Any], dict[str, float]]:
    """Run to the last step; returns (counters, last evaluation)."""
    preemption.loop_started()
    start = self.restore()
    try:
      self.open(start)
      pending = None
      for step in range(start + 1, self.steps + 1):
        if self.stopped():
          break
        if preemption.requested():
          self._save_for_preemption(pending)
        pending = self.step(step, pending)
      self.flush(pending)
    except OSError as e:  # the disk refused a log write (its save in flight may have filled it)
      problem = storage.problem(e)
      if problem is None:
        raise
      self.ckpt.wait()  # a save in flight that the disk refused is the one to report
      raise StorageError(f"{e.filename or self.workdir}: {problem} while writing the "
                         f"run's logs. {self._intact()} Make room and run the same command "
                         f"again") from None
    finally:
      self.close()
    return self.result()

  def open(self, start: int) -> None:
    """After the restore of `start`: the run directory's config and metrics, and the starting
    policy's evaluation of a new run."""
    # Only once the checkpoint restored into this config's arrays: a resume that fails (a
    # model of another shape allowed by --allow_config_change) leaves config.json and the
    # config history as they were, and the original command still resumes.
    experiment.prepare_workdir(self.workdir, self.written)
    self.writer = MetricsWriter(self.workdir, resume_step=start or None,  # None: a new file
                                tensorboard=self.cfg.train.tensorboard,
                                restore=self.metrics_rows)
    self.progress = Progress(self.steps, self.cfg.train.log_every, start)
    self.t_run = time.time() - self.counters["wall_time"]
    if start == 0 and self.eval_at_start:
      self._evaluate_start()
    self.t_prev_end = time.time()

  def step(self, step: int, pending: Pending | None) -> Pending | None:
    """Run `step`: its decode dispatched, the previous step finished, its update dispatched
    (and finished now when it evaluates or saves); the step still pending, or None."""
    begun = self.trainer.begin(step)
    if pending is not None:  # step N's metrics, fetched while step N+1 is dispatched
      self.finish(pending)
    before = self.trainer.counters[self.trainer.sample_key]
    pending = self.trainer.complete(step, begun, self.t_prev_end)
    self.seen = {step: (before, self.trainer.counters[self.trainer.sample_key])}
    self.steps_run += 1
    if self.eval_due(step) or self.checkpoint_due(step):
      self.finish(pending)  # evaluation and checkpoints need this step's parameters now
      return None
    return pending

  def flush(self, pending: Pending | None) -> None:
    if pending is not None:
      self.finish(pending)

  def close(self) -> None:
    try:
      self.ckpt.close()
    finally:
      if getattr(self, "writer", None) is not None:
        self.writer.close()

  def result(self) -> tuple[dict[str, Any], dict[str, float]]:
    return {**self.counters, **self.trainer.counters}, self.last_eval

  def _evaluate_start(self) -> None:
    """The starting policy's evaluation: the point every curve starts from (step 0)."""
    t = time.time()
    self.last_eval = self._evaluate(0)
    self.writer.write(0, {**self.last_eval, **self.trainer.counters, "wall_time": 0.0,
                          "time/eval": time.time() - t})
    logging.info("starting policy: %s", {k: round(float(v), 4) for k, v in self.last_eval.items()})
    self.t_run = time.time()
    self._check_target()  # a policy that starts on target reaches it at 0 responses

  def finish(self, p: Pending) -> None:
    """Fetch a step's metrics, check them, evaluate and save when due, write its row."""
    fetched = self.trainer.fetch(p) if hasattr(self.trainer, "fetch") else jax.device_get(p.device)
    now = time.time()
    p.phases[p.update_phase] = now - p.t_update - sum(p.update_phases.values())
    p.phases.update(p.update_phases)
    bad = _non_finite(fetched)
    if bad:
      raise NonFiniteError(f"step {p.step}: non-finite {', '.join(bad)}; stopping. {self._intact()}")
    self.counters.update(step=p.step, wall_time=now - self.t_run)
    out = self.trainer.metrics(p, fetched)
    if self.eval_due(p.step):
      t = time.time()
      self.last_eval = self._evaluate(p.step)
      self.eval_seen = self.trainer.counters[self.trainer.sample_key]
      p.phases["eval"] = time.time() - t
      out.update(self.last_eval)
      self.counters["wall_time"] = time.time() - self.t_run
      self._check_target()
    if self.save_seconds is not None:  # the previous step's checkpoint, saved within this step
      p.phases["checkpoint"], self.save_seconds = self.save_seconds, None
    self.t_prev_end = time.time()
    self.counters["wall_time"] = self.t_prev_end - self.t_run
    wall = self.t_prev_end - p.t_start
    out.update({f"time/{k}": v for k, v in p.phases.items()})
    out["time/other"] = wall - sum(p.phases.values())
    out["time/step"] = wall
    out.update(self.trainer.rates(p, wall))
    out.update(self.trainer.counters, wall_time=self.counters["wall_time"])
    self.writer.write(p.step, out)
    self.progress.update(p.step, self.trainer.progress(out, self.last_eval))
    if self.checkpoint_due(p.step):  # after the row: the checkpoint carries the rows up to it
      t = time.time()
      self.save(p.step)
      self.save_seconds = time.time() - t
    preemption.step_finished()  # a signal now waits for the step in flight to be saved

  def save(self, step: int) -> None:
    """Checkpoint the state after `step`, only if every array of it is finite."""
    bad = non_finite_leaves(self.trainer.state())
    if bad:
      raise NonFiniteError(f"step {step}: the state to save holds NaN or Inf in {len(bad)} "
                           f"arrays ({', '.join(bad[:5])}); stopping. {self._intact()}")
    meta = {**self.counters, **self.trainer.counters, "trainer": self.trainer.meta(),
            "eval_seen": self.eval_seen,
            "last_eval": {k: float(v) for k, v in self.last_eval.items()}}
    # The metrics rows are written once the step's row is; a checkpoint carries them all.
    self.ckpt.save(step, self.trainer.state(), meta | {"metrics": self.writer.packed()})

  def _intact(self) -> str:
    last = self.ckpt.latest_step()
    if last is None:
      return f"No checkpoint was saved yet in {self.workdir}."
    return f"The last checkpoint (step {last}) in {self.workdir} is intact."

  def _save_for_preemption(self, pending: Pending | None) -> None:
    """Finish the step in flight, save it, and stop with preemption.Preempted."""
    raise preemption.Preempted(self.save_in_flight(pending))

  def save_in_flight(self, pending: Pending | None, why: str = "preempted") -> int:
    """Finish the step in flight and save it (preemption, or runs side by side re-forming
    their group); its step."""
    if pending is not None:
      self.finish(pending)  # saves it when due
    step = self.counters["step"]
    if step and self.ckpt.latest_step() != step:
      self.save(step)
    logging.warning("%s: saved step %d in %s", why, step, self.workdir)
    return step

  def _check_target(self) -> None:
    tgt, c = self.target, self.counters
    if not tgt or tgt.metric not in self.last_eval or "responses_to_target" in c:
      return
    if float(self.last_eval[tgt.metric]) >= tgt.value:
      seen = self.trainer.counters[self.trainer.sample_key]
      c.update(responses_to_target=seen, time_to_target=c["wall_time"], step_to_target=c["step"])
      logging.info("target %s >= %s reached at %d %s, %.1f s", tgt.metric, tgt.value, seen,
                   self.trainer.sample_key, c["wall_time"])

"""The algorithm contract: what the RL loop asks of GRPO, PPO or any other algorithm.

The loop samples responses, scores them and builds the step's `SequenceBatch` on the mesh; an
algorithm turns that into updates of its trained models. It never learns which algorithm it
runs. An algorithm is one file that registers a class under the name a config's `kind` uses:

    @ALGORITHMS.register("my_algo")
    class MyAlgo:
      @staticmethod
      def check(cfg) -> list[str]: ...          # its own config errors, before any compute
      def __init__(self, ctx: Context): ...      # builds its Trained models
      models: dict[str, Trained]                 # "actor" is the policy being sampled
      def prepare(self, batch, sample_logp, scores) -> (phase seconds, metrics)
      def update(self, batch, key, step, by_group) -> (phase seconds, {model: device metrics})
      group_relative: bool                       # advantages relative to the group (optional)
      def extra_forwards(self) -> int            # forward passes over the batch besides updates

`scores` are the verifier's rewards of the step's responses, already on the mesh (sharded
over the batch axes like every row of `batch`); metrics may stay on the device until the
loop fetches them with the step's. An algorithm that runs side by side (rlscale/trainer/
lanes.py) builds its compiled functions with `Context.jit`, derives keys with
`Context.fold_in` and gives `trained_model` its `per_run` loss and optimizer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import jax
import ml_collections
import numpy as np
from flax import nnx

from rlscale.plan.batch import BatchPlan
from rlscale.rl import packing
from rlscale.rl.registry import Registry

ALGORITHMS = Registry("algorithm")


@dataclasses.dataclass
class Context:
  """What an algorithm is built from.

  Runs side by side (`lanes`, rlscale/parallel/lanes.py): `cfg` is the first lane's config,
  `lane_cfgs` every lane's (they differ only in numbers the programs take as arguments, and
  the seed), `params` carries the lane axis; an algorithm builds per-lane values with
  `configs()` and `stack`, and its own compiled functions with `jit`.
  """
  cfg: ml_collections.ConfigDict
  plan: BatchPlan
  env: Any  # experiment.Setup: mesh, rules, task, model config
  graphdef: nnx.GraphDef  # the policy's
  params: nnx.State  # the policy's, as loaded from the base
  base: str  # the base policy's Hugging Face folder (a critic may start from it)
  lanes: Any = None
  lane_cfgs: tuple = ()
  _fold: Any = dataclasses.field(default=None, repr=False)

  def configs(self) -> list:
    """Each run's config: one, or one per lane."""
    return list(self.lane_cfgs) if self.lanes is not None else [self.cfg]

  def stack(self, trees: list) -> Any:
    """Per-run values (one per `configs()`) as the algorithm holds them."""
    return trees[0] if self.lanes is None else self.lanes.stack(trees)

  def jit(self, fn, lane_args: tuple[bool, ...]):
    """`fn` compiled: jax.jit, or mapped over the lanes (argument i per lane when
    lane_args[i], else shared)."""
    return jax.jit(fn) if self.lanes is None else self.lanes.map(fn, lane_args)

  def fold_in(self, key, data: int):
    """jax.random.fold_in of the run's key, or of each lane's (an algorithm's keys derive from
    the one its update is given with this)."""
    if self.lanes is None:
      return jax.random.fold_in(key, data)
    if self._fold is None:
      self._fold = self.lanes.map(jax.random.fold_in, (True, False), name="fold_in")
    return self._fold(key, np.uint32(data))


class Algorithm(Protocol):
  models: dict[str, Any]

  def prepare(self, batch, sample_logp: jax.Array,
              scores: jax.Array) -> tuple[dict[str, float], dict[str, Any]]: ...

  def update(self, batch, key: jax.Array, step: int,
             by_group: bool) -> tuple[dict[str, float], dict[str, Any]]: ...

  def extra_forwards(self) -> int: ...


def check(cfg: ml_collections.ConfigDict) -> list[str]:
  """The config errors of `cfg.kind`'s algorithm (an unknown kind is one)."""
  register_all()
  if cfg.kind not in ALGORITHMS:
    return [f"kind={cfg.kind!r}; known: sft, {', '.join(sorted(ALGORITHMS))}"]
  errors = ALGORITHMS[cfg.kind].check(cfg)
  ro = cfg.rollout
  if ro.dynamic_sampling is True and not getattr(ALGORITHMS[cfg.kind], "group_relative", False):
    errors.append(f"rollout.dynamic_sampling=True with kind={cfg.kind!r}: filtering groups of "
                  f"equal rewards has meaning only for a group-relative advantage (kind='grpo': "
                  f"grpo, dr_grpo, rloo); {cfg.kind} learns from every response through its critic")
  elif ro.dynamic_sampling is True and isinstance(cfg.rl.group_size, int) and cfg.rl.group_size < 2:
    errors.append(f"rollout.dynamic_sampling=True with rl.group_size={cfg.rl.group_size}: a group "
                  f"of one response always has equal rewards; use groups of 2 or more")
  return errors


def build(ctx: Context) -> Algorithm:
  register_all()
  return ALGORITHMS.get(ctx.cfg.kind)(ctx)


def register_all() -> None:
  """Import every module of rlscale.rl, so that each algorithm file registers itself."""
  import importlib
  import pkgutil
  import rlscale.rl
  for module in pkgutil.iter_modules(rlscale.rl.__path__):
    importlib.import_module(f"rlscale.rl.{module.name}")


def batch_group(ctx: Context) -> int:
  """G when a forward over the whole step's batch (old or reference log-probs, the critic's
  values) can run each group's prompt once: shared-prompt training is on and every batch shard
  holds whole groups of the step; else 1."""
  plan = ctx.plan
  g = plan.main.shared_prompt
  return g if g > 1 and (plan.responses // plan.shards) % g == 0 else 1


def trained_model(ctx: Context, name: str, forward, loss, params, optim_cfg,
                  prox_com: float = 0.0, *, per_run=None):
  """A `Trained` model sized by the plan's batch for `name` ("actor", "critic"), with `loss`
  and the optimizer section `optim_cfg` of ctx.cfg. For runs side by side, `per_run(cfg)`
  gives (loss, optimizer section) from each lane's config, whose numbers become the lanes'
  arguments; without it, lanes that differ in more than their seed are refused."""
  from rlscale.rl.trained import Trained
  cfg = ctx.cfg
  coef = float(cfg.rl.ptx_coef) if name == "actor" else 0.0
  setup = None
  if ctx.lanes is not None:
    if per_run is None:
      seedless = [{**c.to_dict(), "seed": 0} for c in ctx.configs()]
      if any(d != seedless[0] for d in seedless):
        raise ValueError(f"kind={cfg.kind!r}: its {name} does not say how its loss and "
                         f"optimizer follow each run's config (trained_model's per_run); runs "
                         f"side by side of it must differ in their seed only")
      setup = [(loss, optim_cfg)] * len(ctx.lanes)
    else:
      setup = [per_run(c) for c in ctx.configs()]
  return Trained(name, forward, loss, params, optim_cfg, batch=ctx.plan.models[name],
                 group_size=ctx.plan.group_size, total_responses=ctx.plan.total_responses,
                 aggregation=cfg.rl.loss_aggregation, max_len=cfg.rollout.max_new_tokens,
                 mesh=ctx.env.mesh, rules=ctx.env.rules, noise_cfg=cfg.noise, prox_com=prox_com,
                 ptx_coef=coef, demos=demonstrations(ctx) if coef else None,
                 count_rows=bool(cfg.rollout.dynamic_sampling), lanes=ctx.lanes,
                 lane_setup=setup, compile_ahead=packing.compile_ahead(
                     cfg.train.compile_buckets, ctx.plan.num_steps))


def demonstrations(ctx: Context):
  """PPO-ptx's demonstration stream (rl/ptx.py): task.demo_files' rows, else the task's own."""
  import math
  from rlscale.config.errors import ConfigError
  from rlscale.rl import ptx
  cfg, env = ctx.cfg, ctx.env
  errors = ptx.check(cfg.rl, math.lcm(ctx.plan.shards, ctx.plan.processes))
  if errors:
    raise ConfigError("; ".join(errors))
  source = None
  if cfg.task.demo_files:
    from rlscale.tasks.files import demonstration_pairs
    source = demonstration_pairs(cfg.task, env.task)
  return ptx.Demonstrations(env.task, int(cfg.rl.ptx_rows), int(cfg.rollout.max_new_tokens),
                            env.mesh, env.rules, source)


def registry_errors(field: str, value: str, registry: Registry) -> list[str]:
  """[] when `value` names an entry of `registry`, else the error naming the field."""
  known = isinstance(value, str) and value in registry
  return [] if known else [f"{field}={value!r}; known: {sorted(registry)}"]


def policy_loss_errors(rl) -> list[str]:
  """The names of the registered parts of the policy loss every algorithm shares: its
  aggregation and KL estimator (the section's values are the schema's to check:
  rlscale/config/schema.Rl)."""
  from rlscale.rl.losses import AGGREGATIONS, KL_ESTIMATORS
  return (registry_errors("rl.loss_aggregation", rl.loss_aggregation, AGGREGATIONS)
          + registry_errors("rl.kl_estimator", rl.kl_estimator, KL_ESTIMATORS))
"""Build a model's parameters directly sharded: eval_shape -> shardings -> jit(init)."""

from __future__ import annotations

from typing import Callable

import jax
from flax import nnx
from jax.sharding import Mesh

from rlscale.parallel import sharding
from rlscale.models.config import ModelConfig


def abstract_model(model_cls: Callable[..., nnx.Module], cfg: ModelConfig):
  """(graphdef, abstract state) without allocating anything."""
  return nnx.split(nnx.eval_shape(lambda: model_cls(cfg, rngs=nnx.Rngs(params=0))))


def create_sharded(model_cls: Callable[..., nnx.Module], cfg: ModelConfig, mesh: Mesh,
                   rules: sharding.Rules, key: jax.Array) -> nnx.Module:
  """A freshly initialized model whose every parameter is created on its shards."""
  graphdef, abs_state = abstract_model(model_cls, cfg)
  shardings = sharding.state_shardings(abs_state, mesh, rules)

  @jax.jit
  def init(key):
    state = nnx.state(model_cls(cfg, rngs=nnx.Rngs(params=key)))
    return jax.lax.with_sharding_constraint(state, shardings)

  return nnx.merge(graphdef, init(key))

"""Config sections that every experiment file shares (model, mesh, task, optimizer, run), as
the ConfigDicts a config file's get_config builds.

Each is built from the schema (rlscale/config/schema.py), which holds every field's type,
default and doc: the one table. Experiment files in configs/ build their ConfigDict from these
and set what differs.
"""

from __future__ import annotations

import dataclasses
import types
import typing

import ml_collections
from ml_collections.config_dict import FieldReference, placeholder

from rlscale.config import schema


def auto_or_int() -> FieldReference:
  """A size field that is 'auto' (the batch plan chooses, rlscale/plan/batch.py) or an integer."""
  return FieldReference("auto", field_type=object)


def _kinds(hint) -> set:
  """The Python types a value of type `hint` may have."""
  args = typing.get_args(hint)
  if typing.get_origin(hint) is typing.Literal:
    return {type(a) for a in args}
  if typing.get_origin(hint) in (typing.Union, types.UnionType):
    return set().union(*map(_kinds, args))
  return {hint}


def _field(hint, value):
  """A field's ConfigDict value: None as a placeholder of the field's type (so that
  --config.x=3 parses), the 'auto' of an 'auto'-or-number field as an untyped reference."""
  kinds = _kinds(hint) - {type(None)}
  if value is None and kinds:
    return placeholder(next(iter(kinds)))
  if isinstance(value, str) and value == "auto" and kinds - {str}:
    return auto_or_int()
  return value


def section(*classes, **values) -> ml_collections.ConfigDict:
  """The section of the schema (rlscale/config/schema.py) of type `classes[0]` as a
  ConfigDict, every field at its default but those `values` set; with several classes, the
  fields of them all (a field's first class gives its default). A section field (the critic's
  optimizer) is built the same way from its default."""
  c = ml_collections.ConfigDict()
  for cls in classes:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
      if f.name in c:
        continue
      if dataclasses.is_dataclass(hints[f.name]):
        c[f.name] = section(hints[f.name], **values.pop(f.name, schema.default(cls, f.name)))
      else:
        c[f.name] = _field(hints[f.name], values.pop(f.name, schema.default(cls, f.name)))
  if values:
    raise ValueError(f"{classes[0].__name__} has no field {', '.join(values)}")
  return c


def model(name: str = "tiny", **overrides) -> ml_collections.ConfigDict:
  """The policy's architecture; `overrides` replace the named size's values (None keeps it)."""
  return section(schema.Model, name=name, **overrides)


def arithmetic_default(c: ml_collections.ConfigDict) -> None:
  """The embedded default every shipped config shares: model shape, mesh and task.

  configs/sft.py builds the base policy with them, and the RL configs rebuild (or reuse) that
  base from the same sections, so a change here is a new base policy for all of them.
  """
  # The tiny shape at half width (0.8M parameters): trains in minutes on two CPU cores.
  c.model = model("tiny", vocab_size=32, d_model=128, head_dim=32, mlp_dim=384)
  c.mesh = mesh()
  c.task = task("arithmetic")
  c.task.digits = 2  # operands below 100: learnable in the time the default run has
  c.task.restate = 0.5  # half the base's demonstrations restate the equation (tasks/arithmetic.py)


def chain_sum_default(c: ml_collections.ConfigDict) -> None:
  """The chained-sum testbed (rlscale/tasks/chain_sum.py): the default's model shape and mesh.

  Its own task section, so the default task (and its cached base policy's hash) is unchanged.
  """
  c.model = model("tiny", vocab_size=32, d_model=128, head_dim=32, mlp_dim=384)
  c.mesh = mesh()
  c.task = chain_sum_task()


def chain_sum_task() -> ml_collections.ConfigDict:
  """The chained-sum task's section. Its 2,000 held-out problems put one evaluation's standard
  error near 0.011 (at 45% accuracy), well inside a study's 0.05 band; they also fix the base
  policy (the SFT trains on the other problems)."""
  return section(schema.ChainSumTask)


def mesh() -> ml_collections.ConfigDict:
  return section(schema.Mesh)


# The task section of every task but chain_sum holds the fields of them all (the arithmetic
# task's and those of the tasks on text), as configs always have: the fields of the task it
# does not name are unread, and config hashes and base policies' cache names keep them.
_SHARED_TASKS = (schema.ArithmeticTask, schema.FilesTask, schema.TfdsMathTask,
                 schema.ReasoningGymTask)


def task(name: str = "arithmetic") -> ml_collections.ConfigDict:
  """The task section of `name` (arithmetic | files | tfds_math | reasoning_gym)."""
  return section(*_SHARED_TASKS, name=name)


def optim(lr: float) -> ml_collections.ConfigDict:
  return section(schema.Optim, lr=lr)


def run(num_steps: int) -> ml_collections.ConfigDict:
  """The run's length and cadence: the train section."""
  return section(schema.Train, num_steps=num_steps)


def noise_scale() -> ml_collections.ConfigDict:
  return section(schema.Noise)


def target(metric: str, value: float) -> ml_collections.ConfigDict:
  return section(schema.Target, metric=metric, value=value)


def init(sft_config: str = "configs/sft.py") -> ml_collections.ConfigDict:
  return section(schema.Init, sft_config=sft_config)


def rollout(max_new_tokens: int) -> ml_collections.ConfigDict:
  return section(schema.Rollout, max_new_tokens=max_new_tokens)


def evaluation() -> ml_collections.ConfigDict:
  return section(schema.Eval)


def rl(num_prompts: int, group_size: int, **overrides) -> ml_collections.ConfigDict:
  """The RL step's batch and the policy loss terms every algorithm shares; `overrides` set
  them or add the algorithm's own (rl.advantage; rl.gamma, rl.lam, rl.whiten_advantages)."""
  c = section(schema.Rl, num_prompts=num_prompts, group_size=group_size)
  c.update(overrides)
  return c


def critic(lr: float, reference_batch: int) -> ml_collections.ConfigDict:
  """PPO's value model: its backbone, batches, loss and optimizer (lr at reference_batch)."""
  c = section(schema.Critic)
  c.optim = optim(lr=lr)
  c.optim.reference_batch = reference_batch  # responses per critic optimizer step of lr
  return c


def apply_arg(c: ml_collections.ConfigDict, arg: str | None, variants=None, aliases=None) -> None:
  """big_vision-style config arguments: `tiny`, `p=16,g=8`, `tiny,rl.num_epochs=2`.

  A bare word names a variant (a function that edits `c`); `key=value` sets a field, by its
  dotted path or an alias (`p` for rl.num_prompts), parsed as the field's current type.
  """
  variants, aliases = variants or {}, aliases or {}
  for token in filter(None, (t.strip() for t in (arg or "").split(","))):
    key, eq, value = token.partition("=")
    if not eq:
      if key not in variants:
        raise ValueError(f"config argument {key!r}: not a variant; known: {sorted(variants)}, "
                         f"or key=value with keys {sorted(aliases)} or a dotted field")
      variants[key](c)
      continue
    path = aliases.get(key, key).split(".")
    node = c
    for name in path[:-1]:
      node = node[name]
    if path[-1] not in node:
      raise ValueError(f"config argument {token!r}: no field {'.'.join(path)}")
    node[path[-1]] = _parse(value, node[path[-1]])


def _parse(text: str, like):
  if isinstance(like, bool):
    return text.lower() in ("1", "true", "yes")
  for kind in (int, float):
    if isinstance(like, kind):
      return kind(text)
  if like == "auto" or like is None:
    if text.lower() in ("true", "false"):  # train.shared_prompt: 'auto' | True | False
      return text.lower() == "true"
    try:
      return int(text)
    except ValueError:
      return text
  return text


ALIASES = {"p": "rl.num_prompts", "g": "rl.group_size", "lr": "optim.lr",
           "model": "model.name", "steps": "train.num_steps",
           "responses": "train.total_responses", "seed": "seed"}

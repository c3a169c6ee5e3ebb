"""A config's plain dict as the typed, checked Config of the schema (rlscale/config/schema.py).

`check(d)` is what the resolve step runs (rlscale/resolve/resolved.py): every section's own
checks, in one order, then the type check of the fields no check named, every problem in one
list. `from_dict` is the type check alone: an unknown or misspelt field (named with the closest
one), a value of the wrong type, a missing section, all at once; `schema.to_dict` is its
inverse.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from typing import Any, Literal

from rlscale.config.errors import ConfigError
from rlscale.config.fields import integer
from rlscale.config.schema import (MISSING, RL_TYPES, TASKS, Config, Critic, Eval, Init, Model,
                                   Noise, Optim, Rl, Rollout, Target, Task, Train, _OPTIONAL,
                                   _hints, _is_union, _kind_errors, _names, with_defaults)


@dataclasses.dataclass(frozen=True)
class Checked:
  """A config after every section's checks: the typed config (None when a value has the
  wrong type or a section is missing), every error, and the fields the errors name."""
  config: "Config | None"
  errors: list[str]
  named: frozenset[str]


def _named(errors: list[str]) -> frozenset[str]:
  return frozenset(re.split(r"[=:, ]", e.strip(), maxsplit=1)[0] for e in errors)


def structure(d: dict) -> str:
  """The config's kind, once it has one and the sections that kind needs (a ConfigError
  naming what is missing, alone, otherwise)."""
  kind = d.get("kind")
  if not isinstance(kind, str):
    raise ConfigError(f"invalid config:\n  kind={kind!r} must name sft or an algorithm")
  need = (("model", "mesh", "task", "sft", "optim", "train", "eval") if kind == "sft" else
          ("model", "mesh", "task", "init", "rollout", "rl", "optim", "noise", "target", "train",
           "eval"))
  missing = [n for n in need if n not in d]
  if missing:
    raise ConfigError(f"invalid config:\n  kind={kind!r} needs the section(s) "
                      f"{', '.join(missing)}, which this config lacks")
  return kind


def check(d: dict, owners: list[str] | tuple = ()) -> Checked:
  """Every section's checks of `d` (a config's nested plain dict, of this code's schema
  version), each section checking its own values (its `check`) with the whole config at
  hand, then the types of the fields no other check named. `owners` are the errors the
  algorithm found in its own part (the names of registered losses and advantages,
  rlscale/rl/algorithm.py), listed after the rl section's. A missing kind or section is a
  ConfigError alone."""
  kind = structure(d)
  rl_type = RL_TYPES.get(kind, Rl)
  name = d["task"].get("name") if isinstance(d["task"], dict) else None
  task_type = TASKS.get(name, Task) if isinstance(name, str) else Task
  view = {"kind": kind, "seed": d.get("seed", 0)}
  for name in _names(Config)[2:]:
    if name in d:
      cls = {"task": task_type, "rl": rl_type}.get(name) or _section_type(name)
      view[name] = with_defaults(cls, d[name])
  if "critic" in view:
    view["critic"]["optim"] = with_defaults(Optim, view["critic"]["optim"])
  errors = Model.check(view["model"], view) + Train.check(view["train"], view)
  integer(errors, "seed", view["seed"], minimum=0)
  errors += Eval.check(view["eval"], view)
  if kind != "sft":
    errors += Rollout.check(view["rollout"], view) + Noise.check(view["noise"], view)
    errors += Target.check(view["target"], view) + Init.check(view["init"], view)
    errors += rl_type.check(view["rl"], view)
  errors += list(owners)
  if "critic" in view:
    errors += Critic.check(view["critic"], view)
  errors += Optim.check(view["optim"], view)
  if "critic" in view:
    errors += Optim.check(view["critic"]["optim"], view, "critic.optim")
  if kind != "sft":
    errors += Rollout.sampler_errors(view["rollout"])
  errors += task_type.check(view["task"], view) + Train.memory_errors(view["train"])
  try:
    typed = from_dict(d)
  except ConfigError as e:  # a type no check above named (their messages say more)
    typed, text = None, " ".join(errors)
    errors += [line.strip() for line in str(e).splitlines()[1:]
               if re.split(r"[=:]", line.strip(), maxsplit=1)[0] not in text]
  return Checked(typed, errors, _named(errors))


def _section_type(name: str):
  hint = _hints(Config)[name]
  return next(a for a in typing.get_args(hint) or (hint,) if a is not type(None))


# --- from_dict ---
_BAD = object()


def _value(value, hint):
  """`value` as a field of type `hint` holds it (lists become tuples), or _BAD. A bool is no
  int or float; an int is a float, kept as it is."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if _is_union(hint):
    for arg in args:
      out = _value(value, arg)
      if out is not _BAD:
        return out
    return _BAD
  if origin is Literal:
    return value if any(type(value) is type(a) and value == a for a in args) else _BAD
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      return _BAD
    items = args[:1] * len(value) if args[-1:] == (Ellipsis,) else args
    out = tuple(_value(v, a) for v, a in zip(value, items))
    return out if len(items) == len(value) and _BAD not in out else _BAD
  if hint is type(None):
    return value if value is None else _BAD
  if hint in (int, float):
    ok = isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
  else:
    ok = isinstance(value, hint)
  return value if ok else _BAD


def _text(hint) -> str:
  """A type as it is written: int | None, tuple[int, ...], Literal['a', 'b']."""
  args = typing.get_args(hint)
  if _is_union(hint):
    return " | ".join(map(_text, args))
  if typing.get_origin(hint) is Literal:
    return f"Literal[{', '.join(map(repr, args))}]"
  if typing.get_origin(hint) is tuple:
    return f"tuple[{', '.join('...' if a is Ellipsis else _text(a) for a in args)}]"
  return "None" if hint is type(None) else hint.__name__


def _phrase(hint) -> str:
  """What a value of type `hint` must be, for an error message."""
  if _is_union(hint):
    return " or ".join(map(_phrase, typing.get_args(hint)))
  if typing.get_origin(hint) is Literal:
    return f"one of {', '.join(map(repr, typing.get_args(hint)))}"
  words = {int: "an int", float: "a float", str: "a str", bool: "True or False",
           type(None): "None"}
  return words.get(hint) or f"a {_text(hint)}"


def _join(path: str, name: str) -> str:
  return f"{path}.{name}" if path else name


def _unknown(path: str, name: str, known) -> str:
  close = difflib.get_close_matches(name, list(known), n=1)
  return (f"{_join(path, name)}: no such field"
          + (f" (did you mean {_join(path, close[0])}?)" if close else ""))


def _section(cls, d, path: str, errors: list[str], others=frozenset()):
  """`d` as a `cls`, or None with its problems added to `errors`; a key in `others` (a field
  of another type of the section) is accepted and left out."""
  if not isinstance(d, dict):
    errors.append(f"{path}={d!r}: a section (a dict of its fields)")
    return None
  before, hints, kwargs = len(errors), _hints(cls), {}
  names = _names(cls)
  errors += [_unknown(path, k, sorted(set(names) | set(others))) for k in d
             if k not in names and k not in others]
  for field in dataclasses.fields(cls):
    name, hint = field.name, hints[field.name]
    if name not in d:
      if field.default is MISSING and field.default_factory is MISSING:
        errors.append(f"{_join(path, name)}: missing ({_phrase(hint)})")
    elif dataclasses.is_dataclass(hint):
      kwargs[name] = _section(hint, d[name], _join(path, name), errors)
    else:
      kwargs[name] = _value(d[name], hint)
      if kwargs[name] is _BAD:
        errors.append(f"{_join(path, name)}={d[name]!r}: {_phrase(hint)}")
  return cls(**kwargs) if len(errors) == before else None


@functools.lru_cache(maxsize=None)
def _fields_of(*classes) -> frozenset[str]:
  return frozenset(n for c in classes for n in _names(c))


def from_dict(d: dict) -> Config:
  """A nested plain dict (ConfigDict.to_dict(), a run's config.json) as a Config; a
  ConfigError naming every problem, one per line, otherwise. Absent fields take their
  defaults; a task field of another task type is accepted and left out."""
  if not isinstance(d, dict):
    raise ConfigError(f"invalid config:\n  {d!r}: a config (a dict of its sections)")
  errors: list[str] = []
  hints = _hints(Config)
  errors += [_unknown("", k, _names(Config)) for k in d if k not in _names(Config)]
  kind = d.get("kind")
  if "kind" not in d:
    errors.append(f"kind: missing ({_phrase(hints['kind'])})")
  elif not isinstance(kind, str) or not kind:
    errors.append(f"kind={kind!r}: sft or an RL algorithm's name (a str)")
  kind = kind if isinstance(kind, str) and kind else None
  kwargs: dict[str, Any] = {"kind": kind}
  if "seed" in d:
    kwargs["seed"] = _value(d["seed"], hints["seed"])
    if kwargs["seed"] is _BAD:
      errors.append(f"seed={d['seed']!r}: {_phrase(hints['seed'])}")
  if kind is not None:
    errors += _kind_errors(kind, {n for n in _OPTIONAL if n in d})
  for name in _names(Config):
    if name in ("kind", "seed"):
      continue
    if name not in d:
      if name not in _OPTIONAL:
        errors.append(f"{name}: missing (every config has it)")
      continue
    if name == "task":
      kwargs[name] = _task(d[name], errors)
    elif name == "rl":
      rl = RL_TYPES[kind] if kind in RL_TYPES else Rl
      others = _fields_of(*RL_TYPES.values()) if rl is Rl else frozenset()
      kwargs[name] = _section(rl, d[name], name, errors, others)
    else:
      cls = next(a for a in typing.get_args(hints[name]) or (hints[name],) if a is not type(None))
      kwargs[name] = _section(cls, d[name], name, errors)
  if errors:
    raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
  return Config(**kwargs)


def _task(d, errors: list[str]):
  """The task section as the type its name picks."""
  name = d.get("name", Task.name) if isinstance(d, dict) else None
  if isinstance(d, dict) and (not isinstance(name, str) or name not in TASKS):
    errors.append(f"task.name={name!r}: no such task (one of {', '.join(TASKS)})")
    return None
  return _section(TASKS.get(name, Task), d, "task", errors, _fields_of(*TASKS.values()))



"""The points of a named sweep: overrides checked against the config, run directories named.

A config file declares `sweeps(arg=None) -> {name: [overrides, ...]}` beside `get_config`
(rlscale/sweep/axes.py builds the lists). Each point is one full run: the config with its
overrides, in `<sweep dir>/<name>`, where the name is the point's overrides that vary across
the sweep, as `key=value` joined by commas (`p=64,lr_scaling=sqrt,seed=1`): readable, stable
(the same declaration gives the same names) and short (what every point shares is left out).

Everything here is checked before any run starts: an unknown sweep name, a key that names no
config field, a value the field cannot hold, two points with one run directory. A sweep of
thousands of points is checked in seconds: each distinct key=value once, not each point on a
copy of the whole config (unless the config links fields with references, where one override
may change another field).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
import sys
from typing import Any

import ml_collections
from ml_collections.config_dict import FieldReference

from rlscale.config import sections as config_common
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=,-]")
MAX_NAME = 120


@dataclasses.dataclass
class Point:
  name: str  # the run directory's name inside the sweep directory
  overrides: dict[str, Any]  # as declared: {key: value}
  fields: dict[str, Any]  # the same with every key a dotted config field
  run_dir: str

  def config_args(self) -> list[str]:
    """`--config.<field>=<value>` for each override (ml_collections' command-line form)."""
    return [f"--config.{k}={format_value(v)}" for k, v in self.fields.items()]


def format_value(value) -> str:
  if isinstance(value, (tuple, list)):
    return "(" + ",".join(format_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
  if isinstance(value, float):
    return repr(value)
  return str(value)


def declared(config: str) -> dict[str, list[dict]]:
  """The config file's sweeps for its argument (`configs/grpo.py:tiny` -> sweeps('tiny'))."""
  module, arg = config_files.load_module(config)
  fn = getattr(module, "sweeps", None)
  if not callable(fn):
    raise ConfigError(f"--config={config}: the file declares no sweeps(arg=None) function")
  sweeps = fn(arg)
  if not isinstance(sweeps, dict):
    raise ConfigError(f"--config={config}: sweeps() must return {{name: [overrides]}}, "
                      f"not {type(sweeps).__name__}")
  return sweeps


def _field(cfg: ml_collections.ConfigDict, key: str, aliases: dict[str, str]) -> str:
  """The dotted field `key` names, or a ConfigError naming it."""
  path = key if _has(cfg, key) else aliases.get(key, key)  # a field wins over an alias
  node = cfg
  parts = path.split(".")
  for depth, name in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      where = ".".join(parts[:depth]) or "the config"
      raise ConfigError(f"override {key!r}: {where} has no field {name!r}"
                        + (f" ({key!r} is an alias of {path})" if key != path else ""))
    node = node[name]
  if isinstance(node, ml_collections.ConfigDict):
    raise ConfigError(f"override {key!r}: {path} is a section, not a field")
  return path


def _has(cfg: ml_collections.ConfigDict, path: str) -> bool:
  node = cfg
  for name in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      return False
    node = node[name]
  return True


def _set(cfg: ml_collections.ConfigDict, path: str, value, key: str) -> None:
  *parents, last = path.split(".")
  node = cfg
  for name in parents:
    node = node[name]
  _put(cfg, node, last, value, key, path)


def _put(root: ml_collections.ConfigDict, node: ml_collections.ConfigDict, last: str, value,
         key: str, path: str) -> None:
  try:
    with root.unlocked():
      node[last] = value
  except (TypeError, ValueError) as e:
    raise ConfigError(f"override {key}={value!r}: {path} cannot hold it ({e})") from e


def linked(cfg: ml_collections.ConfigDict) -> bool:
  """Whether a field of `cfg` follows another: a reference or a section shared by two fields,
  or a reference computed from another. Then setting one field may change another."""
  seen: set[int] = set()

  def walk(node) -> bool:
    try:
      values = list(node._fields.values())  # pylint: disable=protected-access
    except AttributeError:
      return True  # another ml_collections: assume the worst
    for v in values:
      if id(v) in seen:
        return True
      if isinstance(v, ml_collections.ConfigDict):
        seen.add(id(v))
        if walk(v):
          return True
      elif isinstance(v, FieldReference):
        seen.add(id(v))
        if getattr(v, "_ops", True) or isinstance(getattr(v, "_value", None), FieldReference):
          return True
    return False
  return walk(cfg)


def _checked(base: ml_collections.ConfigDict, key: str, value, aliases: dict[str, str],
             memo: dict) -> str:
  """The field `key` names, `value` set on a copy of its section of `base` (or of `base` for
  a top-level field) to check it; once per distinct key and value."""
  k = (key, type(value), repr(value))
  if k not in memo:
    path = _field(base, key, aliases)
    parent, _, last = path.rpartition(".")
    node = base
    for name in parent.split(".") if parent else []:
      node = node[name]
    scratch = copy.deepcopy(node)
    _put(scratch, scratch, last, value, key, path)
    memo[k] = path
  return memo[k]


def set_field(cfg: ml_collections.ConfigDict, path: str, value) -> None:
  """Set the dotted field `path` of `cfg` (a ConfigError naming it when it cannot hold it)."""
  _set(cfg, _field(cfg, path, dict(config_common.ALIASES)), value, path)


def _short(value) -> str:
  if isinstance(value, float):
    return format(value, "g")
  if isinstance(value, bool):
    return str(value).lower()
  return format_value(value)


def short_keys(keys) -> dict[str, str]:
  """Each dotted key's shortest tail that no other key shares: optim.lr_scaling -> lr_scaling,
  but rl.num_minibatches and critic.num_minibatches keep their section."""
  keys = list(dict.fromkeys(keys))
  out = {}
  for k in keys:
    parts = k.split(".")
    for n in range(1, len(parts) + 1):
      tail = ".".join(parts[-n:])
      if not any(o != k and (o == tail or o.endswith("." + tail)) for o in keys):
        break
    out[k] = tail
  return out


def point_name(overrides: dict[str, Any], varying: set[str],
               short: dict[str, str] | None = None) -> str:
  """`key=value` of the varying keys joined by commas; a hash keeps a long name unique."""
  keys = [k for k in overrides if k in varying] or list(overrides)
  short = short or short_keys(keys)
  name = ",".join(f"{short[k]}={_short(overrides[k])}" for k in keys) or "base"
  name = _UNSAFE.sub("_", name)
  if len(name) > MAX_NAME:
    digest = hashlib.sha256(json.dumps(overrides, sort_keys=True, default=str).encode())
    name = name[:MAX_NAME - 13] + "-" + digest.hexdigest()[:12]
  return name


def points(config: str, sweep: str, sweep_dir: str) -> list[Point]:
  """The points of `sweep` declared in `config`, checked; a ConfigError names what is wrong."""
  return build(config, sweep, declared_points(config, sweep), sweep_dir)


def declared_points(config: str, sweep: str) -> list[dict]:
  """The override dicts `sweep` declares in `config` (unchecked)."""
  sweeps = declared(config)
  if sweep not in sweeps:
    raise ConfigError(f"--sweep={sweep!r}: {config} declares no such sweep; it declares "
                      f"{', '.join(sorted(sweeps)) or 'none'}")
  if not sweeps[sweep]:
    raise ConfigError(f"--sweep={sweep}: the sweep has no points")
  return list(sweeps[sweep])


def build(config: str, sweep: str, declared_points: list[dict], sweep_dir: str) -> list[Point]:
  """Points from override dicts (a sweep's, or a study's with its choices filled in), checked
  against the config and named by the keys that vary among them."""
  base = config_files.load(config)
  one_by_one = not linked(base)
  memo: dict = {}
  aliases = dict(config_common.ALIASES)
  varying = {k for p in declared_points if isinstance(p, dict) for k in p
             if any(not isinstance(q, dict) or q.get(k, object()) != p[k]
                    for q in declared_points)}
  short = short_keys(k for p in declared_points if isinstance(p, dict) for k in p)
  out, by_dir = [], {}
  for i, overrides in enumerate(declared_points):
    if not isinstance(overrides, dict):
      raise ConfigError(f"--sweep={sweep}: point {i} is {overrides!r}, not a dict of overrides")
    cfg = None if one_by_one else copy.deepcopy(base)
    fields = {}
    for key, value in overrides.items():
      path = (_checked(base, key, value, aliases, memo) if one_by_one else
              _field(cfg, key, aliases))
      if path in fields:
        raise ConfigError(f"--sweep={sweep}: point {overrides} sets {path} twice")
      if cfg is not None:
        _set(cfg, path, value, key)
      fields[path] = value
    name = point_name(overrides, varying, short)
    if name in by_dir:
      raise ConfigError(f"--sweep={sweep}: points {by_dir[name]} and {overrides} have the same "
                        f"run directory {name!r}; give them different overrides")
    by_dir[name] = overrides
    out.append(Point(name, dict(overrides), fields, os.path.join(sweep_dir, name)))
  return out


def run_argv(config: str, point: Point, python: str | None = None) -> list[str]:
  """The command that runs `point` (its run directory resumes from its checkpoints)."""
  return [python or sys.executable, "-m", "rlscale", f"--config={config}",
          f"--workdir={point.run_dir}", *point.config_args()]


def base_argv(config: str, point: Point, python: str | None = None) -> list[str]:
  """The command that builds (or finds) the base policy `point` starts from, and stops."""
  return run_argv(config, point, python) + ["--base_policy_only"]


# What a base policy depends on (rlscale/run/base_policy.py): the run's kind, its init section
# (the SFT config, the cache, a checkpoint) and the model, task and mesh the recipe copies.
RECIPE_SECTIONS = ("kind", "init", "model", "task", "mesh")
_LOADED: dict[tuple, tuple[ml_collections.ConfigDict, bool]] = {}  # (config, mtime) -> ...
_BASE_KEYS: dict[tuple, str | None] = {}  # (config, mtime, recipe overrides) -> base_key


def _loaded(config: str) -> tuple[tuple, ml_collections.ConfigDict, bool]:
  """((config, its file's mtime), the config as loaded -- not to be changed --, whether its
  fields are linked); loaded again when the file changed."""
  path, _ = config_files.find(config)
  key = (config, os.stat(path).st_mtime_ns)
  if key not in _LOADED:
    cfg = config_files.load(config)
    _LOADED[key] = cfg, linked(cfg)
  return key, *_LOADED[key]


def base_key(config: str, point: Point) -> str | None:
  """Which base policy the point starts from (points with one key share it); None: a
  Hugging Face checkpoint, nothing to build. Worked out once per distinct recipe in a
  process: points whose overrides differ only outside RECIPE_SECTIONS share it (unless the
  config links fields)."""
  loaded, base, is_linked = _loaded(config)
  recipe = {k: v for k, v in point.fields.items() if k.split(".")[0] in RECIPE_SECTIONS}
  memo = None if is_linked else (*loaded, json.dumps(recipe, sort_keys=True, default=repr))
  if memo in _BASE_KEYS:
    return _BASE_KEYS[memo]
  cfg = copy.deepcopy(base)
  with cfg.unlocked():
    for path, value in point.fields.items():
      _set(cfg, path, value, path)
  if cfg.kind == "sft" or cfg.init.hf_checkpoint or cfg.model.hf_checkpoint:
    key = None  # a checkpoint is its own base (rlscale/run/base_policy.py): nothing to build
  else:
    from rlscale.run import base_policy
    key = base_policy.cache_folder(cfg, config)
  if memo is not None:
    _BASE_KEYS[memo] = key
  return key

"""Experiment config files: `path/to/config.py[:arg]` -> its `get_config(arg)`.

The shipped configs live in the checkout's `configs/` and are installed as the package
`rlscale.configs`, so `configs/grpo.py`, `grpo.py` and `rlscale.configs.grpo` name the same
file from any directory once rlscale is installed; a file that exists as written always wins.
"""

from __future__ import annotations

import importlib.util
import os

import ml_collections

from rlscale.config import migrate

PACKAGE = "rlscale.configs"


def packaged_dirs() -> list[str]:
  """Folders holding the shipped configs: the installed package, else the checkout's configs/."""
  try:
    spec = importlib.util.find_spec(PACKAGE)
  except ImportError:
    spec = None
  if spec is not None and spec.submodule_search_locations:
    return list(spec.submodule_search_locations)
  # An editable install made before rlscale.configs existed maps only rlscale/; the checkout
  # still has configs/ beside it.
  import rlscale
  checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(rlscale.__file__))),
                          "configs")
  return [checkout] if os.path.isdir(checkout) else []


def _shipped_name(path: str) -> str | None:
  """The file name inside rlscale.configs that `path` may mean, or None if it names another place."""
  prefix = PACKAGE + "."
  if path.startswith(prefix) and not path.endswith(".py"):
    return path[len(prefix):] + ".py"
  head, name = os.path.split(os.path.normpath(path))
  if head in ("", "configs") and name.endswith(".py"):
    return name
  return None


def find(spec: str, relative_to: str | None = None) -> tuple[str, str]:
  """`path[:arg]` -> (an existing file, arg).

  Looked up in order: as written (relative to the current directory); beside the repository of
  `relative_to` (the config file that names this one); among the shipped configs.
  """
  path, _, arg = spec.partition(":")
  candidates = [path]
  if relative_to and not os.path.isabs(path):
    config_dir = os.path.dirname(os.path.abspath(relative_to.partition(":")[0]))
    candidates.append(os.path.join(os.path.dirname(config_dir), path))
  name = _shipped_name(path)
  if name:
    candidates += [os.path.join(d, name) for d in packaged_dirs()]
  for candidate in candidates:
    if os.path.isfile(candidate):
      return candidate, arg
  raise FileNotFoundError(
      f"config file {path!r} not found; looked in {', '.join(map(repr, candidates))} "
      f"(current directory {os.getcwd()!r})")


def load_module(spec: str, relative_to: str | None = None):
  """`path/to/config.py[:arg]` -> (the config file as a module, arg or None)."""
  path, arg = find(spec, relative_to)
  module_spec = importlib.util.spec_from_file_location("rlscale_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ValueError(f"config file {path!r} defines no get_config(arg=None) function")
  return module, arg or None


def load(spec: str, relative_to: str | None = None) -> ml_collections.ConfigDict:
  """`path/to/config.py[:arg]` -> get_config(arg), migrated to this code's schema version
  (config/migrate.py: a field the file lacks gets the value configs without it ran with); see
  `find` for where the file is looked up."""
  module, arg = load_module(spec, relative_to)
  return migrate.migrate(module.get_config(arg))


def run_config(run_dir: str) -> dict:
  """A run directory's config.json as this code reads it (config/migrate.py: the fields a run
  written before they existed ran with), as a plain nested dict. FileNotFoundError naming the
  folder when it holds no config.json."""
  import json
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{run_dir} is not a run directory: it has no config.json")
  with open(path) as f:
    return migrate.migrate(json.load(f))

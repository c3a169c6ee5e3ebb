"""Experiment config files: `path/to/config.py[:arg]` -> its `get_config(arg)`."""

from __future__ import annotations

import importlib.util
import os

import ml_collections


def load(spec: str, relative_to: str | None = None) -> ml_collections.ConfigDict:
  """`path/to/config.py[:arg]` -> get_config(arg).

  A relative path that does not exist is looked up beside the repository of `relative_to`
  (the config file that names it).
  """
  path, _, arg = spec.partition(":")
  if not os.path.exists(path) and relative_to:
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(relative_to))), path)
  module_spec = importlib.util.spec_from_file_location("rlscale_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)

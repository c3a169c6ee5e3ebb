"""The persistent XLA compilation cache: a program compiled by one process is read back by the
next (a sweep's points, a resumed run, the tests).

On by default, in `xla_cache/` beside the base-policy cache (`init.cache_dir`, `runs/base`:
`runs/xla_cache`), so that the points of a sweep, which share a base policy, share compiled
programs too. `RLSCALE_COMPILATION_CACHE=<folder>` puts it elsewhere and `=off` turns it off;
JAX's own `JAX_COMPILATION_CACHE_DIR`, when set, wins (the tests set one per session). The
cache key holds the program, the devices, XLA's flags and the versions, so a hit runs the same
executable: no number changes. Programs whose compilation took less than MIN_COMPILE_S are
left out (they cost less to compile than the file to read).
"""

from __future__ import annotations

import os

import jax
from absl import logging

ENV = "RLSCALE_COMPILATION_CACHE"
MIN_COMPILE_S = 0.25


def folder_for(cache_dir: str) -> str:
  """`xla_cache` beside `cache_dir` (init.cache_dir, the base policies' folder)."""
  parent = os.path.dirname(os.path.abspath(cache_dir))
  return os.path.join(parent, "xla_cache")


def enable(cache_dir: str = "runs/base") -> str | None:
  """Turn the cache on for this process (before its first compilation); the folder, or None
  when it is off. An earlier setting (JAX_COMPILATION_CACHE_DIR, a test's) is kept."""
  current = jax.config.jax_compilation_cache_dir
  if current:
    return current
  choice = os.environ.get(ENV, "")
  if choice.lower() in ("off", "0", "false", "no"):
    return None
  folder = choice or folder_for(cache_dir)
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:  # a read-only tree: run uncached rather than refuse
    logging.warning("compilation cache %s not usable (%s); compiling without it", folder, e)
    return None
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  logging.info("compilation cache: %s", folder)
  return folder

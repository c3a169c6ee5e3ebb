"""A per-save host-memory leak of orbax 0.12 on tensorstore 0.1.75-0.1.86, worked around.

tensorstore's Python binding keeps a reference to every object it converts from its own JSON
(`experimental_collect_matching_metrics`, `Spec.to_json`): what those return is never freed,
~3 KB a metrics read and ~0.5 KB a spec. Orbax calls both on every save: the byte counters
twice a save, for a throughput line in its log (`tensorstore_utils.get_tensorstore_raw_bytes`),
and `KvStore.Spec(...).to_json()` once for every array written, to resolve its directory's
spec, kept for as long as the process lives.

`apply()` replaces the counter with one that reads nothing and says 0, which orbax takes as
"no raw bytes" (it skips that log line and its jax.monitoring scalar; nothing else reads it),
and gives orbax's tensorstore_utils a `KvStore.Spec` whose to_json() is computed once for each
distinct spec (the arrays of one save share their directory's). Measured on a save of 16
arrays: ~27 KB kept before, ~8 KB after; the rest comes from tensorstore's other calls (a few
hundred bytes an array: opening and writing it). benchmarks/long_run.py measures what a run
keeps.
"""

from __future__ import annotations

import copy
import functools
import json
import types

import tensorstore
from orbax.checkpoint._src.serialization import tensorstore_utils

_ORIGINAL = tensorstore_utils.get_tensorstore_raw_bytes


def _no_raw_bytes(direction=None) -> int:
  del direction
  return 0


@functools.lru_cache(maxsize=256)
def _resolved(key: str):
  return tensorstore.KvStore.Spec(json.loads(key)).to_json()


class _Spec:
  """tensorstore.KvStore.Spec(spec), its to_json() remembered per spec; what `open` takes."""

  def __init__(self, spec):
    self.spec = spec

  def real(self):
    return tensorstore.KvStore.Spec(self.spec)

  def to_json(self, *args, **kwargs):
    if args or kwargs or not isinstance(self.spec, dict):
      return self.real().to_json(*args, **kwargs)
    return copy.deepcopy(_resolved(json.dumps(self.spec, sort_keys=True)))


class _KvStore:
  Spec = _Spec

  @staticmethod
  def open(spec, *args, **kwargs):
    return tensorstore.KvStore.open(spec.real() if isinstance(spec, _Spec) else spec,
                                    *args, **kwargs)


class _Tensorstore(types.ModuleType):
  """tensorstore as orbax's tensorstore_utils sees it: the module, but for KvStore."""
  KvStore = _KvStore

  def __getattr__(self, name):
    return getattr(tensorstore, name)


def apply() -> None:
  """Idempotent; orbax's code looks both up on its module at each call."""
  tensorstore_utils.get_tensorstore_raw_bytes = _no_raw_bytes
  if not isinstance(tensorstore_utils.ts, _Tensorstore):
    tensorstore_utils.ts = _Tensorstore("tensorstore")


def applied() -> bool:
  return (tensorstore_utils.get_tensorstore_raw_bytes is _no_raw_bytes
          and isinstance(tensorstore_utils.ts, _Tensorstore))


def undo() -> None:
  """Orbax as it comes (tests measure the leak this avoids)."""
  tensorstore_utils.get_tensorstore_raw_bytes = _ORIGINAL
  tensorstore_utils.ts = tensorstore

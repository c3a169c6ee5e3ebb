"""A per-save host-memory leak of orbax 0.12 on tensorstore 0.1.86, worked around.

Every array save and restore, orbax reads tensorstore's byte counters twice
(`tensorstore_utils.get_tensorstore_raw_bytes`, for a throughput line in its log), and
tensorstore's `experimental_collect_matching_metrics` returns objects that are never freed (a
reference held in its binding): ~3 KB a call once a file was written, ~19 KB of resident
memory a save, for as long as the process lives -- 19 MB over a run saving 1,000 times, more
the more arrays a batch holds. `apply()` replaces that counter with one that reads nothing and
says 0, which orbax takes as "no raw bytes" and skips that log line and its jax.monitoring
scalar; nothing else reads it. The same leak in tensorstore's spec.to_json(), which orbax calls
for each array's kvstore spec, still keeps ~0.5 KB a call (about a quarter of what was kept a
save); benchmarks/long_run.py measures what a run keeps.
"""

from __future__ import annotations

from orbax.checkpoint._src.serialization import tensorstore_utils

_ORIGINAL = tensorstore_utils.get_tensorstore_raw_bytes


def _no_raw_bytes(direction=None) -> int:
  del direction
  return 0


def apply() -> None:
  """Idempotent; orbax's callers look the function up on the module at each call."""
  tensorstore_utils.get_tensorstore_raw_bytes = _no_raw_bytes


def applied() -> bool:
  return tensorstore_utils.get_tensorstore_raw_bytes is _no_raw_bytes

"""What this process compiled, from JAX's monitoring events: programs, seconds, cache hits.

`install()` registers the listeners once (the command line does, before anything compiles);
`stats()` is the running total that summary.json records as `compile`: `programs` (backend
compilations asked for, hits of the persistent cache included), `cache_hits`, `compile_s` (the
backend's seconds, reads of the cache included), `trace_s` and `lower_s` (Python tracing and
lowering to HLO, which happen on a hit too).
"""

from __future__ import annotations

import threading

import jax

_BACKEND = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"
_LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_HIT = "/jax/compilation_cache/cache_hits"

_lock = threading.Lock()
_stats = {"programs": 0, "cache_hits": 0, "compile_s": 0.0, "trace_s": 0.0, "lower_s": 0.0}
_installed: list[bool] = []


def _duration(event: str, seconds: float, **kwargs) -> None:
  del kwargs
  key = {_BACKEND: "compile_s", _TRACE: "trace_s", _LOWER: "lower_s"}.get(event)
  if key is None:
    return
  with _lock:
    _stats[key] += seconds
    if key == "compile_s":
      _stats["programs"] += 1


def _event(event: str, **kwargs) -> None:
  del kwargs
  if event == _HIT:
    with _lock:
      _stats["cache_hits"] += 1


def install() -> None:
  if _installed:
    return
  _installed.append(True)
  jax.monitoring.register_event_duration_secs_listener(_duration)
  jax.monitoring.register_event_listener(_event)


def stats() -> dict[str, float]:
  with _lock:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in _stats.items()}

"""Peak memory per phase: XLA's analysis of a compiled call, the device's runtime peak and
the host's peak resident memory.

Three figures, each for what it can answer:
  compiled   `Compiled.memory_analysis()` of a jitted call, per device (works on CPU):
             arguments, outputs, temporaries (activations, logits, loop carries), bytes
             aliased (outputs written into donated arguments) and `total` = arguments +
             outputs + temporaries - aliased + code: what the call needs while it runs.
  device     memory_stats()["peak_bytes_in_use"] where the backend reports it (GPU, TPU):
             the process's running peak, which JAX cannot reset, so a phase's figure is the
             peak up to its end (the first phase that reaches the run's peak is the one).
  host       the process's peak resident set (VmHWM), reset at each phase's start where Linux
             allows (/proc/self/clear_refs), so that it is the phase's own; `host_peak_rss`
             keeps the process's peak across resets.

`Recorder` wraps a jitted function to remember its last call's arguments as shapes and
shardings (donated buffers are gone after the call), so that the call can be lowered again
after a run (jit's cache returns the executable it ran) and analysed. `PhaseMemory` times
phases of a run by wrapping the methods that run them.
"""

from __future__ import annotations

import contextlib
import resource
from typing import Any, Callable

import jax

GIB = 2**30
_seen_peak = 0  # the largest VmHWM read before a reset


def compiled_memory(compiled) -> dict[str, int]:
  """XLA's memory analysis of a `Compiled` (jitted.lower(...).compile()), bytes per device;
  {} where the backend reports none."""
  m = compiled.memory_analysis()
  if m is None:
    return {}
  out = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
         "temp": m.temp_size_in_bytes, "alias": m.alias_size_in_bytes,
         "code": m.generated_code_size_in_bytes}
  out["total"] = out["arguments"] + out["outputs"] + out["temp"] - out["alias"] + out["code"]
  return out


def lowered_memory(jitted, *args, **kwargs) -> dict[str, int]:
  """`compiled_memory` of `jitted` lowered for `args` (arrays or ShapeDtypeStructs)."""
  return compiled_memory(jitted.lower(*args, **kwargs).compile())


def device_peak() -> int | None:
  """The largest peak_bytes_in_use among the local devices; None where none is reported."""
  peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in jax.local_devices()]
  peaks = [p for p in peaks if p is not None]
  return max(peaks) if peaks else None


def _vmhwm() -> int | None:
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def host_peak_rss() -> int:
  """The process's peak resident set in bytes, across `reset_host_peak` calls."""
  now = _vmhwm()
  if now is None:  # no /proc: the kernel's own peak (KiB on Linux), never reset
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  return max(now, _seen_peak)


def reset_host_peak() -> bool:
  """Start a new host peak (Linux: VmHWM back to the current RSS); False where not possible."""
  global _seen_peak
  _seen_peak = host_peak_rss()
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


class Recorder:
  """A jitted function that remembers its last call's arguments as ShapeDtypeStructs (with
  their shardings) and can report the memory analysis of that call."""

  def __init__(self, jitted):
    self.jitted = jitted
    self.args: tuple | None = None

  def __call__(self, *args):
    self.args = jax.tree.map(_abstract, args)
    return self.jitted(*args)

  def lower(self, *args):
    return self.jitted.lower(*args)

  def memory(self) -> dict[str, int]:
    """The last call's `compiled_memory`; {} before any call."""
    return {} if self.args is None else lowered_memory(self.jitted, *self.args)


def _abstract(x):
  if isinstance(x, jax.Array):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
  return x


class PhaseMemory:
  """Per-phase runtime memory of a run: `wrap(obj, method, phase)` makes each call of
  obj.method a phase that blocks on its result, with the host's peak during it and the
  device's running peak at its end. `figures()`: the maximum over the calls after `skip`
  (compilation) per phase, in GiB."""

  def __init__(self, skip: int = 0):
    self.skip = skip
    self.calls: dict[str, list[dict[str, float]]] = {}
    self.open: dict[str, bool] = {}  # started phases: whether the host peak could be reset

  def start(self, name: str) -> None:
    """A phase begins (for phases that begin in one call and end in another)."""
    self.open[name] = reset_host_peak()

  def stop(self, name: str) -> None:
    """The phase ends: its figures are recorded (nothing if it was not started)."""
    if name not in self.open:
      return
    row = {"host_peak_rss_gb": host_peak_rss() / GIB, "host_peak_is_phase": self.open.pop(name)}
    dev = device_peak()
    if dev is not None:
      row["device_peak_so_far_gb"] = dev / GIB
    self.calls.setdefault(name, []).append(row)

  @contextlib.contextmanager
  def phase(self, name: str):
    self.start(name)
    try:
      yield
    finally:
      self.stop(name)

  def wrap(self, obj: Any, method: str, name: str, block: Callable[[Any], Any] | None = None):
    fn = getattr(obj, method)

    def wrapped(*args, **kwargs):
      with self.phase(name):
        out = fn(*args, **kwargs)
        jax.block_until_ready((block or (lambda o: o))(out))
      return out

    setattr(obj, method, wrapped)

  def figures(self) -> dict[str, dict[str, float]]:
    out = {}
    for name, rows in self.calls.items():
      rows = rows[self.skip:] or rows
      out[name] = {k: max(r[k] for r in rows) for k in rows[0] if k != "host_peak_is_phase"}
      out[name]["host_peak_is_phase"] = all(r["host_peak_is_phase"] for r in rows)
    return out


def peaks() -> dict[str, float]:
  """The process's memory peaks so far in GiB, as a run logs them each step: the host's peak
  RSS and, where the backend reports one, the largest device peak."""
  out = {"memory/host_peak_gb": host_peak_rss() / GIB}
  device = device_peak()
  if device is not None:
    out["memory/device_peak_gb"] = device / GIB
  return out

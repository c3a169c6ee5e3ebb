"""How long each role's devices had work: the sampler's and the trainer's idle fractions.

A role is busy from the moment work is dispatched to it until that work's outputs are ready;
a watcher thread per dispatch waits on the outputs (jax.block_until_ready releases the
interpreter) and records when they are. A step's idle fraction of a role is the part of the
step's wall time [t0, t1] that no such span covers (a span still open counts until t1).

What that measures depends on the layout. Split roles (the sampler's and trainer's own
devices): the time each group of chips had nothing queued, up to host latency. Colocated (one
set of devices runs both in dispatch order): a decode queued behind an update counts as the
sampler's, so the two roles' busy times overlap and neither is the devices' idle time.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import jax

ROLES = ("sampler", "trainer")


class Busy:
  """Per role, the spans [dispatched, ready] of its work."""

  def __init__(self, clock: Callable[[], float] = time.time):
    self.clock = clock
    self.spans: dict[str, list[list[float | None]]] = {r: [] for r in ROLES}
    self._lock = threading.Lock()

  def track(self, role: str, outputs: Any, start: float | None = None) -> None:
    """Work was dispatched to `role` (now, or at `start`: a call that blocked on part of it
    before returning); it is done when `outputs` are ready."""
    span: list[float | None] = [self.clock() if start is None else start, None]
    with self._lock:
      self.spans[role].append(span)

    def watch():
      try:
        jax.block_until_ready(outputs)
      except Exception:  # noqa: BLE001  (deleted or donated buffers: done by then)
        pass
      span[1] = self.clock()

    threading.Thread(target=watch, daemon=True, name=f"busy-{role}").start()

  def add(self, role: str, start: float, end: float | None) -> None:
    """A span known already (tests; work timed elsewhere)."""
    with self._lock:
      self.spans[role].append([start, end])

  def idle(self, role: str, t0: float, t1: float) -> float:
    """The fraction of [t0, t1] with none of `role`'s work in flight; spans ended before t0
    are dropped (windows come in order)."""
    if not t1 > t0:
      return 0.0
    with self._lock:
      spans = [s for s in self.spans[role] if s[1] is None or s[1] >= t0]
      self.spans[role] = spans
      cut = sorted((max(s[0], t0), min(t1 if s[1] is None else s[1], t1)) for s in spans)
    covered, end = 0.0, t0
    for a, b in cut:
      a = max(a, end)
      if b > a:
        covered, end = covered + b - a, b
    return max(0.0, 1.0 - covered / (t1 - t0))

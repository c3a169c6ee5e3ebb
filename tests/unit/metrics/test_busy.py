"""rlscale/metrics/busy.py: the part of a step's wall time with none of a role's work in
flight."""

import threading
import time

import jax.numpy as jnp
import pytest

from rlscale.metrics import busy


def test_idle_is_the_window_less_the_union_of_its_spans():
  b = busy.Busy()
  b.add("sampler", 0.0, 4.0)  # [0, 4] and [2, 6] overlap: [0, 6] covered
  b.add("sampler", 2.0, 6.0)
  b.add("sampler", 8.0, 9.0)
  b.add("sampler", 12.0, 20.0)  # after the window: not in it
  assert b.idle("sampler", 0.0, 10.0) == pytest.approx(1 - 7 / 10)
  assert b.idle("trainer", 0.0, 10.0) == 1.0  # nothing dispatched to it


def test_a_span_still_open_counts_until_the_window_ends_and_old_spans_are_dropped():
  b = busy.Busy()
  b.add("trainer", 1.0, 2.0)
  b.add("trainer", 5.0, None)  # dispatched at 5, not ready yet
  assert b.idle("trainer", 4.0, 10.0) == pytest.approx(1 / 6)
  assert len(b.spans["trainer"]) == 1  # [1, 2] ended before the window
  assert b.idle("trainer", 10.0, 10.0) == 0.0  # an empty window


def test_a_tracked_computation_is_busy_until_its_outputs_are_ready():
  gate = threading.Event()
  clock = iter(range(100)).__next__
  b = busy.Busy(clock=lambda: float(clock()))

  class Slow:  # block_until_ready waits for the gate: the work ends when it opens
    def block_until_ready(self):
      gate.wait(5)
      return self

  b.track("sampler", Slow())  # dispatched at t = 0
  time.sleep(0.05)
  assert b.spans["sampler"][0][1] is None  # not ready: open
  gate.set()
  for _ in range(100):
    if b.spans["sampler"][0][1] is not None:
      break
    time.sleep(0.01)
  assert b.spans["sampler"][0] == [0.0, 1.0]
  b.track("trainer", {"loss": jnp.ones(3) * 2})  # real arrays: ready at once
  for _ in range(100):
    if b.spans["trainer"][0][1] is not None:
      break
    time.sleep(0.01)
  assert b.spans["trainer"][0][1] is not None


def test_work_that_began_before_its_outputs_were_handed_over_is_busy_from_then():
  b = busy.Busy(clock=lambda: 10.0)
  b.track("trainer", {"x": jnp.ones(2)}, start=4.0)  # a call that blocked from t = 4
  for _ in range(100):
    if b.spans["trainer"][0][1] is not None:
      break
    time.sleep(0.01)
  assert b.spans["trainer"][0] == [4.0, 10.0]

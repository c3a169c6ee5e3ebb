"""Console logging: our INFO lines, and only warnings from chatty libraries."""

from __future__ import annotations

import logging as py_logging
import sys

from absl import logging

from rlscale.checkpoints import storage

_QUIET = ("/orbax/", "/jax/_src/xla_bridge.py", "/tensorstore/")


# A save the disk refuses: orbax logs the failure of each of its threads with its traceback
# (hundreds of lines of tensorstore specs); the failure reaches the checkpointer, which names
# it in one line (rlscale/checkpoints/checkpointer.py: StorageError).


class _LibraryFilter(py_logging.Filter):
  def filter(self, record: py_logging.LogRecord) -> bool:
    if (("/orbax/" in record.pathname or record.name == "asyncio")
        and record.levelno >= py_logging.ERROR):
      text = str(record.msg) + (str(record.exc_info[1]) if record.exc_info else "")
      if storage.TEXT.search(text) or "thread" in str(record.msg) and record.exc_info:
        return False  # a failed save: reported by the checkpointer, once
      if "NOT_FOUND" in text and ".orbax-checkpoint-tmp" in text:
        return False  # a write of that save into its partial folder, removed since
    return record.levelno >= py_logging.WARNING or not any(q in record.pathname for q in _QUIET)


def _late_callback(value) -> bool:
  return isinstance(value, RuntimeError) and str(value) == "Event loop is closed"


def _orbax_write_at_exit(unraisable) -> bool:
  """A failed save's write that never finished, finalized as the process exits (its import of
  humanize fails then): an orbax coroutine."""
  code = getattr(unraisable.object, "cr_code", None)
  return (isinstance(unraisable.exc_value, ImportError)
          and "shutting down" in str(unraisable.exc_value)
          and "/orbax/" in getattr(code, "co_filename", ""))


def _quiet_unraisable(hook):
  """tensorstore completes a failed save's futures after orbax closed their event loop; each
  reports a traceback ("Event loop is closed") as unraisable; a write of that save still
  pending when the process exits reports one too. Those alone are dropped."""
  def unraisablehook(unraisable):
    if not (_late_callback(unraisable.exc_value) or _orbax_write_at_exit(unraisable)):
      hook(unraisable)
  unraisablehook.quiet = True
  return unraisablehook


def quiet_libraries() -> None:
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _LibraryFilter) for f in handler.filters):
    handler.addFilter(_LibraryFilter())
  if not getattr(sys.unraisablehook, "quiet", False):
    sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)

"""Console logging: our INFO lines, and only warnings from chatty libraries."""

from __future__ import annotations

import logging as py_logging

from absl import logging

_QUIET = ("/orbax/", "/jax/_src/xla_bridge.py", "/tensorstore/")


class _LibraryFilter(py_logging.Filter):
  def filter(self, record: py_logging.LogRecord) -> bool:
    return record.levelno >= py_logging.WARNING or not any(q in record.pathname for q in _QUIET)


def quiet_libraries() -> None:
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _LibraryFilter) for f in handler.filters):
    handler.addFilter(_LibraryFilter())

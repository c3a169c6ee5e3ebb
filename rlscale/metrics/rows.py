"""Reading a run's metrics.jsonl: one JSON object per line, a line cut by a crash skipped.

No JAX here: the sweep runner, the analysis and the metrics writer's resume read rows alike.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator


def iter_rows(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """(line, row) of every whole line of `path`; nothing when it does not exist."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    for line in f:
      try:
        yield line, json.loads(line)
      except json.JSONDecodeError:
        continue  # a line cut by a crash


def read_rows(run_dir: str) -> list[dict[str, Any]]:
  """The rows of `run_dir`/metrics.jsonl ([] before its first row)."""
  return [row for _, row in iter_rows(os.path.join(run_dir, "metrics.jsonl"))]

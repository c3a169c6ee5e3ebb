"""Reading run directories: config.json, metrics.jsonl, summary.json."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from rlscale.config import defaults
from rlscale.metrics.rows import read_rows
from rlscale.sweep.manifest import run_done


@dataclasses.dataclass
class Run:
  path: str
  config: dict[str, Any]
  rows: list[dict[str, Any]]  # metrics.jsonl, one per step (step 0: the base policy's eval)
  summary: dict[str, Any]

  @property
  def name(self) -> str:
    return os.path.basename(os.path.normpath(self.path))

  @property
  def plan(self):
    """The run's batch plan, from its config.json by the code the run used (rlscale/plan/batch.py)."""
    from rlscale.plan import batch
    return batch.plan(self.config)

  @property
  def responses_per_step(self) -> int:
    return self.plan.responses

  @property
  def batch(self) -> int:
    """B: responses per optimizer step, the batch of every comparison (DESIGN.md)."""
    return self.plan.batch

  def optimizer_steps(self, responses: int) -> float:
    """The actor's optimizer steps taken by the time `responses` were seen."""
    return responses / self.plan.responses * self.plan.main.optimizer_steps

  def curve(self, metric: str) -> list[tuple[int, float]]:
    """(responses_seen, value) at every step that logged `metric`."""
    return [(r["responses_seen"], float(r[metric])) for r in self.rows
            if isinstance(r.get(metric), (int, float))]

  def last(self, metric: str):
    values = [r[metric] for r in self.rows if metric in r]
    return values[-1] if values else None

  def mean(self, metric: str, skip: int = 1):
    values = [r[metric] for r in self.rows[skip:] if isinstance(r.get(metric), (int, float))]
    return sum(values) / len(values) if values else None


def load(path: str) -> Run:
  def read(name):
    p = os.path.join(path, name)
    if not os.path.exists(p):
      return {}
    with open(p) as f:
      return json.load(f)
  # A config.json written before a field existed: that field at the value the run used.
  return Run(path, defaults.fill_json(read("config.json")), read_rows(path),
             read("summary.json"))


def expand(paths: list[str], only: str | None = None) -> list[str]:
  """Run directories: a sweep directory (with sweep.json) stands for its points whose run
  directory holds summary.json (the run directory decides, not the status the manifest
  recorded), in the manifest's order; `only` keeps the runs whose directory name matches this
  regex."""
  out = []
  for path in paths:
    manifest = os.path.join(path, "sweep.json")
    if os.path.exists(manifest):
      with open(manifest) as f:
        points = json.load(f)["points"]
      out += [os.path.join(path, p["name"]) for p in points
              if run_done(os.path.join(path, p["name"]))]
    else:
      out.append(path)
  if only:
    pattern = re.compile(only)
    out = [p for p in out if pattern.search(os.path.basename(os.path.normpath(p)))]
  return out

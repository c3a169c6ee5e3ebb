"""Reading run directories: config.json, metrics.jsonl, summary.json.

A run has two sample axes: the responses it *generated*
(`responses_seen`, the sample cost) and the responses it *trained* on (`responses_trained`:
with dynamic sampling, rollout.dynamic_sampling, groups whose rewards are all equal are dropped
and the step refilled, so a step generates more than it trains on). Every curve, crossing and
rate against responses reads its axis through `responses` below, named by one of AXES.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

import numpy as np

from rlscale.config import migrate
from rlscale.sweep.manifest import run_done

AXES = {"generated": "responses_seen", "trained": "responses_trained"}  # axis -> column
GENERATED = "generated"


def axis_label(x: str) -> str:
  """'responses generated' or 'responses trained': what a figure's x axis or a table's
  responses count."""
  return f"responses {x}"


def responses(row: dict[str, Any], x: str = GENERATED) -> float | None:
  """The row's cumulative responses on axis `x` (AXES); None when it logged none. A run from
  before `responses_trained` existed trained on every response it generated."""
  v = row.get(AXES[x])
  if x == "trained" and not isinstance(v, (int, float)):
    v = row.get(AXES[GENERATED])
  return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


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
    """B: responses per optimizer step, the batch of every comparison."""
    return self.plan.batch

  @property
  def dynamic_sampling(self) -> bool:
    """rollout.dynamic_sampling (filled in at load: False before it existed; an SFT run has no
    rollout section)."""
    return bool(self.config.get("rollout", {}).get("dynamic_sampling"))

  def steps_at(self, at: float, x: str = GENERATED) -> float:
    """RL steps taken by the time `at` responses on axis `x` were reached: at / responses per
    step without dynamic sampling (every step generates and trains on plan.responses), else
    interpolated between the logged steps (a step generates as many rounds as it needs)."""
    if not self.dynamic_sampling:
      return at / self.plan.responses
    pts = {}
    for r in self.rows:
      v = responses(r, x)
      if v is not None and isinstance(r.get("step"), (int, float)):
        pts[float(v)] = float(r["step"])  # a resumed run's repeated step: the last one
    if len(pts) < 2:
      return at / self.plan.responses
    xs = sorted(pts)
    return float(np.interp(at, xs, [pts[v] for v in xs]))

  def optimizer_steps(self, at: float, x: str = GENERATED) -> float:
    """The actor's optimizer steps taken by the time `at` responses on axis `x` were reached."""
    return self.steps_at(at, x) * self.plan.main.optimizer_steps

  def curve(self, metric: str, x: str = GENERATED) -> list[tuple[float, float]]:
    """(responses on axis `x`, value) at every step that logged `metric`."""
    out = []
    for r in self.rows:
      v = responses(r, x)
      if v is not None and isinstance(r.get(metric), (int, float)):
        out.append((v, float(r[metric])))
    return out

  def step_responses(self, x: str = GENERATED) -> dict[int, float]:
    """Step -> the responses on axis `x` that step added: plan.responses without dynamic
    sampling, else the difference from the step before (plan.responses where the rows do not
    give it)."""
    by_step = {}
    for r in self.rows:
      if isinstance(r.get("step"), (int, float)):
        by_step[int(r["step"])] = responses(r, x)
    per_step = self.plan.responses  # the plan is built anew at each access
    if not self.dynamic_sampling:
      return {step: per_step for step in by_step}
    out = {}
    for step, v in by_step.items():
      prev = by_step.get(step - 1)
      d = v - prev if v is not None and prev is not None else None
      out[step] = d if d is not None and d >= 0 else per_step
    return out

  def last(self, metric: str):
    values = [r[metric] for r in self.rows if metric in r]
    return values[-1] if values else None

  def mean(self, metric: str, skip: int = 1):
    values = [r[metric] for r in self.rows[skip:] if isinstance(r.get(metric), (int, float))]
    return sum(values) / len(values) if values else None


def _number(v):
  """Metrics hold "inf"/"nan" as strings (JSON has no infinity)."""
  if isinstance(v, str) and v.lower() in ("inf", "-inf", "nan", "infinity", "-infinity"):
    return float(v)
  return v


def read(path: str) -> tuple[Run | None, list[str]]:
  """The run at `path` and what was wrong reading it: the one reader of a run directory (the
  report, the study, compare_runs, the probe, the advisor and the throughput calibration).
  None, with the reason, where `path` is no run directory (missing, not a directory, no
  readable config.json). A config.json written before a field existed gets that field at the
  value the run used; metrics.jsonl's lines that do not parse (a line cut by a kill) are
  skipped and counted; "inf" and "nan" in it are numbers again."""
  warnings = []

  def read_json(name):
    p = os.path.join(path, name)
    if not os.path.exists(p):
      return {}
    try:
      with open(p) as f:
        return json.load(f)
    except (json.JSONDecodeError, OSError) as e:
      warnings.append(f"{name} unreadable ({e.__class__.__name__})")
      return {}
  if not os.path.isdir(path):
    return None, [f"{path}: not a run directory ("
                  f"{'not a directory' if os.path.exists(path) else 'it does not exist'})"]
  config = read_json("config.json")
  if not config:
    return None, warnings + [f"{path}: no config.json (not a run directory)"]
  rows, bad = [], 0
  p = os.path.join(path, "metrics.jsonl")
  if os.path.exists(p):
    with open(p) as f:
      for line in f:
        try:
          row = json.loads(line)
        except json.JSONDecodeError:
          bad += 1
          continue
        if isinstance(row, dict):
          rows.append({k: _number(v) for k, v in row.items()})
        else:
          bad += 1
  if bad:
    warnings.append(f"metrics.jsonl: {bad} malformed line(s) skipped")
  return Run(path, migrate.migrate(config), rows, read_json("summary.json")), warnings


def load(path: str) -> Run:
  """`read`'s run; a folder that is none reads as an empty run (no config, rows or summary)."""
  run, _ = read(path)
  return run if run is not None else Run(path, {}, [], {})


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

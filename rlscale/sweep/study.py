"""A study: named sweeps run in order, a later one using what an earlier one chose.

A study file declares `stages(arg=None) -> [Stage, ...]`. Each stage is one sweep of an
experiment config, run in `<study dir>/<stage name>` by the local launcher. A stage may
*choose* the value of one of its override keys (the learning rate at the reference batch,
say) and a later stage's config names it as `{key}`:

    Stage("lr", "configs/grpo_x.py", "lr_tuning", choose="lr"),
    Stage("batch", "configs/grpo_x.py:lr={lr}", "batch_invariance"),

The choice is the value whose runs reach the config's target in the fewest responses (median
over seeds of summary.json's responses_to_target; a seed that never reaches it counts as
infinite), ties broken by the higher median final value of the target metric. It is recorded
with the table it came from in `<study dir>/study.json`, beside each stage's wall time.
Running the same command again continues: done points are skipped, as in any sweep.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from typing import Any

from absl import logging

from rlscale import config_files
from rlscale.batch import ConfigError
from rlscale.preemption import EXIT_REQUEUE

FILE = "study.json"


@dataclasses.dataclass(frozen=True)
class Stage:
  name: str  # its sweep directory inside the study's
  config: str  # experiment config[:arg]; `{key}` is replaced by an earlier stage's choice
  sweep: str  # the name of one of the config's sweeps()
  choose: str | None = None  # an override key of this sweep whose best value later stages use


def declared(study: str) -> list[Stage]:
  """The stages of a study file (`configs/studies/cpu.py[:arg]`), checked."""
  import importlib.util
  try:
    path, arg = config_files.find(study)
  except FileNotFoundError as e:
    raise ConfigError(f"--study={study}: {e}") from e
  spec = importlib.util.spec_from_file_location("rlscale_study", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  fn = getattr(module, "stages", None)
  if not callable(fn):
    raise ConfigError(f"--study={study}: the file declares no stages(arg=None) function")
  stages = list(fn(arg or None))
  names = [s.name for s in stages]
  if not stages or not all(isinstance(s, Stage) for s in stages):
    raise ConfigError(f"--study={study}: stages() must return a non-empty list of Stage")
  if len(set(names)) != len(names):
    raise ConfigError(f"--study={study}: two stages share a name in {names}")
  known: set[str] = set()
  for s in stages:
    missing = [k for k in _placeholders(s.config) if k not in known]
    if missing:
      raise ConfigError(f"stage {s.name!r}: its config {s.config!r} uses {missing}, which no "
                        "earlier stage chooses")
    if s.choose:
      known.add(s.choose)
  return stages


def _placeholders(text: str) -> list[str]:
  import string
  return [f for _, f, _, _ in string.Formatter().parse(text) if f]


def choose(runs: list[dict[str, Any]], key: str) -> tuple[Any, list[dict[str, Any]]]:
  """(best value of `key`, the table it was chosen from) over `runs`: dicts with the point's
  overrides, `responses_to_target` (None: not reached) and `final` (the metric at the end)."""
  by_value: dict[str, list[dict]] = {}
  for r in runs:
    by_value.setdefault(json.dumps(r["overrides"][key]), []).append(r)
  table = []
  for text, group in by_value.items():
    rtt = [r["responses_to_target"] if r["responses_to_target"] is not None else math.inf
           for r in group]
    finals = [r["final"] for r in group if r["final"] is not None]
    table.append({key: json.loads(text), "seeds": len(group),
                  "median_responses_to_target": statistics.median(rtt),
                  "median_final": statistics.median(finals) if finals else None})
  if not table:
    raise ConfigError(f"no finished run to choose {key!r} from")
  best = min(table, key=lambda t: (t["median_responses_to_target"],
                                   -(t["median_final"] if t["median_final"] is not None
                                     else -math.inf)))
  for t in table:
    if math.isinf(t["median_responses_to_target"]):
      t["median_responses_to_target"] = None  # JSON has no infinity
  return best[key], table


def stage_results(sweep_dir: str) -> list[dict[str, Any]]:
  """The done points of a stage: overrides, responses_to_target and the target's final value."""
  from rlscale.sweep import manifest as mf
  m = mf.load(sweep_dir)
  out = []
  for e in m.points if m else []:
    path = os.path.join(e.run_dir, "summary.json")
    if e.status != mf.DONE or not os.path.exists(path):
      continue
    with open(path) as f:
      s = json.load(f)
    metric = s.get("target", {}).get("metric")
    out.append({"name": e.name, "overrides": e.overrides,
                "responses_to_target": s.get("responses_to_target"),
                "final": s.get(metric) if metric else None})
  return out


def _format(value) -> str:
  from rlscale.sweep.points import format_value
  return format_value(value)


class StudyRunner:
  """Runs the stages of a study in `study_dir` with the local launcher, `parallel` at a time."""

  def __init__(self, study: str, study_dir: str, parallel: int = 1,
               command: list[str] | None = None):
    self.study, self.dir, self.parallel, self.command = study, study_dir, parallel, command
    self.stages = declared(study)
    self.record: dict[str, Any] = {"study": study, "stages": {}, "chosen": {}}
    path = os.path.join(study_dir, FILE)
    if os.path.exists(path):
      with open(path) as f:
        old = json.load(f)
      if old.get("study") != study:
        raise ConfigError(f"{study_dir} holds study {old.get('study')!r}, not {study!r}; use "
                          "another --workdir")
      self.record["stages"] = old.get("stages", {})

  def save(self) -> None:
    os.makedirs(self.dir, exist_ok=True)
    tmp = os.path.join(self.dir, FILE + ".tmp")
    with open(tmp, "w") as f:
      json.dump(self.record, f, indent=1)
      f.write("\n")
    os.replace(tmp, os.path.join(self.dir, FILE))

  def config_of(self, stage: Stage) -> str:
    values = {k: _format(v["value"]) for k, v in self.record["chosen"].items()}
    return stage.config.format(**values)

  def run(self) -> int:
    """0: every stage done; 1: some point failed (later stages still ran where they could);
    75: stopped by a signal (the runs saved; run again to continue)."""
    status = 0
    for stage in self.stages:
      rc = self.run_stage(stage)
      if rc == EXIT_REQUEUE:
        return rc
      status = status or rc
      if stage.choose:
        if not self.choose(stage):
          return 1
    return status

  def run_stage(self, stage: Stage) -> int:
    from rlscale.sweep import manifest as mf
    from rlscale.sweep import points
    from rlscale.sweep.local import LocalLauncher
    config, sweep_dir = self.config_of(stage), os.path.join(self.dir, stage.name)
    pts = points.points(config, stage.sweep, sweep_dir)
    m = mf.open_sweep(sweep_dir, stage.sweep, config, "local", pts)
    runner = LocalLauncher(config, m, pts, parallel=self.parallel, command=self.command)
    m.save()
    logging.info("study %s: stage %s, sweep %s of %s, %d points (%d done)", self.study,
                 stage.name, stage.sweep, config, len(pts), m.counts()[mf.DONE])
    t0 = time.time()
    counts = runner.run()
    rec = self.record["stages"].setdefault(stage.name, {"wall_s": 0.0})
    rec.update(config=config, sweep=stage.sweep, counts=counts)
    rec["wall_s"] = round(rec["wall_s"] + time.time() - t0, 1)  # over every launch
    self.save()
    if counts[mf.FAILED]:
      return 1
    return EXIT_REQUEUE if counts[mf.PREEMPTED] or counts[mf.PENDING] else 0

  def choose(self, stage: Stage) -> bool:
    results = stage_results(os.path.join(self.dir, stage.name))
    if not results:
      logging.error("study: stage %s has no finished run to choose %s from; the later stages "
                    "need it", stage.name, stage.choose)
      return False
    value, table = choose(results, stage.choose)
    self.record["chosen"][stage.choose] = {"value": value, "stage": stage.name, "table": table}
    self.save()
    logging.info("study: stage %s chose %s=%s (fewest responses to target; table in %s)",
                 stage.name, stage.choose, value, os.path.join(self.dir, FILE))
    return True

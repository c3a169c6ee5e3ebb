"""A study: named sweeps run in order, a later one using what an earlier one chose.

A study file declares `stages(arg=None) -> [Stage, ...]`. Each stage is one sweep of an
experiment config, run in `<study dir>/<stage name>` by the local launcher. A stage may
*choose* the value of one of its override keys (the learning rate, say), once for the whole
stage or separately for each value of its `per` keys (each batch size):

    Stage("tune", "configs/grpo_x.py", "lr_scan", choose="lr", per=("p",), extend=2.0),
    Stage("confirm", "configs/grpo_x.py", "confirm"),   # points with lr="{lr}" or "{lr:p=2}"

A later stage uses a choice in two ways: `{key}` in its config argument (a stage-wide choice),
or an override value "{key}" (the choice of the point's own group, e.g. its p) or
"{key:p=2}" (the choice of the group p=2, e.g. the reference batch's). Two points that resolve
to the same overrides are run once.

The choice is the value whose *slowest* seed reaches the study's target first (the first
crossing of each run's evaluations, rlscale/metrics/crossing.py; a seed that never reaches it
counts as infinite), then the lower median, then the higher final value, among the stable
values: those whose median final value is within `band` of the best one's and none of whose
seeds fell more than `band` below the target after reaching it. Chosen by its median, a rate at
the edge of stability wins on three seeds and collapses on fresh ones (the chain-sum study:
P = 8 at 4e-4, 932 responses on the scan's seeds, 2 of 5 fresh seeds never reached the target);
chosen by its slowest seed, the rate that reaches the target reliably wins. With `extend`, a choice at the edge of the values its group
tried is not final: the stage runs the next value beyond that edge (x or / `extend`, the same
seeds) and chooses again, up to `max_extend` times per group, so the chosen value is inside its
scan.

The study's target is the config's (`target.value`), unless a stage sets `target_fraction`:
then the target is the base policy's value plus that fraction of the gain to the plateau, both
measured on the stage's runs (the median first evaluation, and the best median final value over
its groups and values), rounded to 0.01. A study then asks the same question of a base that
learns to 0.6 on one machine type and to 0.4 on another.

Everything is recorded in `<study dir>/study.json` (targets, choices with the tables they came
from, the values each stage added, wall times). Running the same command again continues: done
points are skipped, as in any sweep.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
import time
from typing import Any

from absl import logging

from rlscale.config import files as config_files
from rlscale.metrics import crossing
from rlscale.metrics.rows import read_rows
from rlscale.config.errors import ConfigError
from rlscale.trainer.preemption import EXIT_REQUEUE

FILE = "study.json"
_REF = re.compile(r"^\{([\w.]+)(?::([^{}]*))?\}$")  # "{lr}" or "{lr:p=2}" as an override value


@dataclasses.dataclass(frozen=True)
class Stage:
  name: str  # its sweep directory inside the study's
  config: str  # experiment config[:arg]; `{key}` is replaced by an earlier stage's choice
  sweep: str  # the name of one of the config's sweeps()
  choose: str | None = None  # an override key of this sweep whose best value later stages use
  per: tuple[str, ...] = ()  # choose separately for each value of these override keys
  extend: float = 0.0  # > 1: run the next value beyond a chosen edge of the scan (x or /)
  max_extend: int = 2  # at most this many extensions per group
  band: float = 0.05  # a value is eligible when its median final is within this of the best
  target_fraction: float | None = None  # set the study's target from this stage's runs
  vectorize: str = ""  # 'seed' | 'lanes': points run side by side (launch/sweep.py --vectorize)


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
    if s.extend and not s.extend > 1:
      raise ConfigError(f"stage {s.name!r}: extend={s.extend} must be > 1 (a factor) or 0")
    if s.target_fraction is not None and not 0 < s.target_fraction < 1:
      raise ConfigError(f"stage {s.name!r}: target_fraction={s.target_fraction} must lie in "
                        "(0, 1)")
    if s.choose:
      known.add(s.choose)
  return stages


def _placeholders(text: str) -> list[str]:
  import string
  return [f for _, f, _, _ in string.Formatter().parse(text) if f]


def group_of(overrides: dict[str, Any], per: tuple[str, ...] | list[str]) -> str:
  """The group label of a point: `p=2` (its `per` values), "" for a stage-wide choice."""
  return ",".join(f"{k}={_format(overrides.get(k))}" for k in per)


def choose(runs: list[dict[str, Any]], key: str, band: float = math.inf
           ) -> tuple[Any, list[dict[str, Any]]]:
  """(best value of `key`, the table it was chosen from) over `runs`: dicts with the point's
  overrides, `responses_to_target` (inf or None: not reached), `final` (the metric at the end)
  and optionally `drop` (how far the run fell below the target after reaching it). The rule:
  module docstring."""
  by_value: dict[str, list[dict]] = {}
  for r in runs:
    by_value.setdefault(json.dumps(r["overrides"][key]), []).append(r)
  table = []
  for text, group in by_value.items():
    rtt = [math.inf if r["responses_to_target"] is None else r["responses_to_target"]
           for r in group]
    finals = [r["final"] for r in group if r["final"] is not None]
    drops = [r["drop"] for r in group if r.get("drop") is not None]
    table.append({key: json.loads(text), "seeds": len(group),
                  "median_responses_to_target": statistics.median(rtt),
                  "worst_responses_to_target": max(rtt),
                  "median_final": statistics.median(finals) if finals else None,
                  "max_drop": max(drops) if drops else None})
  if not table:
    raise ConfigError(f"no finished run to choose {key!r} from")
  finals = [t["median_final"] for t in table if t["median_final"] is not None]
  best_final = max(finals) if finals else -math.inf
  for t in table:
    t["eligible"] = ((t["median_final"] is None or t["median_final"] >= best_final - band)
                     and (t["max_drop"] is None or t["max_drop"] <= band))
  best = min((t for t in table if t["eligible"]) or table,
             key=lambda t: (t["worst_responses_to_target"], t["median_responses_to_target"],
                            -(t["median_final"] if t["median_final"] is not None
                              else -math.inf)))
  for t in table:
    for k in ("median_responses_to_target", "worst_responses_to_target"):
      if math.isinf(t[k]):
        t[k] = None  # JSON has no infinity
  table.sort(key=lambda t: t[key])
  return best[key], table


def stage_results(sweep_dir: str, metric: str | None = None,
                  target: float | None = None) -> list[dict[str, Any]]:
  """The done points of a stage: overrides, responses to `target` of `metric` (default: each
  run's config target) by the first crossing, the base and final values of the metric."""
  from rlscale.sweep import manifest as mf
  m = mf.load(sweep_dir)
  out = []
  for e in m.points if m else []:
    cfg_path = os.path.join(e.run_dir, "config.json")
    if e.status != mf.DONE or not os.path.exists(cfg_path):
      continue
    with open(cfg_path) as f:
      cfg = json.load(f)
    t = cfg.get("target") or {}  # config.json of the run (an SFT run has no target)
    name = metric or t.get("metric")
    value = target if target is not None else t.get("value")
    rows = read_rows(e.run_dir)
    evals = [r[name] for r in rows if isinstance(r.get(name), (int, float))]
    rtt = crossing.run_crossing(rows, name, value) if name and value is not None else math.inf
    hit = next((i for i, v in enumerate(evals) if value is not None and v >= value), None)
    out.append({"name": e.name, "overrides": e.overrides, "metric": name,
                "responses_to_target": None if math.isinf(rtt) else rtt,
                "base": evals[0] if evals else None, "final": evals[-1] if evals else None,
                "drop": max(0.0, value - min(evals[hit:])) if hit is not None else None})
  return out


def _format(value) -> str:
  from rlscale.sweep.points import format_value
  return format_value(value)


def _round(value: float) -> float:
  return float(f"{value:.3g}")


class StudyRunner:
  """Runs the stages of a study in `study_dir` with the local launcher, `parallel` at a time."""

  def __init__(self, study: str, study_dir: str, parallel: int = 1,
               command: list[str] | None = None, vectorize: str | None = None,
               max_lanes: int = 10):
    """`vectorize` (None: each stage's own) and `max_lanes`: points side by side."""
    self.study, self.dir, self.parallel, self.command = study, study_dir, parallel, command
    self.vectorize, self.max_lanes = vectorize, max_lanes
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
    values = {k: _format(v["value"]) for k, v in self.record["chosen"].items() if "value" in v}
    return stage.config.format(**values)

  def _resolve(self, stage: Stage, overrides: dict[str, Any]) -> dict[str, Any] | None:
    """A declared point with its "{key}" / "{key:k=v}" values replaced by the choices; None
    when its group has no choice (every run of that group failed)."""
    out = {}
    for k, v in overrides.items():
      m = _REF.match(v) if isinstance(v, str) else None
      if m is None:
        out[k] = v
        continue
      key, group = m.group(1), m.group(2)
      chosen = self.record["chosen"].get(key)
      if chosen is None:
        raise ConfigError(f"stage {stage.name!r}: point {overrides} uses {v!r}, which no "
                          "earlier stage has chosen")
      if group is None:
        group = group_of(overrides, chosen["per"])
      values = chosen["values"]
      if group not in values:
        return None  # no finished run of that group to choose from (logged by points_of)
      out[k] = values[group]
    return out

  def points_of(self, stage: Stage, sweep_dir: str) -> list:
    """The stage's points: declared, choices filled in, duplicates merged, extensions added."""
    from rlscale.sweep import points
    config = self.config_of(stage)
    declared_pts = []
    for o in points.declared_points(config, stage.sweep):
      resolved = self._resolve(stage, o)
      if resolved is None:
        logging.warning("study: stage %s skips %s: no run of its group finished, so nothing "
                        "was chosen for it", stage.name, o)
        continue
      declared_pts.append(resolved)
    extra = self.record["stages"].get(stage.name, {}).get("extra", [])
    unique, seen = [], set()
    for o in declared_pts + extra:
      text = json.dumps(o, sort_keys=True)
      if text not in seen:
        seen.add(text)
        unique.append(o)
    return points.build(config, stage.sweep, unique, sweep_dir)

  def run(self) -> int:
    """0: every stage done; 1: some point failed (later stages still ran where they could);
    75: stopped by a signal (the runs saved; run again to continue)."""
    status = 0
    for stage in self.stages:
      while True:
        rc = self.run_stage(stage)
        if rc == EXIT_REQUEUE:
          return rc
        status = status or rc
        if stage.target_fraction is not None:
          self.set_target(stage)
        if not stage.choose:
          break
        more = self.choose(stage)
        if more is None:
          return 1
        if not more:
          break
    return status

  def run_stage(self, stage: Stage) -> int:
    from rlscale.sweep import manifest as mf
    from rlscale.sweep.local import LocalLauncher
    config, sweep_dir = self.config_of(stage), os.path.join(self.dir, stage.name)
    pts = self.points_of(stage, sweep_dir)
    m = mf.open_sweep(sweep_dir, stage.sweep, config, "local", pts)
    vectorize = stage.vectorize if self.vectorize is None else self.vectorize
    runner = LocalLauncher(config, m, pts, parallel=self.parallel, command=self.command,
                           vectorize=vectorize, max_lanes=self.max_lanes)
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

  def target(self) -> tuple[str | None, float | None]:
    t = self.record.get("target") or {}
    return t.get("metric"), t.get("value")

  def set_target(self, stage: Stage) -> None:
    """The study's target from `stage`'s runs: base + fraction x (plateau - base)."""
    results = stage_results(os.path.join(self.dir, stage.name))
    if not results:
      return
    metric = results[0]["metric"]
    base = statistics.median(r["base"] for r in results if r["base"] is not None)
    groups: dict[str, list[float]] = {}
    for r in results:
      if r["final"] is not None:
        key = json.dumps(r["overrides"].get(stage.choose)) + group_of(r["overrides"], stage.per)
        groups.setdefault(key, []).append(r["final"])
    plateau = max(statistics.median(v) for v in groups.values())
    value = round(base + stage.target_fraction * (plateau - base), 2)
    self.record["target"] = {"metric": metric, "value": value, "base": base,
                             "plateau": plateau, "fraction": stage.target_fraction,
                             "stage": stage.name}
    self.save()
    logging.info("study: target %s >= %.2f (base %.3f + %.2f x (plateau %.3f - base), from "
                 "stage %s)", metric, value, base, stage.target_fraction, plateau, stage.name)

  def choose(self, stage: Stage) -> bool | None:
    """Choose `stage.choose` per group; True when an edge choice added points to run first,
    None when there is nothing to choose from."""
    metric, value = self.target()
    results = stage_results(os.path.join(self.dir, stage.name), metric, value)
    if not results:
      logging.error("study: stage %s has no finished run to choose %s from; the later stages "
                    "need it", stage.name, stage.choose)
      return None
    groups: dict[str, list[dict]] = {}
    for r in results:
      groups.setdefault(group_of(r["overrides"], stage.per), []).append(r)
    rec = self.record["stages"].setdefault(stage.name, {"wall_s": 0.0})
    extra, extended = rec.setdefault("extra", []), rec.setdefault("extended", {})
    values, tables, more = {}, {}, False
    for group, runs in sorted(groups.items()):
      best, table = choose(runs, stage.choose, stage.band)
      values[group], tables[group] = best, table
      tried = sorted(t[stage.choose] for t in table)
      if not stage.extend or len(tried) < 2 or best not in (tried[0], tried[-1]):
        continue
      if extended.get(group, 0) >= stage.max_extend:
        logging.warning("study: stage %s, group %s: %s=%s is still the edge of its scan after "
                        "%d extensions", stage.name, group or "all", stage.choose, best,
                        stage.max_extend)
        continue
      # One step past the edge, from the inner neighbour (two steps from it) so that a grid of
      # rounded values stays on itself (1.41e-4 x sqrt(2) would round to 1.99e-4, not 2e-4).
      if best == tried[-1]:
        new = _round(tried[-2] * stage.extend ** 2)
      else:
        new = _round(tried[1] / stage.extend ** 2)
      for r in runs:
        if r["overrides"][stage.choose] == best:
          extra.append(dict(r["overrides"], **{stage.choose: new}))
      extended[group] = extended.get(group, 0) + 1
      more = True
      logging.info("study: stage %s, group %s: %s=%s is the edge of %s; running %s too",
                   stage.name, group or "all", stage.choose, best, tried, new)
    entry = {"stage": stage.name, "per": list(stage.per), "values": values, "tables": tables,
             "band": stage.band, "target": {"metric": metric, "value": value}}
    if not stage.per:
      entry["value"] = values[""]
    self.record["chosen"][stage.choose] = entry
    self.save()
    if not more:
      logging.info("study: stage %s chose %s = %s (table in %s)", stage.name, stage.choose,
                   values if stage.per else values[""], os.path.join(self.dir, FILE))
    return more

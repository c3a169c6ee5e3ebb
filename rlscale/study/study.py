"""A study: named sweeps run in order, a later one using what an earlier one chose.

A study file declares `stages(arg=None) -> [Stage, ...]`. Each stage is one sweep of an
experiment config, run in `<study dir>/<stage name>` by the local launcher. A stage may
*choose* the value of one of its override keys (the learning rate, say), once for the whole
stage or separately for each value of its `per` keys (each batch size):

    Stage("tune", "configs/grpo_x.py", "lr_scan", choose="lr", per=("p",), extend=2.0),
    Stage("confirm", "configs/grpo_x.py", "confirm"),   # points with lr="{lr}" or "{lr:p=2}"

A later stage uses a choice in two ways: `{key}` in its config argument (a stage-wide choice),
or an override value "{key}" (the choice of the point's own group, e.g. its p) or
"{key:p=2}" (the choice of the group p=2, e.g. the reference batch's), or "{key@-1:p=2}" /
"{key@+1:p=2}" (the value one step below / above that choice among the values its scan tried,
continued geometrically past an end: a later scan centred on an earlier one's choice). Two
points that resolve to the same overrides are run once.

The choice is made from the median responses to the study's target over the stage's seeds
(the first crossing of each run's evaluations, rlscale/metrics/crossing.py; a seed that never
reaches it counts as infinite), among the stable values: those whose median final value is
within `band` of the best one's and none of whose seeds fell more than `band` below the target
after reaching it. A parabola is fitted to log median against log value over the stable
values whose median reached the target, and the value nearest its minimum is chosen: every
rate's seeds inform the choice, not only the one's own three (on a synthetic surface with the
study's seed spread it finds the optimum in 99% of draws where the fewest median alone finds it
in 82-88%, tests/unit/study/test_study.py). Without a convex fit whose minimum lies inside the
values tried, the value with the fewest median responses is chosen, then the lower slowest
seed, then the higher final value. The
runner-up by the same rule is recorded too: "{lr#2}" in a later stage runs it, so that a
verdict can say whether it rests on which of two close rates was chosen. (An earlier rule, the
slowest seed, picked rates that were not the best on fresh seeds: on the chain-sum study the
rate it rejected at B = 32 needed 0.81x the chosen one's responses.) With `extend`, a choice
at the edge of the values its group tried is not final: the stage runs the next value beyond
that edge (x or / `extend`, the same seeds) and chooses again, up to `max_extend` times per
group, so the chosen value is inside its scan.

The study's target is the config's (`target.value`), unless a stage sets `target_fraction`:
then the target is the base policy's value plus that fraction of the gain its runs made, both
measured on the stage's runs (the median first evaluation, and the best median final value over
its groups and values), rounded to 0.01. A stage that runs only the reference batch at the
starting rate sets it before any rate is scanned, so the target does not depend on what the
scan finds; "{target}" in a later stage's override value is that number (a run's
target.value: evaluation in stages and the run's own crossing use it).

A stage whose points set "seed": "{seeds}" runs as many seeds as the power calculation asks
(rlscale/study/power.py): `seeds_from` names the scan stage whose seed spread of log responses
to target (pooled over its chosen and runner-up cells) it uses, for a true ratio `power_ratio`
to settle as broken with 80% probability, at least `min_seeds` and at most `max_seeds` (the
numbers, and the probabilities the seeds give, are recorded in study.json under "seeds").

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

import numpy as np
from absl import logging

from rlscale.config import files as config_files
from rlscale.metrics import crossing
from rlscale.metrics.rows import read_rows
from rlscale.config.errors import ConfigError
from rlscale.trainer.preemption import EXIT_REQUEUE

FILE = "study.json"
# "{lr}", "{lr#2}", "{lr:p=2}", "{lr@-1:p=2}" (the value one step below p=2's choice in its scan)
_REF = re.compile(r"^\{([\w.]+)(#2|@[+-]\d+)?(?::([^{}]*))?\}$")
SEEDS, TARGET = "{seeds}", "{target}"
FIRST_VERDICT_SEED = 100  # the power-sized seeds: 100, 101, ... (no scan uses them)


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
  seeds_from: str | None = None  # the scan stage whose seed spread sizes "{seeds}"
  min_seeds: int = 10
  max_seeds: int = 16
  power_ratio: float = 1.5  # the true ratio that must settle as broken with 80% probability
  tolerance: float = 0.2  # the verdict's: invariant while E(B) / E(B0) <= 1 + tolerance
  # Choose over every group at once by the joint fit of E(B, lr) (rlscale/study/lr_fit.py):
  # the rate nearest each batch's fitted optimum (the report reads it at the fitted optimum, the
  # fit's uncertainty carried), and "{lr#2}" the batch's own choice from its scan alone (the
  # same point where both agree). Where the fit is not identified, the groups choose one by
  # one with their runner-ups, as without.
  joint: bool = False


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
  module docstring; the table's `rank` is 1 for the choice, 2 for the runner-up."""
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
                  "reached": sum(math.isfinite(v) for v in rtt),
                  "median_final": statistics.median(finals) if finals else None,
                  "max_drop": max(drops) if drops else None})
  if not table:
    raise ConfigError(f"no finished run to choose {key!r} from")
  finals = [t["median_final"] for t in table if t["median_final"] is not None]
  best_final = max(finals) if finals else -math.inf
  for t in table:
    t["eligible"] = ((t["median_final"] is None or t["median_final"] >= best_final - band)
                     and (t["max_drop"] is None or t["max_drop"] <= band))
  vertex = _vertex(table, key)
  order = sorted(table, key=lambda t: (
      not t["eligible"],
      abs(math.log(t[key]) - vertex) if vertex is not None else 0.0,
      t["median_responses_to_target"], t["worst_responses_to_target"],
      -(t["median_final"] if t["median_final"] is not None else -math.inf)))
  for t in table:
    t["fit_minimum"] = None if vertex is None else round(math.exp(vertex), 12)
  for rank, t in enumerate(order, 1):
    t["rank"] = rank
  for t in table:
    for k in ("median_responses_to_target", "worst_responses_to_target"):
      if math.isinf(t[k]):
        t[k] = None  # JSON has no infinity
  table.sort(key=lambda t: t[key])
  return order[0][key], table


def _vertex(table: list[dict[str, Any]], key: str) -> float | None:
  """log of the value at the minimum of a parabola fitted (least squares) to log median
  responses to target against log value over the eligible values whose median reached it;
  None (the plain median rule) with fewer than 3 such values, a concave fit, or a minimum
  outside the values tried (the edge rule then extends the scan)."""
  pts = [(math.log(t[key]), math.log(t["median_responses_to_target"])) for t in table
         if t["eligible"] and isinstance(t[key], (int, float)) and t[key] > 0
         and math.isfinite(t["median_responses_to_target"])
         and t["median_responses_to_target"] > 0]
  if len(pts) < 3:
    return None
  x, y = np.array(pts).T
  a, b, _ = np.polyfit(x, y, 2)
  if not a > 0:
    return None
  v = float(-b / (2 * a))
  return v if x.min() <= v <= x.max() else None


def joint_choice(groups: dict[str, list[dict]], tables: dict[str, list[dict]], key: str,
                 reps: int = 500) -> dict[str, Any]:
  """The choice over every group by the joint fit of E(B, `key`) (rlscale/study/lr_fit.py):
  identified, why not, the fit, per group its batch, value, fitted optimum and the correction
  a (log value - optimum)^2 with the covariance of the corrections over redrawn scan seeds."""
  from rlscale.study import lr_fit
  batch = {}
  for group, runs in groups.items():
    sizes = {r.get("batch") for r in runs}
    if len(sizes) != 1 or None in sizes:
      return {"identified": False, "why": f"group {group or 'all'}: no single batch size"}
    batch[group] = float(sizes.pop())
  if len(set(batch.values())) != len(batch):
    return {"identified": False, "why": "two groups share a batch size"}
  runs = [{"B": batch[g], "lr": r["overrides"][key], "responses_to_target":
           r["responses_to_target"]} for g, rs in groups.items() for r in rs]
  values = lr_fit.cells(runs)
  eligible = {(batch[g], float(t[key])) for g, table in tables.items() for t in table
              if t["eligible"]}
  f, why = lr_fit.fit(values, eligible)
  if f is None:
    return {"identified": False, "why": why}
  grid = {batch[g]: sorted(float(t[key]) for t in table) for g, table in tables.items()}
  chosen = lr_fit.choose(f, grid)
  point, draws, failed = lr_fit.corrections(values, eligible, chosen, reps=reps)
  if failed > reps // 10 or len(draws) < 2:
    return {"identified": False, "why": f"the fit failed on {failed} of {reps} redraws of "
            "the scan's seeds"}
  order = sorted(chosen)
  cov = np.cov(draws, rowvar=False).reshape(len(order), len(order))
  by_group = {b: g for g, b in batch.items()}
  return {"identified": True, "why": "", "rule": "joint fit of E(B, lr)",
          "fit": {"a": f.a, "c1": f.c1, "c2": f.c2, "resid_sd": f.resid_sd,
                  "expected_sd": f.expected_sd, "points": f.points},
          "values": {by_group[b]: chosen[b] for b in order},
          "batches": {by_group[b]: b for b in order},
          "optimum": {by_group[b]: math.exp(f.vertex(b)) for b in order},
          "correction": {by_group[b]: point[b] for b in order},
          "order": [by_group[b] for b in order], "covariance": cov.tolist(),
          "redraws": len(draws), "failed": failed}


def with_joint(alone: dict[str, Any], joint: dict[str, Any]) -> tuple[dict, dict]:
  """(choices, second choices) when the joint fit chose: the joint fit's value per group, and
  beside it the group's own choice (its scan alone, `choose`) where that differs, so that the
  verdict runs both rates wherever the two readings of the scan disagree (the joint fit's
  one curvature can misplace an optimum whose E(lr) is lopsided), and one rate elsewhere."""
  return dict(joint), {g: alone.get(g, v) for g, v in joint.items()}


def runner_up(table: list[dict[str, Any]], key: str) -> Any:
  """The value ranked second in a `choose` table (the choice itself when it is alone)."""
  ranked = sorted(table, key=lambda t: t["rank"])
  return ranked[min(1, len(ranked) - 1)][key]


RULE = "median over the scan's seeds, parabola in log lr"  # the module docstring in full


def stage_results(sweep_dir: str, metric: str | None = None,
                  target: float | None = None) -> list[dict[str, Any]]:
  """The done points of a stage: overrides, responses to `target` of `metric` (default: each
  run's config target) by the first crossing, the base and final values of the metric (the
  final one over its last evaluations' rows: crossing.settled_final) and how far it fell below
  the target after reaching it beyond its evaluations' noise (crossing.drop_after)."""
  from rlscale.sweep import manifest as mf
  m = mf.load(sweep_dir)
  out = []
  for e in m.points if m else []:
    if e.status != mf.DONE or not os.path.exists(os.path.join(e.run_dir, "config.json")):
      continue
    cfg = config_files.run_config(e.run_dir)
    t = cfg.get("target") or {}  # config.json of the run (an SFT run has no target)
    name = metric or t.get("metric")
    value = target if target is not None else t.get("value")
    rows = read_rows(e.run_dir)
    scored = [r for r in rows if isinstance(r.get(name), (int, float))]
    evals = [r[name] for r in scored]
    counts = ([r["eval/rows"] for r in scored] if scored and all(
        isinstance(r.get("eval/rows"), (int, float)) for r in scored) else None)
    rtt = crossing.run_crossing(rows, name, value) if name and value is not None else math.inf
    rl = cfg.get("rl") or {}
    batch = (rl["num_prompts"] * rl["group_size"] // rl.get("num_minibatches", 1)
             if isinstance(rl.get("num_prompts"), int) and isinstance(rl.get("group_size"), int)
             else None)  # responses per optimizer step
    out.append({"name": e.name, "overrides": e.overrides, "metric": name, "batch": batch,
                "responses_to_target": None if math.isinf(rtt) else rtt,
                "base": evals[0] if evals else None,
                "final": crossing.settled_final(evals, counts) if evals else None,
                "drop": (crossing.drop_after(evals, value, counts)
                         if value is not None and evals else None)})
  return out


def _chosen_key(runner: "StudyRunner", chosen: dict) -> str:
  """The override key a recorded choice chose (older records: the key it is filed under)."""
  return chosen.get("key") or next(k for k, v in runner.record["chosen"].items() if v is chosen)


def _format(value) -> str:
  from rlscale.sweep.points import format_value
  return format_value(value)


def step_from(value: float, tried: list[float], steps: int) -> float:
  """The value `steps` places from `value` among the sorted values a scan `tried` ("{lr@+1}");
  past either end, the end's ratio to its neighbour continued (rounded as a scan's rates)."""
  grid = sorted(set(tried) | {value})
  i = grid.index(value) + steps
  if 0 <= i < len(grid):
    return grid[i]
  if len(grid) < 2:
    raise ConfigError(f"a step of {steps} from {value} needs a scan of at least two values; it "
                      f"tried {grid}")
  edge, inner = (grid[-1], grid[-2]) if i >= len(grid) else (grid[0], grid[1])
  past = i - (len(grid) - 1) if i >= len(grid) else -i
  # The ratio of two rounded rates (2e-4 / 1.41e-4 = 1.418) is a power of sqrt(2) off by the
  # rounding: snapped to it within 2%, so that the rates stay on the grid (1e-4 down: 5e-5).
  ratio = edge / inner
  snapped = 2 ** (round(2 * math.log2(ratio)) / 2)
  if abs(ratio / snapped - 1) < 0.02:
    ratio = snapped
  return _round(edge * ratio ** past)


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
    """A declared point with its "{key}" / "{key#2}" / "{key:k=v}" / "{target}" values
    replaced by the choices; None when its group has no choice (every run of that group
    failed)."""
    out = {}
    for k, v in overrides.items():
      if v == TARGET:
        if not self.record.get("target"):
          raise ConfigError(f"stage {stage.name!r}: point {overrides} uses {TARGET}, which no "
                            "earlier stage has set (a stage with target_fraction)")
        out[k] = self.record["target"]["value"]
        continue
      m = _REF.match(v) if isinstance(v, str) else None
      if m is None or v == SEEDS:
        out[k] = v
        continue
      key, mod, group = m.group(1), m.group(2) or "", m.group(3)
      chosen = self.record["chosen"].get(key)
      if chosen is None:
        raise ConfigError(f"stage {stage.name!r}: point {overrides} uses {v!r}, which no "
                          "earlier stage has chosen")
      if group is None:
        group = group_of(overrides, chosen["per"])
      values = chosen["runner_up" if mod == "#2" else "values"]
      if group not in values:
        return None  # no finished run of that group to choose from (logged by points_of)
      out[k] = values[group]
      if mod.startswith("@"):
        tried = [t[_chosen_key(self, chosen)] for t in chosen.get("tables", {}).get(group, [])]
        out[k] = step_from(values[group], tried, int(mod[1:]))
    return out

  def _expand_seeds(self, stage: Stage, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """A point with "seed": "{seeds}" as one point per power-sized seed."""
    if overrides.get("seed") != SEEDS:
      return [overrides]
    n = self.verdict_seeds(stage)
    return [dict(overrides, seed=FIRST_VERDICT_SEED + i) for i in range(n)]

  def verdict_seeds(self, stage: Stage) -> int:
    """Seeds per configuration of a "{seeds}" stage, from its scan's seed spread (recorded)."""
    from rlscale.study import power
    rec = self.record.setdefault("seeds", {})
    if stage.name in rec:
      return rec[stage.name]["n"]
    if not stage.seeds_from:
      raise ConfigError(f"stage {stage.name!r}: its points use {SEEDS} but it names no "
                        "seeds_from stage whose spread sizes them")
    metric, value = self.target()
    results = stage_results(os.path.join(self.dir, stage.seeds_from), metric, value)
    chosen = next((c for c in self.record["chosen"].values()
                   if c.get("stage") == stage.seeds_from), None)
    key = _chosen_key(self, chosen) if chosen else None
    cells: dict[str, list[float]] = {}
    for r in results:  # the chosen and runner-up cells: an unstable rate's spread is not theirs
      group = group_of(r["overrides"], chosen["per"]) if chosen else ""
      if chosen and r["overrides"].get(key) not in (chosen["values"].get(group),
                                                     chosen.get("runner_up", {}).get(group)):
        continue
      cells.setdefault(json.dumps(r["overrides"].get(key)) + group, []).append(
          math.inf if r["responses_to_target"] is None else r["responses_to_target"])
    sigma, dof = power.pooled_spread(cells.values())
    censored = sum(math.isinf(v) for c in cells.values() for v in c)
    if math.isnan(sigma):
      need = stage.max_seeds
      logging.warning("study: stage %s: no spread measured in %s (no cell with two crossing "
                      "seeds); running %d seeds", stage.name, stage.seeds_from, need)
    else:
      need = power.seeds_needed(sigma, stage.power_ratio, stage.tolerance)
    n = min(max(need, stage.min_seeds), stage.max_seeds)
    entry = {"n": n, "needed": need, "sigma": None if math.isnan(sigma) else round(sigma, 4),
             "dof": dof, "censored": censored, "from": stage.seeds_from,
             "ratio": stage.power_ratio, "tolerance": stage.tolerance,
             "min": stage.min_seeds, "max": stage.max_seeds}
    if not math.isnan(sigma):
      entry["p_broken"] = round(power.p_broken(stage.power_ratio, sigma, n,
                                               tolerance=stage.tolerance), 3)
      entry["p_invariant_at_1"] = round(power.p_invariant(1.0, sigma, n,
                                                          tolerance=stage.tolerance), 3)
    rec[stage.name] = entry
    self.save()
    logging.info("study: stage %s runs %d seeds per point (%d needed for a true ratio %.2g to "
                 "settle as broken at 80%%; spread %.3g of log responses over %d dof of %s)",
                 stage.name, n, need, stage.power_ratio, sigma, dof, stage.seeds_from)
    return n

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
      declared_pts += self._expand_seeds(stage, resolved)
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
    from rlscale.sweep import launchers
    config, sweep_dir = self.config_of(stage), os.path.join(self.dir, stage.name)
    pts = self.points_of(stage, sweep_dir)
    m = mf.open_sweep(sweep_dir, stage.sweep, config, "local", pts)
    vectorize = stage.vectorize if self.vectorize is None else self.vectorize
    runner = launchers.make("local", config, m, pts, self.parallel, self.command, vectorize,
                            self.max_lanes)
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
    values, second, tables, more = {}, {}, {}, False
    for group, runs in sorted(groups.items()):
      values[group], tables[group] = choose(runs, stage.choose, stage.band)
      second[group] = runner_up(tables[group], stage.choose)
    joint = joint_choice(groups, tables, stage.choose) if stage.joint else None
    if joint and joint["identified"]:
      values, second = with_joint(values, joint["values"])
    for group, runs in sorted(groups.items()):
      best, table = values[group], tables[group]
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
    seeds = sorted({r["overrides"].get("seed") for r in results} - {None})
    entry = {"stage": stage.name, "per": list(stage.per), "values": values,
             "runner_up": second, "tables": tables, "band": stage.band,
             "rule": RULE.replace("the scan's seeds", f"{len(seeds)} scan seeds"),
             "key": stage.choose,
             "target": {"metric": metric, "value": value}}
    if joint is not None:
      entry["joint"] = joint
      if joint["identified"]:
        entry["rule"] = f"joint fit of E(B, lr), {len(seeds)} scan seeds"
      if not joint["identified"]:
        logging.warning("study: stage %s: the joint fit of E(B, %s) is not identified (%s); "
                        "each group chose alone, its runner-up beside", stage.name,
                        stage.choose, joint["why"])
    if not stage.per:
      entry["value"] = values[""]
    self.record["chosen"][stage.choose] = entry
    self.save()
    if not more:
      logging.info("study: stage %s chose %s = %s (table in %s)", stage.name, stage.choose,
                   values if stage.per else values[""], os.path.join(self.dir, FILE))
    return more

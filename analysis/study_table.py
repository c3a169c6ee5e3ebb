"""Reading a study into pandas tables: one row per run, then one row per configuration.

A DIR is a sweep directory (sweep.json: every point, whatever its status), a study directory
(sweep directories as subdirectories, one per stage, and study.json), or a run directory
(config.json). Every point becomes a row of the runs table; a run that cannot be used (failed,
pending, unfinished, malformed) keeps its row with the reason in `problem`, so the report lists
it.

What the rows measure, every count of responses
on the study's sample axis (Options.x, analysis/runs.py AXES: responses generated, the sample
cost, or responses trained, those that entered an update):
- responses to target: the first crossing of the run's raw evaluations, interpolated
  (rlscale/metrics/crossing.py), less a PPO critic's warm-up responses (the actor did not train in
  them; stated beside); never smoothed over evaluations, so it does not depend on how often a
  run evaluates. `responses_to_target_incl_warmup` and `time_to_target_incl_warmup` count the
  warm-up (from the run's start): PPO against GRPO compares those;
- gradient clipping: the actor's optim.grad_clip, its median grad norm (logged before
  clipping) and the fraction of its optimizer steps clipped, up to the crossing: a clip that
  acts at some batches and not at others changes the update rule with B
  (clip_fraction_check);
- the run's learning rate is the actor's effective one (its base lr through its scaling
  rule), so a configuration is (kind, P, G, mini-batches, lr, ...) however its lr was set;
- the effective batch: the mean of `rollout/effective_batch` (informative responses per
  optimizer step of the actor) over the run's steps up to its crossing (all of them when it does
  not cross); a configuration's is the median over its seeds, NaN when its runs did not log it;
- B_simple at the crossing: the raw noise-scale estimates of the steps around the crossing
  (responses within [1/2, 3/2] of it), prompt-level (B in prompts, x G to responses) when
  the run measured it: the response-level estimate is biased low when the G responses of a
  group share a prompt (rlscale/rl/noise_scale.py). Each run keeps its mean |G|^2 and tr(Sigma)
  estimates; a report pools them over runs as a ratio of means (noise_scale's EMAs do so over
  steps), since a single run's |G|^2 estimate is often not positive.

A study directory's study.json says which stages chose a value (their runs tune; the verdict
uses the other stages' seeds), what they chose, and the study's target.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any

import numpy as np
import pandas as pd

from analysis import runs as runs_lib
from analysis.runs import GENERATED, Run, axis_label
from analysis import stats
from rlscale.sweep.manifest import run_done
from rlscale.metrics import crossing
from rlscale.rl import optim


class StudyError(ValueError):
  """Input that cannot make a report (no runs at all); the message is one line."""


@dataclasses.dataclass
class Options:
  metric: str | None = None  # None: the study's (study.json), else the runs' target metric
  target: float | None = None  # None: the study's target, else the runs' target value
  targets: list[float] | None = None  # the critical-batch fit's targets (None: 3 around it)
  tolerance: float = 0.2  # a batch needing at most (1 + tolerance) x the reference's responses
  band: float = 0.05  # ... whose curve is not below the reference's by more than this
  reps: int = 2000  # bootstrap reps of the intervals
  fit_reps: int = 500  # bootstrap reps of the fits (each a refit)
  reference_batch: int | None = None  # B0 (None: the runs' optim.reference_batch)
  min_steps: int = 10  # fewer optimizer steps to target: a transient, flagged
  seed: int = 0
  x: str = GENERATED  # the sample axis (analysis/runs.py AXES): "generated" or "trained"


@dataclasses.dataclass
class Point:
  name: str
  path: str
  stage: str  # the sweep directory's name in a study ("" for a lone run)
  status: str  # the manifest's status; "done" for a run directory without one
  error: str  # last line of the manifest's error


def _sweep_points(d: str, stage: str) -> list[Point]:
  with open(os.path.join(d, "sweep.json")) as f:
    manifest = json.load(f)
  out = []
  for p in manifest.get("points", []):
    # A copied sweep keeps its old absolute run_dir: the point's name beside sweep.json wins.
    path = os.path.join(d, p["name"])
    if not os.path.isdir(path) and p.get("run_dir"):
      path = p["run_dir"]
    err = [line for line in (p.get("error") or []) if str(line).strip()]
    status = _status(path, p.get("status", "unknown"))
    if status == INCOMPLETE:
      err = [f"{FILE_SAYS_DONE}, but {path} has no summary.json"]
    out.append(Point(p["name"], path, stage, status, str(err[-1]).strip() if err else ""))
  return out


INCOMPLETE = "incomplete"
FILE_SAYS_DONE = "sweep.json says done"


def _status(path: str, recorded: str) -> str:
  """The run directory decides: done when it holds summary.json (whatever the manifest
  recorded, e.g. a launcher killed before it wrote), incomplete when a manifest that says done
  is stale or hand-edited, else what the manifest recorded."""
  if run_done(path):
    return "done"
  return INCOMPLETE if recorded == "done" else recorded


def find_points(dirs: list[str]) -> list[Point]:
  """Every point under `dirs`: sweep manifests, run directories, or folders of either."""
  out = []
  for d in dirs:
    if not os.path.isdir(d):
      raise StudyError(f"{d}: not a directory")
    out += _walk(os.path.normpath(d), "", depth=0)
  return out


def _walk(d: str, stage: str, depth: int) -> list[Point]:
  if os.path.exists(os.path.join(d, "sweep.json")):
    return _sweep_points(d, stage or os.path.basename(d))
  if os.path.exists(os.path.join(d, "config.json")):
    done = run_done(d)
    return [Point(os.path.basename(d), d, stage, "done" if done else INCOMPLETE,
                  "" if done else f"{d} has no summary.json (still running, or stopped)")]
  if depth >= 2:
    return []
  out = []
  for sub in sorted(os.listdir(d)):
    if os.path.isdir(os.path.join(d, sub)):
      out += _walk(os.path.join(d, sub), sub if depth == 0 and stage == "" else stage,
                   depth + 1)
  return out


def read_record(dirs: list[str]) -> dict[str, Any]:
  """study.json of the first DIR that has one ({} when none does)."""
  for d in dirs:
    path = os.path.join(d, "study.json")
    if os.path.exists(path):
      try:
        with open(path) as f:
          return json.load(f)
      except (OSError, json.JSONDecodeError):
        return {}
  return {}


load_run = runs_lib.read  # the run at a path and warnings about it (analysis/runs.py)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = tuple(v) if isinstance(v, list) else v
  return out


def eval_curve(run: Run, metric: str, x: str = GENERATED) -> tuple[np.ndarray, np.ndarray]:
  """(responses on axis `x`, metric) at the evaluation steps, finite values only, the last of a
  repeated count (a resumed run) kept."""
  pts = {float(v): y for v, y in run.curve(metric, x) if math.isfinite(y)}
  if not pts:
    return np.zeros(0), np.zeros(0)
  xs = np.array(sorted(pts))
  return xs, np.array([pts[v] for v in xs])


def lanes_of(run: Run) -> int:
  """Runs side by side in the run's process (launch/sweep.py --vectorize=lanes), 1 alone."""
  lanes = run.summary.get("lanes") if isinstance(run.summary, dict) else None
  return int(lanes.get("count", 1) or 1) if isinstance(lanes, dict) else 1


def chips_of(run: Run) -> int:
  """The devices a run had: its process's, shared out between its lanes."""
  devices = int(run.summary.get("devices", 1) or 1) if isinstance(run.summary, dict) else 1
  return max(1, devices // lanes_of(run))


def eval_rows(run: Run, metric: str, xs: np.ndarray, x: str = GENERATED) -> np.ndarray | None:
  """The problems each evaluation at `xs` scored (eval/rows: fewer than the whole set when it
  was evaluated in stages), None when a run did not log them (the whole set every time)."""
  got = {}
  for r in run.rows:
    at = runs_lib.responses(r, x)
    if isinstance(r.get(metric), (int, float)) and at is not None:
      got[float(at)] = r.get("eval/rows")
  n = [got.get(float(v)) for v in xs]
  return None if any(not isinstance(v, (int, float)) for v in n) else np.asarray(n, float)


def warmup_steps(run: Run) -> int:
  """Steps in which a PPO actor did not train while its critic warmed up (0 for the others)."""
  critic = run.config.get("critic")
  if not isinstance(critic, dict) or "critic" not in run.plan.models:
    return 0
  return int(critic.get("warmup_steps") or 0)


def warmup_responses(run: Run, x: str = GENERATED) -> float:
  """Responses on axis `x` a PPO actor did not train on while its critic warmed up (0 for the
  others): warm-up steps x responses per step, or with dynamic sampling the count its rows
  logged at the warm-up's last step."""
  steps = warmup_steps(run)
  if run.dynamic_sampling and steps:
    logged = [runs_lib.responses(r, x) for r in run.rows if r.get("step") == steps]
    if logged and logged[-1] is not None:
      return logged[-1]
  return steps * run.plan.responses


def responses_to_target(run: Run, metric: str, target: float, x: str = GENERATED) -> float:
  """Responses on axis `x` the actor trained through until its evaluations first reached
  `target` (rlscale/metrics/crossing.py); +inf when never reached."""
  xs, y = eval_curve(run, metric, x)
  if xs.size == 0:
    return math.inf
  return max(crossing.first_crossing(xs, y, target) - warmup_responses(run, x), 0.0)


def steps_to_target(run: Run, rtt: float, x: str = GENERATED) -> float:
  """The actor's optimizer steps in `rtt` responses to target on axis `x`; inf when never."""
  return run.optimizer_steps(rtt, x) if math.isfinite(rtt) else math.inf


def effective_batch(run: Run, cross_at: float, x: str = GENERATED) -> float:
  """The mean of `rollout/effective_batch` (informative responses per optimizer step of the
  actor) over the steps up to the one in which the run crossed its target at `cross_at`
  responses on axis `x` (all its steps when inf); NaN when the run did not log it."""
  last = math.ceil(run.steps_at(cross_at, x) - 1e-9) if math.isfinite(cross_at) else math.inf
  by_step = {r["step"]: r["rollout/effective_batch"] for r in run.rows
             if isinstance(r.get("step"), (int, float)) and 1 <= r["step"] <= last
             and isinstance(r.get("rollout/effective_batch"), (int, float))}
  return float(np.mean(list(by_step.values()))) if by_step else math.nan


def grad_clip(run: Run, model: str = "actor") -> float:
  """The model's gradient clip (optim.grad_clip, critic.optim.grad_clip): the global norm its
  gradient is clipped to before each optimizer step; 0 when clipping is off."""
  cfg = run.config.get("optim", {}) if model == "actor" else \
      (run.config.get(model) or {}).get("optim", {})
  v = cfg.get("grad_clip") if isinstance(cfg, dict) else None
  return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _trained_norms(run: Run, cross_at: float, model: str, x: str) -> list[float]:
  """`{model}/grad_norm` of the steps up to the one that crossed the target at `cross_at`
  responses on axis `x` (all steps when inf) in which the model trained (a PPO actor idles,
  with a zero norm, while its critic warms up)."""
  last = math.ceil(run.steps_at(cross_at, x) - 1e-9) if math.isfinite(cross_at) else math.inf
  key = f"{model}/grad_norm"
  by_step = {r["step"]: r[key] for r in run.rows
             if isinstance(r.get("step"), (int, float)) and 1 <= r["step"] <= last
             and isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and r[key] > 0}
  return list(by_step.values())


def grad_norm_median(run: Run, cross_at: float, model: str = "actor",
                     x: str = GENERATED) -> float:
  """The median logged grad norm (before clipping: rlscale/rl/update.py) of the model's
  trained steps up to the crossing at `cross_at` (_trained_norms); NaN when it logged none."""
  norms = _trained_norms(run, cross_at, model, x)
  return float(np.median(norms)) if norms else math.nan


def clip_fraction(run: Run, cross_at: float, model: str = "actor", x: str = GENERATED) -> float:
  """The fraction of the model's optimizer steps up to the crossing at `cross_at` whose
  gradient was clipped: logged grad norm (before clipping) > its grad_clip; 0 when clipping is
  off, NaN when it logged no grad norm. A row logs the mean norm over its RL step's optimizer
  steps: exact with one optimizer step per RL step (num_minibatches = num_epochs = 1), else
  each RL step counts as clipped when its mean norm exceeds the clip."""
  clip = grad_clip(run, model)
  if clip <= 0:
    return 0.0
  norms = _trained_norms(run, cross_at, model, x)
  return float(np.mean(np.asarray(norms) > clip)) if norms else math.nan


def steady_throughput(run: Run, x: str = GENERATED) -> float:
  """Responses on axis `x` per second of a step net of evaluation and checkpointing, median
  over steps >= 2 (step 1 carries the compilation) past any critic warm-up (steps in which the
  actor does not train are faster, and more of them at a smaller batch)."""
  per_step, nominal = run.step_responses(x), run.responses_per_step
  first = max(2, warmup_steps(run) + 1)
  rates = []
  for r in run.rows:
    if r.get("step", 0) < first or not isinstance(r.get("time/step"), (int, float)):
      continue
    t = r["time/step"] - (r.get("time/eval") or 0) - (r.get("time/checkpoint") or 0)
    if t > 0:
      rates.append(per_step.get(int(r["step"]), nominal) / t)
  return float(np.median(rates)) if rates else math.nan


def _net_step_times(run: Run, first: int, last: float = math.inf) -> list[float]:
  """Seconds of each step in [first, last] net of evaluation and checkpointing (positive
  ones)."""
  net = [r["time/step"] - (r.get("time/eval") or 0) - (r.get("time/checkpoint") or 0)
         for r in run.rows if first <= r.get("step", 0) <= last
         and isinstance(r.get("time/step"), (int, float))]
  return [t for t in net if t > 0]


def warmup_seconds(run: Run) -> float:
  """Seconds a PPO critic's warm-up took (0 for the others): its steps x the median net
  seconds of a warm-up step (steps >= 2: step 1 carries the compilation); the steady steps'
  median when no warm-up step past the first logged a time (NaN when none did)."""
  steps = warmup_steps(run)
  if not steps:
    return 0.0
  net = _net_step_times(run, 2, steps) or _net_step_times(run, max(2, steps + 1))
  return steps * float(np.median(net)) if net else math.nan


def time_to_target(run: Run, rtt: float, throughput: float, x: str = GENERATED,
                   incl_warmup: bool = False) -> float:
  """Seconds to `rtt` responses to target on axis `x` (the actor's: a PPO critic's warm-up
  left out): rtt / steady throughput; for a run whose steps vary in responses (dynamic
  sampling), its RL steps to the crossing past the warm-up x the median net seconds of a step
  (a median rate of responses per second would weigh steps that generated more responses as
  faster ones). The crossing is interpolated on axis `x` between evaluations, so the two axes
  can place it a fraction of a step apart. With `incl_warmup`, plus the seconds the warm-up
  took (warmup_seconds): the time from the run's start, which is what compares a PPO run
  with a GRPO run."""
  if not math.isfinite(rtt):
    return math.inf
  extra = warmup_seconds(run) if incl_warmup else 0.0
  if not run.dynamic_sampling:
    return rtt / throughput + extra if throughput > 0 else math.nan
  net = _net_step_times(run, max(2, warmup_steps(run) + 1))
  if not net:
    return math.nan
  steps = run.steps_at(rtt + warmup_responses(run, x), x) - warmup_steps(run)
  return max(steps, 0.0) * float(np.median(net)) + extra


def b_simple_at(run: Run, at: float, unit: str, model: str = "actor",
                x: str = GENERATED) -> float:
  """B_simple in responses at the crossing `at`: b_simple_in over [at/2, 3 at/2]."""
  return ratio_of_means(*noise_at(run, at, unit, model, x))


def noise_at(run: Run, at: float, unit: str, model: str = "actor", x: str = GENERATED):
  """noise_in over [at/2, 3 at/2] of the crossing `at` ((nan, nan, 1) without a crossing)."""
  if not math.isfinite(at) or at <= 0:
    return math.nan, math.nan, 1
  return noise_in(run, at / 2, 1.5 * at, unit, model, x)


def noise_in(run: Run, lo: float, hi: float, unit: str, model: str = "actor",
             x: str = GENERATED):
  """(mean |G|^2 estimate, mean tr(Sigma) estimate, G or 1) over the steps whose responses on
  axis `x` lie in [lo, hi]: the raw two-batch estimates of `unit` (rlscale/rl/noise_scale.py),
  and the factor that turns B in prompts into responses; nan means without estimates there."""
  key = f"{model}/noise_{unit}"
  g2, tr = [], []
  for r in run.rows:
    at = runs_lib.responses(r, x)
    if (at is not None and lo <= at <= hi
        and isinstance(r.get(f"{key}/grad_sq_est"), (int, float))
        and isinstance(r.get(f"{key}/trace_est"), (int, float))):
      g2.append(r[f"{key}/grad_sq_est"])
      tr.append(r[f"{key}/trace_est"])
  per = run.plan.group_size if unit == "prompts" else 1
  if not g2:
    return math.nan, math.nan, per
  return float(np.mean(g2)), float(np.mean(tr)), per


def ratio_of_means(g2: float, tr: float, per: float = 1) -> float:
  """B_simple = tr(Sigma) / |G|^2 (x G for prompts): inf when |G|^2 is not positive (the noise
  swamps the signal), nan without estimates."""
  if math.isnan(g2):
    return math.nan
  return tr / g2 * per if g2 > 0 else math.inf


def b_simple_in(run: Run, lo: float, hi: float, unit: str, model: str = "actor",
                x: str = GENERATED) -> float:
  """B_simple in responses from the raw estimates of the steps in [lo, hi] (ratio_of_means)."""
  return ratio_of_means(*noise_in(run, lo, hi, unit, model, x))


def lr_of(run: Run) -> float:
  """The actor's effective learning rate: its base lr through its scaling rule at its B."""
  return optim.scale(run.config.get("optim", {}), run.plan.batch).lr


# Fields that do not change what a run computes (seeds aside): how often it evaluates and
# saves, how long it runs, its target, and how its lr was written (the effective lr is a field
# of its own), and the PPO critic's warm-up (tied to P, its responses counted apart).
_NOT_CONFIG = ("seed", "optim.lr", "optim.lr_scaling", "optim.reference_batch", "target.",
               "train.eval_every", "train.total_responses", "train.num_steps",
               "train.checkpoint", "train.keep_checkpoints", "train.log_every",
               "train.async_checkpoint", "train.tensorboard", "eval.", "critic.warmup_steps",
               "init.cache_dir")


def _is_config_field(key: str, flat: dict[str, dict]) -> bool:
  """Whether a varying field splits configurations (module docstring). The run length and the
  reference batch do when some run decays its lr to the run's end or scales Adam's moments."""
  if key.startswith(("train.total_responses", "train.num_steps")):
    return any(f.get("optim.schedule", "constant") != "constant" for f in flat.values())
  if key == "optim.reference_batch":
    return any(f.get("optim.adam_scaling") for f in flat.values())
  return not key.startswith(_NOT_CONFIG)


@dataclasses.dataclass
class Study:
  runs: pd.DataFrame  # one row per point; `problem` empty when the run is used
  records: dict[str, Run]  # by run id (stage/name), runs with a config
  opts: Options
  metric: str
  target: float
  target_note: str  # where the target came from
  varying: list[str]  # config fields that vary across runs and define a configuration
  warnings: list[str]
  record: dict[str, Any]  # study.json ({} without one)
  lr_notes: list[str] = dataclasses.field(default_factory=list)

  def used(self, role: str | None = None) -> pd.DataFrame:
    """The runs every fit and table uses (complete); `role` keeps "tuning" or "verdict" runs."""
    ok = self.runs[self.runs.problem == ""]
    return ok if role is None else ok[ok.role == role]

  def verdict_runs(self) -> pd.DataFrame:
    """Per configuration, its verdict seeds when it has any, else its tuning seeds (a
    configuration only a scan ran is still shown, marked as such)."""
    ok = self.used()
    has = set(ok[ok.role == "verdict"].config)
    return ok[(ok.role == "verdict") | ~ok.config.isin(has)]


def x_label(study: Study) -> str:
  """What the study's responses count: 'responses generated' or 'responses trained'."""
  return axis_label(study.opts.x)


def _row(point: Point, run: Run | None, warnings: list[str], tuning: set[str]
         ) -> dict[str, Any]:
  rid = f"{point.stage}/{point.name}" if point.stage else point.name
  row = dict(run=rid, name=point.name, stage=point.stage, status=point.status,
             error=point.error, warnings="; ".join(warnings), path=point.path,
             role="tuning" if point.stage in tuning else "verdict")
  problem = "" if point.status == "done" else point.status
  if run is None:
    return dict(row, problem=problem or "no config.json")
  try:
    plan = run.plan
    lr = lr_of(run)
  except Exception as e:  # noqa: BLE001 - a bad config is listed, not raised
    return dict(row, problem=problem or f"config: {str(e).splitlines()[-1].strip()}")
  optim_cfg = run.config.get("optim", {})
  row.update(kind=run.config.get("kind"), seed=run.config.get("seed"),
             dynamic_sampling=run.dynamic_sampling, max_staleness=staleness_of(run.config),
             off_policy_correction=correction_of(run.config), P=plan.num_prompts,
             G=plan.group_size, responses_per_step=plan.responses, B=plan.batch,
             B_prompts=plan.batch_prompts, num_minibatches=plan.main.num_minibatches,
             lr=float(f"{lr:.4g}"), lr_rule=optim_cfg.get("lr_scaling", "none"),
             lr_base=optim_cfg.get("lr"), B0=optim_cfg.get("reference_batch"),
             chips=chips_of(run), lanes=lanes_of(run), n_rows=len(run.rows),
             responses_seen=run.rows[-1].get("responses_seen", 0) if run.rows else 0,
             total_responses=plan.total_responses, warmup=warmup_responses(run))
  if not problem and not run.summary:
    problem = "unfinished (no summary.json)"
  row["stopped"] = stopped_at_target(run)
  if not problem and row["responses_seen"] < plan.total_responses and not row["stopped"]:
    problem = f"unfinished ({row['responses_seen']} of {plan.total_responses} responses)"
  return dict(row, problem=problem)


def stopped_at_target(run: Run) -> bool:
  """A run that ended at its target (target.stop, past its margin): finished, not cut short."""
  target = run.config.get("target", {})
  return bool(target.get("stop") and run.summary
              and run.summary.get("responses_to_target") is not None)


def _progress(i: int, n: int, stream):
  tty = getattr(stream, "isatty", lambda: False)()
  if tty:
    print(f"\rread {i}/{n} runs", end="" if i < n else "\n", file=stream, flush=True)
  elif i == n or i % max(1, n // 10) == 0:
    print(f"read {i}/{n} runs", file=stream, flush=True)


def _most_common(values, default=None):
  s = pd.Series([v for v in values if v is not None])
  return s.mode().iloc[0] if len(s) else default


def _one_task(records: dict[str, Run]) -> None:
  """A report compares batches on one task: runs of several (by task.name) are refused, since
  their curves, targets and responses to target do not compare."""
  tasks: dict[str, list[str]] = {}
  for name, run in records.items():
    tasks.setdefault(str(run.config.get("task", {}).get("name")), []).append(name)
  if len(tasks) > 1:
    held = "; ".join(f"{t}: {len(n)} run(s), e.g. {n[0]}" for t, n in sorted(tasks.items()))
    raise StudyError(f"the runs are of {len(tasks)} tasks ({held}): a report compares batches "
                     "on one task; report each task's runs apart")


def read_study(dirs: list[str], opts: Options, stream=sys.stderr) -> Study:
  points = find_points(dirs)
  if not points:
    raise StudyError(f"no runs in {' '.join(dirs)} (no sweep.json, no config.json)")
  record = read_record(dirs)
  tuning = {c["stage"] for c in record.get("chosen", {}).values() if c.get("stage")}
  rows, records, warnings = [], {}, []
  for i, point in enumerate(points, 1):
    run, warn = load_run(point.path) if os.path.isdir(point.path) else (None, [])
    row = _row(point, run, warn, tuning)
    rows.append(row)
    warnings += [f"{row['run']}: {w}" for w in warn]
    if run is not None:
      records[row["run"]] = run
    _progress(i, len(points), stream)
  runs = pd.DataFrame(rows)
  for col in ("P", "G", "B", "responses_per_step", "num_minibatches", "chips", "seed",
              "warmup"):
    if col in runs:
      runs[col] = runs[col].astype("Int64")
  if "kind" not in runs:
    raise StudyError(f"no readable run in {' '.join(dirs)} ({len(points)} points, none with "
                     "a config.json)")
  _one_task(records)
  metric, target, note = _target(opts, record, records)
  study = Study(runs, records, opts, metric, target, note, [], warnings, record)
  _add_config_columns(study)
  _add_outcomes(study)
  _mark_duplicates(study)
  return study


def _target(opts: Options, record: dict, records: dict) -> tuple[str, float, str]:
  t = record.get("target") or {}
  targets = [r.config.get("target", {}) for r in records.values()]
  metric = opts.metric or t.get("metric") or _most_common(
      [x.get("metric") for x in targets], "eval/accuracy_greedy")
  if opts.target is not None:
    return metric, float(opts.target), "set by --target"
  if t.get("value") is not None and metric == t.get("metric"):
    return metric, float(t["value"]), (
        f"set by the study from stage {t.get('stage')}: base {t['base']:.3g} + "
        f"{t['fraction']:g} x (plateau {t['plateau']:.3g} - base), rounded")
  return metric, float(_most_common([x.get("value") for x in targets], 0.6)), \
      "the runs' config target"


def _add_config_columns(study: Study):
  """`config`: the values of the fields that vary across runs and change what a run computes
  (module docstring), with the effective lr; `label` for people."""
  flat = {rid: flatten(r.config) for rid, r in study.records.items()}
  keys = sorted(set().union(*flat.values())) if flat else []
  runs = study.runs
  varying = [k for k in keys if _is_config_field(k, flat)
             and len({repr(f.get(k)) for f in flat.values()}) > 1]
  study.varying = varying
  if study.opts.reference_batch:
    runs.loc[runs.kind.notna(), "B0"] = study.opts.reference_batch
  # A field set in one kind only (critic.* in PPO) splits no runs beyond `kind`: not shown.
  by_kind: dict[str, list[dict]] = {}
  for rid, f in flat.items():
    by_kind.setdefault(str(f.get("kind")), []).append(f)
  shown = [k for k in varying if k not in ("kind", "rl.num_prompts", "rl.group_size",
                                           "rl.num_minibatches")
           and any(len({repr(f.get(k)) for f in fs}) > 1 for fs in by_kind.values())]
  configs, labels = [], []
  for row in runs.itertuples():
    f = flat.get(row.run)
    if f is None or pd.isna(getattr(row, "lr", np.nan)):
      configs.append("")
      labels.append("")
      continue
    configs.append(",".join([f"{k}={f.get(k)}" for k in varying] + [f"lr={row.lr:.4g}"]))
    extra = "".join(_shown(k, f.get(k)) for k in shown)
    mb = f" mb={row.num_minibatches}" if runs.num_minibatches.nunique() > 1 else ""
    labels.append(f"{row.kind} P={row.P} G={row.G}{mb} B={row.B} lr={row.lr:.3g}"
                  + (f" chips={row.chips}" if runs.chips.nunique() > 1 else "") + extra)
  runs["config"], runs["label"] = configs, labels


def _shown(key: str, value) -> str:
  """A varying field in a configuration's label: ' name=value'; dynamic sampling as
  ' filtered' when on (its groups without signal dropped and refilled), nothing when off."""
  if key == "rollout.dynamic_sampling":
    return " filtered" if value else ""
  return f" {key.split('.')[-1]}={value}"


def _add_outcomes(study: Study):
  runs, m, t, ax = study.runs, study.metric, study.target, study.opts.x
  cols = {k: [] for k in ("n_eval", "base", "final", "peak", "responses_to_target",
                          "responses_to_target_incl_warmup", "bracket", "steps_to_target",
                          "effective_B", "throughput", "time_to_target",
                          "time_to_target_incl_warmup", "grad_clip", "grad_norm",
                          "clip_fraction",
                          "b_simple_prompts", "b_simple_responses", "g2_prompts",
                          "trace_prompts", "g2_responses", "trace_responses",
                          "drop_after_target")}
  for row in runs.itertuples():
    run = study.records.get(row.run)
    planned = run is not None and pd.notna(getattr(row, "lr", np.nan))
    x, y = eval_curve(run, m, ax) if planned else (np.zeros(0),) * 2
    ok = planned and x.size > 0
    rtt = responses_to_target(run, m, t, ax) if ok else math.nan
    thr = steady_throughput(run, ax) if ok else math.nan
    br = crossing.bracket(x, y, t) if ok else None
    cross_at = rtt + (warmup_responses(run, ax) if ok else 0)
    cols["n_eval"].append(int(x.size))
    cols["base"].append(float(y[0]) if ok else math.nan)
    cols["final"].append(float(y[-1]) if ok else math.nan)
    cols["peak"].append(float(y.max()) if ok else math.nan)
    cols["responses_to_target"].append(rtt)
    cols["responses_to_target_incl_warmup"].append(cross_at)
    cols["bracket"].append((br[1] - br[0]) if br else math.nan)
    cols["steps_to_target"].append(steps_to_target(run, rtt, ax) if ok else math.nan)
    cols["effective_B"].append(effective_batch(run, cross_at, ax) if ok else math.nan)
    cols["throughput"].append(thr)
    cols["time_to_target"].append(time_to_target(run, rtt, thr, ax) if ok else math.nan)
    cols["time_to_target_incl_warmup"].append(
        time_to_target(run, rtt, thr, ax, incl_warmup=True) if ok else math.nan)
    cols["grad_clip"].append(grad_clip(run) if planned else math.nan)
    cols["grad_norm"].append(grad_norm_median(run, cross_at, x=ax) if ok else math.nan)
    cols["clip_fraction"].append(clip_fraction(run, cross_at, x=ax) if ok else math.nan)
    for unit in ("prompts", "responses"):
      g2, tr, per = noise_at(run, cross_at, unit, x=ax) if ok else (math.nan, math.nan, 1)
      cols[f"b_simple_{unit}"].append(ratio_of_means(g2, tr, per))
      cols[f"g2_{unit}"].append(g2)
      cols[f"trace_{unit}"].append(tr * per if not math.isnan(tr) else math.nan)
    # How far the curve fell below the target after an evaluation first reached it (a
    # collapse after the crossing, which keeps its crossing).
    drop = crossing.drop_after(y, t, eval_rows(run, m, x, ax)) if ok else None
    cols["drop_after_target"].append(math.nan if drop is None else drop)
  for k, v in cols.items():
    runs[k] = v
  # A crossing inside a bracket wider than a quarter of itself rests on the curve's shape
  # between two far-apart evaluations (rlscale/metrics/crossing.py): say how many there are.
  cross = runs.responses_to_target + runs.get("warmup", 0).fillna(0).astype(float)
  coarse = runs[(runs.problem == "") & np.isfinite(cross) & (runs.bracket > 0.25 * cross)]
  if len(coarse):
    study.warnings.append(f"{len(coarse)} run(s) cross the target between evaluations more "
                          "than a quarter of the crossing apart (e.g. "
                          f"{coarse.run.iloc[0]}: bracket {coarse.bracket.iloc[0]:g} responses "
                          "wide): evaluate more often for a resolved crossing")
  few = (runs.problem == "") & (runs.n_eval < 2)
  runs.loc[few, "problem"] = "fewer than 2 evaluations of " + m


def _mark_duplicates(study: Study):
  """The same configuration and seed twice (e.g. a run repeated in two stages) counts once:
  a repeated seed would narrow the interval without new evidence."""
  runs = study.runs
  ok = runs[(runs.problem == "") & runs.seed.notna()]
  # A tuning copy is kept (that seed chose a value: its verdict copy is no fresh evidence).
  ok = ok.assign(_t=(ok.role != "tuning")).sort_values(["_t", "run"])
  dup = ok.duplicated(["config", "seed"], keep="first")
  for i in ok.index[dup]:
    first = ok[(ok.config == ok.config[i]) & (ok.seed == ok.seed[i])].run.iloc[0]
    runs.loc[i, "problem"] = f"duplicate of {first} (same configuration and seed)"


# The columns that depend on the target (seed_values recomputes them at another one).
_AT_TARGET = ("responses_to_target", "responses_to_target_incl_warmup", "time_to_target",
              "time_to_target_incl_warmup", "steps_to_target")


def seed_values(study: Study, config: str, column: str = "responses_to_target",
                target: float | None = None, runs: pd.DataFrame | None = None) -> np.ndarray:
  """A configuration's verdict seeds' values of `column` (NaN dropped, inf kept), at `target`
  when it differs from the study's (responses or time to it, recomputed)."""
  runs = study.verdict_runs() if runs is None else runs
  rows = runs[runs.config == config]
  if target is not None and target != study.target and column in _AT_TARGET:
    out = []
    for r in rows.itertuples():
      run, ax = study.records[r.run], study.opts.x
      rtt = responses_to_target(run, study.metric, target, ax)
      out.append({
          "responses_to_target": lambda: rtt,
          "responses_to_target_incl_warmup": lambda: rtt + warmup_responses(run, ax),
          "time_to_target": lambda: time_to_target(run, rtt, r.throughput, ax),
          "time_to_target_incl_warmup": lambda: time_to_target(run, rtt, r.throughput, ax,
                                                               incl_warmup=True),
          "steps_to_target": lambda: steps_to_target(run, rtt, ax)}[column]())
    v = np.asarray(out, float)
  else:
    v = rows[column].to_numpy(float)
  return v[~np.isnan(v)]


_DESCRIBE = ["label", "kind", "dynamic_sampling", "max_staleness", "off_policy_correction", "P",
             "G", "responses_per_step", "B", "B_prompts", "num_minibatches", "lr", "lr_rule",
             "chips", "B0", "warmup", "grad_clip"]


def staleness_of(config: dict) -> int:
  """A run's k: rollout.max_staleness (an old run's rollout.overlap renamed at load)."""
  return int((config.get("rollout") or {}).get("max_staleness") or 0)


def correction_of(config: dict) -> str:
  """A run's rl.off_policy_correction ("none" where it has none)."""
  return str((config.get("rl") or {}).get("off_policy_correction") or "none")


def config_table(study: Study, target: float | None = None) -> pd.DataFrame:
  """One row per configuration (its verdict seeds): responses, steps and time to target with
  their intervals (stats.median_interval: n and coverage beside them), final value,
  throughput, the effective batch (median over seeds), B_simple at the crossing, how many of
  its seeds are tuning seeds, and the actor's gradient clipping: `grad_clip` (0: off),
  `grad_norm` (median over seeds of each run's median norm before clipping) and
  `clip_fraction` (median over seeds of the fraction of optimizer steps clipped; both up to
  the crossing).

  `rtt`/`ttt` are the actor's responses and time to target: a PPO critic's warm-up left out,
  which is fair between PPO configurations whose warm-up is the same (the study's: the same
  responses at every B). `rtt_incl`/`ttt_incl` count the warm-up (responses and seconds from
  the run's start): every comparison of PPO with GRPO must use these."""
  used = study.verdict_runs()
  if used.empty:
    return pd.DataFrame()
  first = used.groupby("config").first()
  agg = used.groupby("config").agg(
      n_seeds=("run", "size"), throughput=("throughput", "median"),
      effective_B=("effective_B", "median"),
      responses=("responses_seen", "max"), tuning_seeds=("role", lambda r: (r == "tuning").sum()),
      max_drop=("drop_after_target", "max"), grad_norm=("grad_norm", "median"),
      clip_fraction=("clip_fraction", "median"))
  table = first[[c for c in _DESCRIBE if c in first]].join(agg)
  for col, name in (("responses_to_target", "rtt"), ("time_to_target", "ttt"),
                    ("responses_to_target_incl_warmup", "rtt_incl"),
                    ("time_to_target_incl_warmup", "ttt_incl"),
                    ("steps_to_target", "steps"), ("final", "final"),
                    ("b_simple_prompts", "bsp"), ("b_simple_responses", "bsr")):
    ivs = []
    for c in table.index:
      v = seed_values(study, c, col, target, used)
      ivs.append(stats.median_interval(v) if v.size else stats.Interval(math.nan, n=0))
    table[name + "_iv"] = ivs
    table[name] = [iv.point for iv in ivs]
  table = table.reset_index().sort_values(["kind", "G", "B", "lr"]).reset_index(drop=True)
  return table


def main_group_size(table: pd.DataFrame, kind: str) -> int:
  return int(table[table.kind == kind].G.mode().iloc[0])


def config_curve(study: Study, config: str, runs: pd.DataFrame | None = None) -> pd.DataFrame:
  """The configuration's curve over its verdict seeds: the median and range at the responses
  (on the study's axis) where every seed has been evaluated (each seed interpolated between its
  evaluations)."""
  runs = study.verdict_runs() if runs is None else runs
  ids = list(runs[runs.config == config].run)
  curves = [eval_curve(study.records[i], study.metric, study.opts.x) for i in ids]
  curves = [c for c in curves if c[0].size]
  if not curves:
    return pd.DataFrame(columns=["responses", "median", "lo", "hi", "seeds"])
  x = max(curves, key=lambda c: c[0].size)[0]
  ys = np.array([np.where((x >= cx[0]) & (x <= cx[-1]), np.interp(x, cx, cy), np.nan)
                 for cx, cy in curves])
  with np.errstate(all="ignore"):
    return pd.DataFrame({"responses": x, "median": np.nanmedian(ys, 0),
                         "lo": np.nanmin(ys, 0), "hi": np.nanmax(ys, 0), "seeds": len(curves)})


def curve_shortfall(curve: pd.DataFrame, ref: pd.DataFrame, points: int = 16) -> float:
  """How far a median curve falls *below* the reference's at equal responses: the largest
  ref - curve over `points` evenly spaced responses in the span both cover (each curve
  interpolated between its evaluations). Negative when the curve is above everywhere; a curve
  above the reference is not a break."""
  if curve.empty or ref.empty:
    return math.nan
  lo = max(curve.responses.min(), ref.responses.min())
  hi = min(curve.responses.max(), ref.responses.max())
  if not hi > lo:
    return math.nan
  x = np.linspace(lo, hi, points)
  a = np.interp(x, curve.responses, curve["median"])
  b = np.interp(x, ref.responses, ref["median"])
  keep = np.isfinite(a) & np.isfinite(b)
  return float(np.max(b[keep] - a[keep])) if keep.any() else math.nan


CLIP_DIFFERENCE = 0.1  # clip_fraction_check: the largest difference allowed between batches


def clip_fraction_check(rows: pd.DataFrame, max_difference: float = CLIP_DIFFERENCE
                        ) -> tuple[bool, str]:
  """Whether gradient clipping acts alike at every batch of a series: `rows` are its rows of
  the configuration table (Series.rows: B, grad_clip, clip_fraction, grad_norm). Passes when
  clipping is off at every batch, or when the fractions of optimizer steps clipped differ by
  at most `max_difference` between the batches; fails when they differ by more (the clip
  rescales the update at some batches only: the update rule changes with B) or when a batch
  with clipping on logged no grad norm (unknown)."""
  rows = rows.sort_values("B")
  clips = rows.grad_clip.fillna(0).astype(float)
  if not (clips > 0).any():
    return True, "gradient clipping is off at every batch (optim.grad_clip = 0)"
  clip_text = (f"clip {clips.iloc[0]:g}" if clips.nunique() == 1 else "clip " + ", ".join(
      f"{c:g} at B = {b}" for b, c in zip(rows.B, clips)))
  frac = rows.clip_fraction.astype(float)
  unknown = rows.B[frac.isna() & (clips > 0)]
  if len(unknown):
    return False, (f"gradient clipping is on ({clip_text}) but the runs at B = "
                   f"{', '.join(map(str, unknown))} log no actor/grad_norm: whether it acts "
                   "alike at every batch is unknown")
  per = ", ".join(f"B = {b}: {f:.0%}" + (f" (median norm {g:.3g})" if pd.notna(g) else "")
                  for b, f, g in zip(rows.B, frac, rows.get("grad_norm", [math.nan] * len(rows))))
  spread = float(frac.max() - frac.min())
  ok = spread <= max_difference
  return ok, (f"fraction of optimizer steps clipped (grad norm before clipping > the "
              f"{clip_text}): {per}; it differs by {spread:.2f} between batches (allowed: "
              f"{max_difference:g})" + ("" if ok else ": the clip rescales the update at some "
                                         "batches and not at others, so the update rule "
                                         "changes with B"))

"""Reading a study into pandas tables: one row per run, then one row per configuration.

A DIR is a sweep directory (sweep.json: every point, whatever its status), a study directory
(sweep directories as subdirectories, one per stage), or a run directory (config.json). Every
point becomes a row of the runs table; a run that cannot be used (failed, pending, unfinished,
malformed) keeps its row with the reason in `problem`, so the report lists it.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # rlscale
from runs import Run  # noqa: E402
import fits  # noqa: E402
import stats  # noqa: E402


class StudyError(ValueError):
  """Input that cannot make a report (no runs at all); the message is one line."""


@dataclasses.dataclass
class Options:
  metric: str | None = None  # None: the runs' target metric
  target: float | None = None  # None: the runs' target value
  targets: list[float] | None = None  # section 3's targets (None: 4 evenly spaced)
  tolerance: float = 0.2
  band: float = 0.05
  stat: str = "iqm"
  reps: int = 2000
  fit_reps: int = 50  # bootstrap reps of the fits (each one a curve fit, not a mean)
  reference_batch: int | None = None
  seed: int = 0
  window: int = 3  # evaluations in the trailing smoothing window


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
    out.append(Point(p["name"], path, stage, p.get("status", "unknown"),
                     str(err[-1]).strip() if err else ""))
  return out


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
    return [Point(os.path.basename(d), d, stage, "done", "")]
  if depth >= 2:
    return []
  out = []
  for sub in sorted(os.listdir(d)):
    if os.path.isdir(os.path.join(d, sub)):
      out += _walk(os.path.join(d, sub), sub if depth == 0 and stage == "" else stage,
                   depth + 1)
  return out


def _number(v):
  """Metrics hold "inf"/"nan" as strings (JSON has no infinity)."""
  if isinstance(v, str) and v.lower() in ("inf", "-inf", "nan", "infinity", "-infinity"):
    return float(v)
  return v


def load_run(path: str) -> tuple[Run | None, list[str]]:
  """The run at `path` and warnings about it (malformed lines are skipped and counted)."""
  warnings = []
  def read(name):
    p = os.path.join(path, name)
    if not os.path.exists(p):
      return {}
    try:
      with open(p) as f:
        return json.load(f)
    except (json.JSONDecodeError, OSError) as e:
      warnings.append(f"{name} unreadable ({e.__class__.__name__})")
      return {}
  config = read("config.json")
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
  if not config:
    return None, warnings
  return Run(path, config, rows, read("summary.json")), warnings


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = tuple(v) if isinstance(v, list) else v
  return out


def eval_curve(run: Run, metric: str) -> tuple[np.ndarray, np.ndarray]:
  """(responses_seen, metric) at the evaluation steps, finite values only."""
  pts = [(float(x), y) for x, y in run.curve(metric) if math.isfinite(y)]
  if not pts:
    return np.zeros(0), np.zeros(0)
  x, y = map(np.asarray, zip(*pts))
  return x, y


def responses_to_target(run: Run, metric: str, target: float, window: int = 3) -> float:
  """First crossing of the smoothed eval curve; +inf when never reached."""
  x, y = eval_curve(run, metric)
  if x.size == 0:
    return math.inf
  hit = fits.first_crossing(x, y, target, window)
  return math.inf if hit is None else float(hit)


def steady_throughput(run: Run) -> float:
  """Responses per second of a step net of evaluation and checkpointing, median over steps >= 2
  (step 1 carries the compilation)."""
  per_step = run.responses_per_step
  rates = []
  for r in run.rows:
    if r.get("step", 0) < 2 or not isinstance(r.get("time/step"), (int, float)):
      continue
    t = r["time/step"] - (r.get("time/eval") or 0) - (r.get("time/checkpoint") or 0)
    if t > 0:
      rates.append(per_step / t)
  return float(np.median(rates)) if rates else math.nan


def b_simple(run: Run, key: str = "actor/noise_responses/b_simple") -> float:
  """Mean measured B_simple over the run's second half, finite values only."""
  vals = [r[key] for r in run.rows[len(run.rows) // 2:] if isinstance(r.get(key), (int, float))]
  vals = [v for v in vals if math.isfinite(v) and v > 0]
  return float(np.mean(vals)) if vals else math.nan


# Fields that name a configuration in every label; other varying fields are added to it.
_LABEL_FIELDS = ("kind", "rl.num_prompts", "rl.group_size", "optim.lr_scaling")


@dataclasses.dataclass
class Study:
  runs: pd.DataFrame  # one row per point; `problem` empty when the run is used
  records: dict[str, Run]  # by run id (stage/name), runs with a config
  opts: Options
  metric: str
  target: float
  varying: list[str]  # config fields that vary across runs, seed excluded
  warnings: list[str]
  lr_notes: list[str]  # how the learning rate of the analysed runs was chosen
  kind_only: list[str] = dataclasses.field(default_factory=list)  # varying: set in some runs only

  def used(self) -> pd.DataFrame:
    """The runs every fit and table uses: complete, at the chosen learning rate."""
    return self.runs[(self.runs.problem == "") & self.runs.lr_chosen]


def _row(point: Point, run: Run | None, warnings: list[str]) -> dict[str, Any]:
  rid = f"{point.stage}/{point.name}" if point.stage else point.name
  row = dict(run=rid, name=point.name, stage=point.stage, status=point.status,
             error=point.error, warnings="; ".join(warnings), path=point.path)
  problem = "" if point.status == "done" else point.status
  if run is None:
    return dict(row, problem=problem or "no config.json")
  try:
    plan = run.plan
  except Exception as e:  # noqa: BLE001 - a bad config is listed, not raised
    return dict(row, problem=problem or f"config: {str(e).splitlines()[-1].strip()}")
  optim = run.config.get("optim", {})
  row.update(kind=run.config.get("kind"), seed=run.config.get("seed"), P=plan.num_prompts,
             G=plan.group_size, responses_per_step=plan.responses, B=plan.batch,
             B_prompts=plan.batch_prompts, num_minibatches=plan.main.num_minibatches,
             lr=optim.get("lr"), lr_rule=optim.get("lr_scaling", "none"),
             B0=optim.get("reference_batch"), chips=int(run.summary.get("devices", 1) or 1),
             n_rows=len(run.rows), responses_seen=run.rows[-1].get("responses_seen", 0)
             if run.rows else 0, total_responses=plan.total_responses)
  if not problem and not run.summary:
    problem = "unfinished (no summary.json)"
  if not problem and row["responses_seen"] < plan.total_responses:
    problem = f"unfinished ({row['responses_seen']} of {plan.total_responses} responses)"
  return dict(row, problem=problem)


def _progress(i: int, n: int, stream):
  tty = getattr(stream, "isatty", lambda: False)()
  if tty:
    print(f"\rread {i}/{n} runs", end="" if i < n else "\n", file=stream, flush=True)
  elif i == n or i % max(1, n // 10) == 0:
    print(f"read {i}/{n} runs", file=stream, flush=True)


def _most_common(values, default=None):
  s = pd.Series([v for v in values if v is not None])
  return s.mode().iloc[0] if len(s) else default


def read_study(dirs: list[str], opts: Options, stream=sys.stderr) -> Study:
  points = find_points(dirs)
  if not points:
    raise StudyError(f"no runs in {' '.join(dirs)} (no sweep.json, no config.json)")
  rows, records, warnings = [], {}, []
  for i, point in enumerate(points, 1):
    run, warn = load_run(point.path) if os.path.isdir(point.path) else (None, [])
    row = _row(point, run, warn)
    rows.append(row)
    warnings += [f"{row['run']}: {w}" for w in warn]
    if run is not None:
      records[row["run"]] = run
    _progress(i, len(points), stream)
  runs = pd.DataFrame(rows)
  for col in ("P", "G", "B", "responses_per_step", "num_minibatches", "chips", "seed"):
    if col in runs:
      runs[col] = runs[col].astype("Int64")
  if "kind" not in runs:
    raise StudyError(f"no readable run in {' '.join(dirs)} ({len(points)} points, none with "
                     "a config.json)")
  targets = [r.config.get("target", {}) for r in records.values()]
  metric = opts.metric or _most_common([t.get("metric") for t in targets],
                                       "eval/accuracy_greedy")
  target = opts.target if opts.target is not None else _most_common(
      [t.get("value") for t in targets], 0.6)
  study = Study(runs, records, opts, metric, float(target), [], warnings, [])
  _add_config_columns(study)
  _add_outcomes(study)
  _mark_duplicates(study)
  _choose_lr(study)
  return study


def _add_config_columns(study: Study):
  """`config`: the values of the fields that vary across runs (seed aside); `label` for people."""
  flat = {rid: flatten(r.config) for rid, r in study.records.items()}
  keys = sorted(set().union(*flat.values())) if flat else []
  varying = [k for k in keys if k != "seed" and len({repr(f.get(k)) for f in flat.values()}) > 1]
  study.varying = varying
  # A field only some kinds have (critic.* in PPO) and constant where set splits no runs
  # beyond `kind`: named apart so the definition stays readable.
  study.kind_only = [k for k in varying if len({repr(f[k]) for f in flat.values() if k in f}) == 1]
  runs = study.runs
  if study.opts.reference_batch:
    runs.loc[runs.kind.notna(), "B0"] = study.opts.reference_batch
  shown = _label_extras(flat, varying)
  configs, labels = [], []
  for rid in runs.run:
    f = flat.get(rid)
    if f is None:
      configs.append("")
      labels.append("")
      continue
    configs.append(",".join(f"{k}={f.get(k)}" for k in varying) or "all")
    row = runs[runs.run == rid].iloc[0]
    extra = "".join(f" {k.split('.')[-1]}={f.get(k)}" for k in shown)
    labels.append(f"{row.kind} P={row.P} G={row.G} B={row.B} {row.lr_rule}"
                  + (f" chips={row.chips}" if runs.chips.nunique() > 1 else "") + extra)
  runs["config"], runs["label"] = configs, labels


def _label_extras(flat: dict[str, dict], varying: list[str]) -> list[str]:
  """Varying fields not already determined by kind, P, G and LR rule (e.g. optim.lr)."""
  out = []
  for k in varying:
    if k in _LABEL_FIELDS:
      continue
    seen: dict[tuple, Any] = {}
    determined = True
    for f in flat.values():
      base = tuple(repr(f.get(b)) for b in _LABEL_FIELDS + ("rl.num_minibatches",))
      if seen.setdefault(base, repr(f.get(k))) != repr(f.get(k)):
        determined = False
        break
    if not determined:
      out.append(k)
  return out


def _add_outcomes(study: Study):
  runs, m, t, w = study.runs, study.metric, study.target, study.opts.window
  cols = {k: [] for k in ("n_eval", "base", "final", "responses_to_target", "throughput",
                          "time_to_target", "b_simple")}
  for rid in runs.run:
    run = study.records.get(rid)
    x, y = eval_curve(run, m) if run is not None and "kind" in runs else (np.zeros(0),) * 2
    ok = run is not None and x.size > 0
    rtt = responses_to_target(run, m, t, w) if ok else math.nan
    thr = steady_throughput(run) if ok else math.nan
    cols["n_eval"].append(int(x.size))
    cols["base"].append(float(y[0]) if ok else math.nan)
    cols["final"].append(float(y[-1]) if ok else math.nan)
    cols["responses_to_target"].append(rtt)
    cols["throughput"].append(thr)
    cols["time_to_target"].append(rtt / thr if ok and thr > 0 else math.nan)
    cols["b_simple"].append(b_simple(run) if ok else math.nan)
  for k, v in cols.items():
    runs[k] = v
  few = (runs.problem == "") & (runs.n_eval < 2)
  runs.loc[few, "problem"] = "fewer than 2 evaluations of " + m


def _choose_lr(study: Study):
  """With several base learning rates (an LR-tuning stage at B0), the analysed runs are those
  at the most common rate among the runs away from B0."""
  runs = study.runs
  runs["lr_chosen"] = True
  ok = runs[(runs.problem == "") & runs.lr.notna()]
  for kind, group in ok.groupby("kind"):
    if group.lr.nunique() < 2:
      continue
    away = group[group.B != group.B0]
    if len(away):
      lr = away.lr.value_counts().idxmax()
      why = "the most common among runs away from B0"
    else:
      best = group.groupby("lr").agg(rtt=("responses_to_target", "median"),
                                     final=("final", "median"))
      lr = best.sort_values(["rtt", "final"], ascending=[True, False]).index[0]
      why = "the best at B0 (every run is at B0)"
    runs.loc[(runs.kind == kind) & runs.lr.notna() & (runs.lr != lr), "lr_chosen"] = False
    lrs = ", ".join(f"{v:g}" for v in sorted(group.lr.unique()))
    study.lr_notes.append(f"{kind}: base lr varies ({lrs}); "
                          f"sections use lr={lr:g}, {why}")


def seed_values(study: Study, target: float | None = None) -> dict[str, dict[str, list]]:
  """Per configuration, its seeds' responses and time to `target` (default: the study's)."""
  used = study.used()
  out: dict[str, dict[str, list]] = {}
  for _, r in used.iterrows():
    rtt, ttt = r.responses_to_target, r.time_to_target
    if target is not None and target != study.target:
      rtt = responses_to_target(study.records[r.run], study.metric, target, study.opts.window)
      ttt = rtt / r.throughput if r.throughput > 0 else math.nan
    d = out.setdefault(r.config, {"rtt": [], "ttt": [], "final": [], "run": []})
    d["rtt"].append(rtt)
    d["ttt"].append(ttt)
    d["final"].append(r.final)
    d["run"].append(r.run)
  return out


_DESCRIBE = ["label", "kind", "P", "G", "responses_per_step", "B", "B_prompts", "num_minibatches",
             "lr_rule", "lr",
             "chips", "B0"]


def config_table(study: Study, target: float | None = None) -> pd.DataFrame:
  """One row per configuration: responses and time to target (stat over seeds, stratified
  bootstrap interval), final metric, throughput, B_simple, and the ratios to its reference."""
  used = study.used()
  if used.empty:
    return pd.DataFrame()
  o = study.opts
  vals = seed_values(study, target)
  first = used.groupby("config").first()
  agg = used.groupby("config").agg(n_seeds=("run", "size"), throughput=("throughput", "median"),
                                   b_simple=("b_simple", "mean"), final_best=("final", "max"),
                                   responses=("responses_seen", "max"))
  table = first[_DESCRIBE].join(agg)
  for col in ("rtt", "ttt", "final"):
    groups = {c: _finite_or_inf(v[col]) for c, v in vals.items()}
    groups = {c: v for c, v in groups.items() if len(v)}
    iv = stats.stratified_bootstrap(groups, o.stat, o.reps, seed=o.seed)
    for j, suffix in enumerate(("", "_lo", "_hi")):
      table[col + suffix] = [iv[c][j] if c in iv else math.nan for c in table.index]
  table = table.reset_index().sort_values(["kind", "lr_rule", "B", "P"]).reset_index(drop=True)
  _add_references(table, study, vals)
  return table


def _finite_or_inf(values) -> np.ndarray:
  """NaN (no timing) dropped; inf (never reached) kept."""
  v = np.asarray(values, float)
  return v[~np.isnan(v)]


def main_group_size(table: pd.DataFrame, kind: str) -> int:
  return int(table[table.kind == kind].G.mode().iloc[0])


def reference_of(table: pd.DataFrame, kind: str, rule: str) -> tuple[str | None, str]:
  """The reference configuration of (kind, LR rule): B == B0 with that rule, else at B0 with
  another rule (every rule gives the same lr at B0), else the B closest to B0 (said so)."""
  same = table[table.kind == kind]
  if same.empty:
    return None, "no configuration"
  b0 = float(same.B0.mode().iloc[0])
  g = main_group_size(table, kind)
  def best(c):  # the main G, then the most seeds, then the longest runs (not a tuning stage's)
    return c.assign(_g=(c.G != g), _s=-c.n_seeds, _r=-c.responses).sort_values(
        ["_g", "_s", "_r"]).iloc[0].config
  at_b0 = same[same.B == b0]
  if len(at_b0[at_b0.lr_rule == rule]):
    return best(at_b0[at_b0.lr_rule == rule]), f"B0={b0:g}"
  if len(at_b0):
    return best(at_b0), f"B0={b0:g} (run with another LR rule: the same lr at B0)"
  rule_rows = same[same.lr_rule == rule] if len(same[same.lr_rule == rule]) else same
  dist = (np.log(rule_rows.B) - math.log(b0)).abs()
  near = rule_rows[dist == dist.min()]
  return best(near), f"no run at B0={b0:g}: the closest batch B={near.B.iloc[0]} stands in"


def _add_references(table: pd.DataFrame, study: Study, vals: dict):
  o = study.opts
  cols = {k: [] for k in ("reference", "reference_note", "rtt_ratio", "rtt_ratio_lo",
                          "rtt_ratio_hi", "ttt_ratio", "ttt_ratio_lo", "ttt_ratio_hi",
                          "rtt_different", "ttt_different")}
  for _, row in table.iterrows():
    ref, note = reference_of(table, row.kind, row.lr_rule)
    cols["reference"].append(ref)
    cols["reference_note"].append(note)
    refrow = table[table.config == ref].iloc[0]
    for col in ("rtt", "ttt"):
      a, b = _finite_or_inf(vals[row.config][col]), _finite_or_inf(vals[ref][col])
      if len(a) and len(b) and not (np.isinf(a).all() and np.isinf(b).all()):
        r = stats.ratio_interval(a, b, o.stat, o.reps, seed=o.seed)
      else:
        r = (math.nan,) * 3
      for j, suffix in enumerate(("", "_lo", "_hi")):
        cols[f"{col}_ratio{suffix}"].append(r[j])
      own = (row[col], row[col + "_lo"], row[col + "_hi"])
      theirs = (refrow[col], refrow[col + "_lo"], refrow[col + "_hi"])
      cols[f"{col}_different"].append(row.config != ref and not stats.overlaps(own, theirs))
  for k, v in cols.items():
    table[k] = v


def _mark_duplicates(study: Study):
  """The same configuration and seed in two stages (e.g. B0 in the LR stage and in the batch
  stage) counts once: a repeated seed would narrow the interval without new evidence."""
  runs = study.runs
  ok = runs[(runs.problem == "") & runs.seed.notna()]
  dup = ok.duplicated(["config", "seed"], keep="first")
  for i in ok.index[dup]:
    first = ok[(ok.config == ok.config[i]) & (ok.seed == ok.seed[i])].run.iloc[0]
    runs.loc[i, "problem"] = f"duplicate of {first} (same configuration and seed)"


def config_curve(study: Study, config: str, runs: pd.DataFrame | None = None) -> pd.DataFrame:
  """The configuration's curve over seeds: median and min-max band at its evaluation points."""
  runs = study.used() if runs is None else runs
  ids = list(runs[runs.config == config].run)
  curves = [eval_curve(study.records[i], study.metric) for i in ids]
  curves = [c for c in curves if c[0].size]
  if not curves:
    return pd.DataFrame(columns=["responses_seen", "median", "lo", "hi", "seeds"])
  x = max(curves, key=lambda c: c[0].size)[0]
  ys = np.array([np.where((x >= cx[0]) & (x <= cx[-1]), np.interp(x, cx, cy), np.nan)
                 for cx, cy in curves])
  with np.errstate(all="ignore"):
    return pd.DataFrame({"responses_seen": x, "median": np.nanmedian(ys, 0),
                         "lo": np.nanmin(ys, 0), "hi": np.nanmax(ys, 0), "seeds": len(curves)})


def curve_gap(a: pd.DataFrame, b: pd.DataFrame, window: int = 3) -> float:
  """Largest |a - b| of the smoothed median curves at the responses_seen both cover."""
  if a.empty or b.empty:
    return math.nan
  sa = fits.smooth(a["median"].to_numpy(), window)
  sb = fits.smooth(b["median"].to_numpy(), window)
  lo = max(a.responses_seen.min(), b.responses_seen.min())
  hi = min(a.responses_seen.max(), b.responses_seen.max())
  x = a.responses_seen.to_numpy()
  keep = (x >= lo) & (x <= hi) & np.isfinite(sa)
  if not keep.any():
    return math.nan
  return float(np.max(np.abs(sa[keep] - np.interp(x[keep], b.responses_seen, sb))))

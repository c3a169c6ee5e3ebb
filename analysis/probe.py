"""The critical batch at a point of training, from branched runs (launch/cbs_probe.py).

    python analysis/probe.py RUN_DIR/probe --run=RUN_DIR        # writes RUN_DIR/probe/report/

Merrill et al. 2025 ("Critical Batch Size Revisited") measure it locally: from one checkpoint,
short continuations at several batches, each with the learning rate its rule gives; the
critical batch is where a larger batch stops making the same progress per sample. Here:

- Progress is the branch's held-out metric (the one it was scored on, eval/reference_prob by
  default: the mean probability of each held-out problem's reference response, teacher forced;
  eval/accuracy_sampled to compare with a study) against the responses the branch generated.
  The reference likelihood has no evaluation noise: one forward pass, no sampling, the same
  problems for every branch; what differs between seeds is the training itself.
- Every branch of a point starts from the same checkpoint, so their first evaluations agree
  (`m0`; a sampled metric's within each seed); a disagreement is reported (branches of
  different checkpoints mixed up).
- The gain to reach is `gain` x the least median gain any batch's seeds made over the budget
  (the largest batch's, when progress per sample falls with B): that batch reaches it at about
  `gain` of its budget and every other batch sooner, so every batch's E is measured, none
  censored at the budget.
- E(B, seed): the responses a branch took to gain that much, the first crossing of its
  evaluations (rlscale/metrics/crossing.py, the study's reading); inf when
  it never did.
- B_crit: `analysis.fits.critical_batch` on {B: E per seed}, the study's estimator: E = E_min
  (1 + B/B_crit), its interval from resampling the seeds, and "not identified" with its
  reasons when the data do not pin it down (fewer than 3 seeds, E not growing, B_crit beyond
  the batches tried: then a bound).

B_simple of the run at the branch point (the probe's parent) is read as the study reads it
(`study_table.b_simple_in` over the steps in [S/2, 3S/2]), response- and prompt-level.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

import numpy as np

from analysis import fits, study_table
from analysis import runs as runs_lib

METRIC = "eval/reference_prob"
SAMPLED = ("eval/accuracy_sampled",)  # metrics whose first evaluation differs between seeds
# The gains the report also reads B_crit at: where it moves with the gain, the branches' curves
# are not one curve stretched by 1 + B/B_crit (the law's premise), and the seeds' interval
# understates what is known.
# (Not 1: the least-progress batch's median would sit at its last evaluation, and its slower
# seeds would never reach the gain: censored.)
SENSITIVITY = (0.25, 0.5, 0.75)


def by_rate(curves_by_batch: dict) -> dict[int, dict[float, list]]:
  """{B: {lr: [curve per seed]}}: a probe's curves by batch and rate. A batch's plain list of
  curves (one rate, or rates not told) is read as one rate, nan."""
  out = {}
  for b, cs in curves_by_batch.items():
    rates = cs if isinstance(cs, dict) else {math.nan: cs}
    out[int(b)] = {float(lr): [list(c) for c in v] for lr, v in rates.items()}
  return out


def gain_target(curves_by_batch: dict, gain: float) -> tuple[float, float]:
  """(m0, the value to reach): m0 is the branches' common first value; the value to reach is
  m0 + gain x the least, over batches, of the median final gain of the batch's seeds (at the
  batch's rate whose median final gain is the largest, where it ran several)."""
  if not 0 < gain <= 1:
    raise ValueError(f"gain={gain}: must be in (0, 1]")
  scanned = by_rate(curves_by_batch)
  firsts = [c[0][1] for rs in scanned.values() for cs in rs.values() for c in cs if c]
  if not firsts:
    raise ValueError("no branch has an evaluation")
  m0 = float(np.median(firsts))
  least = min(max(float(np.median([c[-1][1] - m0 for c in cs if c])) for cs in rs.values()
                  if any(cs))
              for rs in scanned.values() if any(any(cs) for cs in rs.values()))
  return m0, m0 + gain * least


def choose_rates(e: dict[int, dict[float, list]], finals: dict[int, dict[float, list]]
                 ) -> tuple[dict[int, float], list[int]]:
  """({B: its rate}, [B whose rate is at an edge of its scan]): per batch the study's rule
  (rlscale/study/study.choose: the median over seeds, the rate nearest the minimum of a
  parabola in log rate, else the fewest median responses); a batch of one rate keeps it."""
  from rlscale.study import study
  chosen, edge = {}, []
  for b, rates in e.items():
    if len(rates) == 1:
      chosen[b] = next(iter(rates))
      continue
    runs = [{"overrides": {"lr": lr}, "final": f,
             "responses_to_target": v if math.isfinite(v) else None}
            for lr in rates for v, f in zip(rates[lr], finals[b][lr])]
    chosen[b], _ = study.choose(runs, "lr")
    if chosen[b] in (min(rates), max(rates)):
      edge.append(b)
  return chosen, edge


def estimate(curves_by_batch: dict, gain: float = 0.5, min_seeds: int = 3,
             reps: int = 1000, seed: int = 0, spread: float | None = None,
             target: float | None = None) -> dict[str, Any]:
  """B_crit at one branch point from each batch's branch curves [(responses, value), ...] (one
  per seed, the branch point first), either a list per batch (one rate) or {lr: list} per
  batch (a rate scan: E at each batch is read at its own best rate, `choose_rates`). Returns
  fits.critical_batch's dict (b_crit, its interval, identified, reasons, n seeds per batch)
  with m0, the target, the E per seed at each batch's rate, the rates and `spread`, the largest
  difference between the branches' first values (given: `start_spread`'s, for a sampled metric).
  A batch whose best rate is at the edge of its scan leaves B_crit not identified: its E is the
  rate's, not the batch's. `target`: the value to reach, given (a study's target) instead of
  `gain` of the least median gain."""
  scanned = by_rate(curves_by_batch)
  if target is None:
    m0, target = gain_target(scanned, gain)
  else:
    m0, _ = gain_target(scanned, 1.0)
  firsts = [c[0][1] for rs in scanned.values() for cs in rs.values() for c in cs if c]
  spread = float(max(firsts) - min(firsts)) if spread is None else spread
  cross = lambda c: fits.first_crossing([x for x, _ in c], [y for _, y in c], target)  # noqa: E731
  e_all = {b: {lr: [cross(c) for c in cs] for lr, cs in rs.items()} for b, rs in scanned.items()}
  finals = {b: {lr: [c[-1][1] for c in cs] for lr, cs in rs.items()} for b, rs in scanned.items()}
  chosen, edge = choose_rates(e_all, finals)
  e = {b: e_all[b][chosen[b]] for b in e_all}
  rates = dict(lr={str(b): chosen[b] for b in sorted(chosen)}, rate_edge=sorted(edge),
               rates_per_batch=max(len(rs) for rs in scanned.values()),
               responses_to_gain_by_rate={str(b): {f"{lr:.6g}": v for lr, v in rs.items()}
                                          for b, rs in e_all.items()})
  if target <= m0:
    why = (f"a batch made no progress (least median gain {(target - m0) / gain:.3g} from "
           f"{m0:.3g}): drop it or give the branches more responses" if gain else
           f"the target {target:.3g} is not above the branch point's {m0:.3g}")
    out = dict(batches=sorted(map(float, e)), n=[len(e[b]) for b in sorted(e)], identified=False,
               reasons=[why])
  else:
    out = dict(fits.critical_batch(e, reps=reps, seed=seed, min_seeds=min_seeds))
    out.pop("b_crit_draws", None), out.pop("e_min_draws", None)
    failed = out.get("failed_reps", 0) / reps
    if failed > 0.05:  # the reps left out are those where a batch's median never got there
      out["reasons"].append(f"{failed:.0%} of the bootstrap reps had a batch whose median never "
                            "reached the value (censored by the budget)")
      out["identified"] = False
  if spread > 1e-6 * max(1.0, abs(m0)):
    out["reasons"].append(f"the branches' first evaluations differ by {spread:.3g}: they did not "
                          "all start from one checkpoint")
    out["identified"] = False
  if edge:
    out["reasons"].append(
        "the best rate is at the edge of its scan at B = " + ", ".join(map(str, sorted(edge)))
        + ": E there is the rate's, not the batch's (scan further)")
    out["identified"] = False
  return dict(out, m0=m0, target=target, gain=gain, spread=spread, **rates,
              responses_to_gain={str(b): v for b, v in e.items()})


def rate_rule(e_by_batch: dict, lr_by_batch: dict[int, float], level: float = 0.95,
              tolerance: float = 0.2) -> dict[str, Any] | None:
  """Does progress per step follow the rate alone? E x lr / B per batch (median E over its
  seeds): constant when every step makes progress in proportion to its rate whatever the
  batch, so that E(B) is the rule's B / lr(B) and says nothing of gradient noise. Constant when
  its batches differ by no more than the seeds' noise explains (the chi-square of log(E lr / B)
  about its weighted mean, each median's standard error from the seed spread pooled over
  batches, fits._log_median_se, below its `level` quantile on K - 1 degrees of freedom) or by
  no more than `tolerance` (largest / smallest <= 1 + tolerance: within what the study calls
  invariant; the probe's metric has so little noise that a 10% difference is significant). None
  when the rates do not vary with B (a fixed rate: there E x lr / B constant is E proportional
  to B, which the fit itself reads) or when a batch has no finite median."""
  import scipy.stats as sps
  batches = sorted(int(b) for b in e_by_batch)
  lrs = [float(lr_by_batch[b]) for b in batches]
  if len(batches) < 3 or max(lrs) <= min(lrs) * (1 + 1e-9):
    return None
  seeds = [np.asarray(e_by_batch[b] if b in e_by_batch else e_by_batch[str(b)], float)
           for b in batches]
  med = np.array([np.median(v) for v in seeds])
  if not np.all(np.isfinite(med)) or np.any(med <= 0):
    return None
  q = med * np.array(lrs) / np.array(batches, float)
  se = fits._log_median_se(seeds)
  spread = float(q.max() / q.min())
  out = dict(batches=batches, lr=lrs, e_lr_over_b=[float(v) for v in q], spread=spread)
  within = spread <= 1 + tolerance
  if not np.all(np.isfinite(se)) or np.any(se <= 0):
    return dict(out, chi2=math.nan, dof=len(batches) - 1, constant=within)
  w = 1 / se ** 2
  logq = np.log(q)
  centre = float(np.sum(w * logq) / np.sum(w))
  chi2 = float(np.sum(w * (logq - centre) ** 2))
  dof = len(batches) - 1
  return dict(out, chi2=chi2, dof=dof,
              constant=bool(within or chi2 <= sps.chi2.ppf(level, dof)))


def _short(est: dict[str, Any]) -> str:
  if est.get("identified"):
    return f"{est['b_crit']:.3g} [{est['b_crit_lo']:.3g}, {est['b_crit_hi']:.3g}]"
  bound = est.get("bound")
  return f"n.i. ({'>' if bound[0] == 'lower' else '<'} {bound[1]:.3g})" if bound else "n.i."


def text(est: dict[str, Any]) -> str:
  """B_crit with its interval and seeds, or 'not identified (reasons)' and the bound; where
  the branches ran at a rule's rates, E x lr / B per batch beside it; after a rate scan, the
  rate each batch's E was read at."""
  rule = est.get("rate_rule")
  per = ("" if not rule else "; E x lr / B per batch " + ", ".join(
      f"{b}: {v:.3g}" for b, v in zip(rule["batches"], rule["e_lr_over_b"])))
  if est.get("rates_per_batch", 1) > 1:
    per += (f"; each batch at its best of {est['rates_per_batch']} rates: "
            + ", ".join(f"{b}: {lr:.3g}" for b, lr in est["lr"].items()))
  return _text(est) + per


def _text(est: dict[str, Any]) -> str:
  seeds = "/".join(str(n) for n in est.get("n", []))
  if est.get("identified"):
    return (f"B_crit {est['b_crit']:.3g} responses (95% interval {est['b_crit_lo']:.3g}-"
            f"{est['b_crit_hi']:.3g}, seeds per batch {seeds})")
  bound = est.get("bound")
  b = (f"; B_crit {'>' if bound[0] == 'lower' else '<'} {bound[1]:.3g}" if bound else "")
  return f"not identified ({'; '.join(est['reasons'])}){b} (seeds per batch {seeds})"


# --- reading a probe's branches -----------------------------------------------------------------

def branch_dirs(probe_dir: str) -> list[str]:
  """The finished branches of every step_<S>/ sweep of the probe."""
  steps = sorted((d for d in os.listdir(probe_dir) if d.startswith("step_")),
                 key=lambda d: int(d[5:]) if d[5:].isdigit() else -1)
  return runs_lib.expand([os.path.join(probe_dir, d) for d in steps
                          if os.path.exists(os.path.join(probe_dir, d, "sweep.json"))])

def branches(probe_dir: str) -> list:
  """The finished branches of the probe, each read once (analysis/runs.load)."""
  return [runs_lib.load(path) for path in branch_dirs(probe_dir)]


def branch_metric(probe_dir: str, runs: list | None = None) -> str:
  """The metric the probe's branches were scored on (their target.metric: launch/cbs_probe.py's
  --metric), METRIC when no branch says. `runs`: `branches(probe_dir)`, when already read."""
  for run in branches(probe_dir) if runs is None else runs:
    metric = run.config.get("target", {}).get("metric")
    if metric:
      return metric
  return METRIC


def start_spread(probe_dir: str, metric: str, runs: list | None = None) -> dict[int, float]:
  """{branch step: the largest difference between the first evaluations of branches of one
  seed}. A sampled metric's first evaluation differs between seeds (each seed draws its own
  responses) and agrees within one (the same weights and evaluation key at every batch and
  rate): branches of different checkpoints still show."""
  firsts: dict[int, dict[int, list[float]]] = {}
  for run in branches(probe_dir) if runs is None else runs:
    curve = run.curve(metric)
    if curve:
      firsts.setdefault(int(run.config["init"]["branch_step"]), {}).setdefault(
          int(run.config.get("seed", 0)), []).append(curve[0][1])
  return {step: max(max(v) - min(v) for v in by_seed.values())
          for step, by_seed in firsts.items()}


def load(probe_dir: str, metric: str = METRIC,
         runs: list | None = None) -> dict[int, dict[int, dict[float, list]]]:
  """{branch step: {B: {effective learning rate: [curve per finished seed]}}} of the probe's
  finished branches; a curve is [(responses generated since the branch, value)] with the
  branch point first."""
  from rlscale.rl import optim
  from rlscale.study.probe import round_rate
  out: dict[int, dict[int, dict[float, list]]] = {}
  for run in branches(probe_dir) if runs is None else runs:
    step = int(run.config["init"]["branch_step"])
    lr = round_rate(optim.scale(run.config["optim"], run.batch).lr)
    curve = run.curve(metric)
    if curve:
      out.setdefault(step, {}).setdefault(run.batch, {}).setdefault(lr, []).append(curve)
  return out


def single_rates(curves: dict[int, dict[float, list]]) -> dict[int, float]:
  """{B: its rate} where every batch ran one rate (the rule's); {} after a rate scan."""
  if any(len(rs) != 1 for rs in curves.values()):
    return {}
  return {b: next(iter(rs)) for b, rs in curves.items()}


def follows_rule(est: dict[str, Any], lr_by_batch: dict[int, float]) -> dict[str, Any]:
  """`est` with the rate-rule check (rate_rule) of its responses to gain; where progress per
  step follows the rate within the seeds' noise, B_crit is not identified: the E(B) the fit
  read is the rule's B / lr(B), not gradient noise."""
  e = {int(b): v for b, v in est.get("responses_to_gain", {}).items()}
  if not e or set(e) - set(lr_by_batch):
    return est
  rule = rate_rule(e, lr_by_batch)
  if rule is None:
    return est
  out = dict(est, rate_rule=rule)
  if rule.get("constant"):
    out["identified"] = False
    out["reasons"] = list(est.get("reasons", [])) + [
        "progress follows the rate rule here: E x lr / B is constant within its noise or "
        f"within 20% (largest / smallest {rule['spread']:.2f}; chi-square {rule['chi2']:.3g} "
        f"on {rule['dof']} dof); no critical batch is identified"]
  return out


def cost(probe_dir: str, parent_dir: str) -> dict[str, Any]:
  """Responses generated and seconds taken by the branches of each point, beside the parent's."""
  parent = runs_lib.load(parent_dir)
  seen = [runs_lib.responses(r) for r in parent.rows if runs_lib.responses(r) is not None]
  parent_resp = parent.summary.get("responses_seen") or (seen[-1] if seen else math.nan)
  parent_s = parent.summary.get("wall_time", math.nan)
  by_step: dict[int, dict[str, float]] = {}
  for path in branch_dirs(probe_dir):
    run = runs_lib.load(path)
    c = by_step.setdefault(int(run.config["init"]["branch_step"]),
                           {"responses": 0.0, "seconds": 0.0, "branches": 0})
    c["responses"] += run.summary.get("responses_seen", 0)
    c["seconds"] += run.summary.get("wall_time", 0.0)
    c["branches"] += 1
  for c in by_step.values():
    c["of_parent_responses"] = c["responses"] / parent_resp
    c["of_parent_seconds"] = c["seconds"] / parent_s
  return {"parent_responses": parent_resp, "parent_seconds": parent_s, "by_step": by_step}


def parent_noise(parent_dir: str, step: int) -> dict[str, float]:
  """The parent's B_simple in responses over steps [S/2, 3S/2], prompt- and response-level (nan
  where it logged none, inf where |G|^2 was not positive)."""
  run = runs_lib.load(parent_dir)
  per = run.plan.responses
  lo, hi = per * step / 2, per * step * 1.5
  return {f"b_simple_{unit}": study_table.b_simple_in(run, lo, hi, unit)
          for unit in ("prompts", "responses")}


def analyse(probe_dir: str, parent_dir: str, metric: str | None = METRIC, gain: float = 0.5,
            min_seeds: int = 3, target: float | None = None) -> dict[str, Any]:
  """Every branch point's estimate, the parent's B_simple there and the probe's cost; `metric`
  None: the one the branches were scored on (branch_metric). Each branch is read once.
  `target`: the value to reach (a study's), read also half and three quarters of the way to it
  from the branch point; else `gain` of the least median gain, read also at SENSITIVITY.
  Branches at rates chosen per batch (optim.lr_scaling "none", launch/cbs_probe.py
  --rates_from) are at each batch's best rate, where E x lr / B is constant by construction:
  the rate-rule check is not made there."""
  points = {}
  runs = branches(probe_dir)
  metric = metric or branch_metric(probe_dir, runs)
  within_seed = start_spread(probe_dir, metric, runs) if metric in SAMPLED else {}
  ruled = any(r.config.get("optim", {}).get("lr_scaling", "none") != "none" for r in runs)
  for step, curves in sorted(load(probe_dir, metric, runs).items()):
    lrs = single_rates(curves) if ruled else {}  # a rate scan: each batch at its best rate
    kw = dict(min_seeds=min_seeds, spread=within_seed.get(step))
    if target is None:
      levels = {g: dict(gain=g) for g in SENSITIVITY if g != gain}
      est = follows_rule(estimate(curves, gain=gain, **kw), lrs)
    else:
      m0, _ = gain_target(by_rate(curves), 1.0)
      levels = {float(f"{m0 + f * (target - m0):.3g}"): dict(gain=None, target=m0 + f * (target - m0))
                for f in (0.5, 0.75)}
      est = follows_rule(estimate(curves, gain=None, target=target, **kw), lrs)
    others = {g: follows_rule(estimate(curves, **how, **kw), lrs) for g, how in levels.items()}
    span = [e for e in [est, *others.values()] if e.get("identified")]  # the advisor's interval
    points[step] = dict(est, **parent_noise(parent_dir, step), text=text(est),
                        at_other_gains={str(g): _short(e) for g, e in others.items()},
                        identified_gains=[str(g) for g, e in
                                          [(gain if target is None else target, est),
                                           *others.items()] if e.get("identified")],
                        span_lo=min((e["b_crit_lo"] for e in span), default=math.nan),
                        span_hi=max((e["b_crit_hi"] for e in span), default=math.nan))
  return {"metric": metric, "gain": gain if target is None else None, "target": target,
          "parent": parent_dir, "points": points, "cost": cost(probe_dir, parent_dir)}


def write(result: dict[str, Any], out: str) -> list[str]:
  """probe.json, report.md and the figure (B_crit against the branch step) under `out`."""
  import pandas as pd
  from analysis import figures
  os.makedirs(out, exist_ok=True)
  paths = [os.path.join(out, "probe.json"), os.path.join(out, "report.md")]
  with open(paths[0], "w") as f:
    json.dump(result, f, indent=1, default=_json)
  reach = (f"the value to reach is {result['target']:g} (given), read also half and three "
           "quarters of the way to it from the branch point ('at other gains': the value)"
           if result.get("target") is not None else
           f"the gain to reach at each point is {result['gain']:g} x the least median gain of a "
           "batch over the budget")
  rows, lines = [], [f"# Critical-batch probe of {result['parent']}", "",
                     f"Progress: `{result['metric']}`; {reach}; seeds per batch beside each "
                     "B_crit.", "",
                     "| step | B_crit (responses) | at other gains | B_simple, prompt-level x G "
                     "| B_simple, response-level | responses of the branches / the run's |",
                     "| --- | --- | --- | --- | --- | --- |"]
  for step, p in result["points"].items():
    c = result["cost"]["by_step"].get(step, {})
    other = "; ".join(f"{g}: {v}" for g, v in p["at_other_gains"].items())
    lines.append(f"| {step} | {p['text']} | {other} | {p['b_simple_prompts']:.3g} | "
                 f"{p['b_simple_responses']:.3g} | {c.get('of_parent_responses', math.nan):.2f} |")
    if p.get("identified"):
      rows.append(dict(panel="", series="B_crit (probe)", x=step, y=p["b_crit"],
                       lo=p["b_crit_lo"], hi=p["b_crit_hi"], style="line"))
    elif p.get("bound"):
      rows.append(dict(panel="", series=f"B_crit {p['bound'][0]} bound (not identified)", x=step,
                       y=p["bound"][1], style="points"))
    for unit in ("prompts", "responses"):
      v = p[f"b_simple_{unit}"]
      if math.isfinite(v):
        what = "prompt-level x G" if unit == "prompts" else "response-level"
        rows.append(dict(panel="", series=f"B_simple of the run ({what})", x=step, y=v,
                         style="dashed"))
  with open(paths[1], "w") as f:
    f.write("\n".join(lines) + "\n")
  if rows:
    data = pd.DataFrame(rows)
    fig = figures.lines(data, "training step of the branch point", "critical batch (responses)",
                        logy=True)
    paths += figures.save(fig, data, out, "bcrit_vs_step")
  return paths


def _json(v):
  if isinstance(v, (np.floating, np.integer)):
    return v.item()
  if isinstance(v, np.ndarray):
    return v.tolist()
  raise TypeError(type(v))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("probe_dir", help="the probe's directory (step_<S>/ sweeps inside)")
  ap.add_argument("--run", required=True, help="the run the probe branched")
  ap.add_argument("--out", default=None, help="default: <probe_dir>/report")
  ap.add_argument("--metric", default=None,
                  help="the branches' progress (default: the metric they were scored on, their "
                       f"target.metric; {METRIC} for branches that do not say)")
  ap.add_argument("--gain", type=float, default=0.5,
                  help="fraction of the least median gain over batches to reach")
  ap.add_argument("--target", type=float, default=None,
                  help="the value of the metric to reach instead (a study's target)")
  a = ap.parse_args(argv)
  if not os.path.isdir(a.probe_dir):
    print(f"error: {a.probe_dir} is not a directory", file=sys.stderr)
    return 2
  result = analyse(a.probe_dir, a.run, a.metric, a.gain, target=a.target)
  if not result["points"]:
    print(f"error: no finished branch under {a.probe_dir}", file=sys.stderr)
    return 2
  paths = write(result, a.out or os.path.join(a.probe_dir, "report"))
  for step, p in result["points"].items():
    print(f"step {step}: {p['text']}; at other gains {p['at_other_gains']}; "
          f"B_simple at the run: prompt-level x G "
          f"{p['b_simple_prompts']:.3g}, response-level {p['b_simple_responses']:.3g}")
  print("wrote " + ", ".join(paths))
  return 0


if __name__ == "__main__":
  sys.exit(main())

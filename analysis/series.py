"""Batch series: which configuration stands for each batch B when a question is asked of B.

A series maps B to one configuration of one kind at its main G, with a reference at B0:
- "chosen lr (RULE)": at each B the learning rate a study chose for it (study.json), named
  after the rule it chose by (its `chosen` entry's `rule`; "chosen lr" when the entry has
  none), else "chosen lr (on the verdict seeds)": the configuration with the fewest median
  responses to target among those run at that B, on the seeds the verdict uses. It is not the
  best rate: it is the rate that rule picked on a few seeds (its `chosen` attribute is set);
- "fixed lr X": the configurations run at one lr X at B0 and at other batches (a fixed rate);
- "<rule> from lr X": runs whose lr followed a scaling rule (sqrt, linear) from a base lr X.
Only verdict configurations (stats over seeds no stage chose with) enter a series. Runs with
dynamic sampling (rollout.dynamic_sampling: groups without signal dropped and refilled) and
without it make separate series; the former's names end in "filtered". So do runs of each
staleness bound and off-policy correction (rollout.max_staleness = k, rl.off_policy_correction):
their names end in "k=2" and the correction's name, k = 0 without one as before.
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pandas as pd

from analysis import study_table as st
from rlscale.rl import off_policy


@dataclasses.dataclass
class Series:
  kind: str
  name: str
  configs: dict[int, str]  # B -> configuration
  reference: str  # the configuration at B0 (or the closest B, said in `note`)
  b0: int
  note: str = ""
  filtered: bool = False  # dynamic sampling on (the name ends in " filtered")
  staleness: int = 0  # rollout.max_staleness (the name ends in " k=<k>" when > 0)
  correction: str = "none"  # rl.off_policy_correction (named when not "none")
  chosen: bool = False  # the chosen-lr series (a rate chosen per B), whatever its name
  # B -> (log E(B, chosen) - log E(B, optimum), minus the reference's; the variance of that
  # difference): the joint fit's reading at the fitted optimum (rlscale/study/lr_fit.py).
  shift: dict = dataclasses.field(default_factory=dict)

  def rows(self, table: pd.DataFrame) -> pd.DataFrame:
    """The series' rows of the configuration table, by B."""
    t = table.set_index("config")
    return t.loc[[self.configs[b] for b in sorted(self.configs)]].reset_index()


CHOSEN = "chosen lr"
OFF_POLICY = off_policy.CORRECTIONS[1:]  # rl.off_policy_correction's names, as series end
_LEGACY = "best lr"  # the chosen series' name before it was named after its rule


def is_chosen(name: str) -> bool:
  """Whether a series name (as in the invariance rows) is a chosen-lr series'."""
  return name.startswith((CHOSEN, _LEGACY))


_TAIL = re.compile(r"( filtered)?( k=\d+)?( [a-z]+)?$")  # series(): what a name's end says


def is_plain(name: str) -> bool:
  """Whether a series name is of runs without dynamic sampling, at k = 0 and without an
  off-policy correction (its name carries none of series()'s endings)."""
  m = _TAIL.search(name)
  tail = m.group(0) if m else ""
  return not (" filtered" in tail or " k=" in tail
              or (m and m.group(3) and m.group(3).strip() in OFF_POLICY))


def chosen_rule(study: st.Study, kind: str) -> str | None:
  """How a study stage of `kind` chose its lr per B: its study.json entry's `rule` ("" when
  the entry has none), None when no stage of `kind` chose one."""
  runs = study.runs
  for choice in study.record.get("chosen", {}).values():
    stage_runs = runs[(runs.stage == choice.get("stage")) & (runs.problem == "")]
    if not stage_runs.empty and set(stage_runs.kind) == {kind} and choice.get("per") == ["p"]:
      return str(choice.get("rule") or "")
  return None


def chosen_name(rule: str | None) -> str:
  """The chosen series' name: after the rule a study chose by, "chosen lr" when its record
  says none, "chosen lr (on the verdict seeds)" when the report chose (rule None)."""
  if rule is None:
    return f"{CHOSEN} (on the verdict seeds)"
  return f"{CHOSEN} ({rule})" if rule else CHOSEN


RUNNER_UP = "runner-up lr"


def choice_of(study: st.Study, kind: str) -> dict | None:
  """The study.json `chosen` entry of the stage that chose `kind`'s lr per P, None when none."""
  runs = study.runs
  for choice in study.record.get("chosen", {}).values():
    stage_runs = runs[(runs.stage == choice.get("stage")) & (runs.problem == "")]
    if not stage_runs.empty and set(stage_runs.kind) == {kind} and choice.get("per") == ["p"]:
      return choice
  return None


def joint_shift(study: st.Study, kind: str, b0: float) -> dict[int, tuple[float, float]]:
  """B -> (the joint fit's correction at B minus at B0, the variance of that difference over
  redrawn scan seeds), from the choice's `joint` record; {} without an identified joint fit or
  without B0 among its batches."""
  joint = (choice_of(study, kind) or {}).get("joint") or {}
  if not joint.get("identified"):
    return {}
  order = joint["order"]
  cov = np.asarray(joint["covariance"], float)
  at = {int(joint["batches"][g]): i for i, g in enumerate(order)}
  if int(b0) not in at:
    return {}
  i0, c = at[int(b0)], [joint["correction"][g] for g in order]
  return {b: (c[i] - c[i0], float(max(cov[i, i] + cov[i0, i0] - 2 * cov[i, i0], 0.0)))
          for b, i in at.items()}


def chosen_lr(study: st.Study, kind: str, field: str = "values") -> dict[int, float]:
  """P -> the effective lr of the value a study stage of `kind` chose for it (study.json; its
  runs' scaling rule applied), {} when none; field="runner_up": its runner-up's."""
  from rlscale.rl import optim
  runs = study.runs
  out = {}
  for choice in study.record.get("chosen", {}).values():
    stage_runs = runs[(runs.stage == choice.get("stage")) & (runs.problem == "")]
    if stage_runs.empty or set(stage_runs.kind) != {kind} or choice.get("per") != ["p"]:
      continue
    for group, value in choice.get(field, {}).items():
      p = int(group.split("=", 1)[1])
      at_p = stage_runs[stage_runs.P == p]
      if at_p.empty:
        continue
      r = study.records[at_p.run.iloc[0]]
      cfg = dict(r.config.get("optim", {}), lr=float(value))
      out[p] = optim.scale(cfg, r.plan.batch).lr
  return out


def _reference(kind: str, name: str, configs: dict[int, str], b0: float) -> Series:
  if b0 in configs:
    return Series(kind, name, configs, configs[int(b0)], int(b0))
  near = min(configs, key=lambda b: abs(math.log(b) - math.log(b0)))
  return Series(kind, name, configs, configs[near], int(b0),
                f"no run at B0={b0:g}: B={near} stands in")


def series(study: st.Study, table: pd.DataFrame) -> list[Series]:
  """Every series of the study's verdict configurations, the chosen lr first per kind, without
  dynamic sampling before with it."""
  out = []
  for kind in sorted(table.kind.unique()):
    g = st.main_group_size(table, kind)
    at_g = table[(table.kind == kind) & (table.G == g) & (table.tuning_seeds == 0)]
    filtered = at_g.dynamic_sampling.fillna(False).astype(bool)
    k = (at_g.max_staleness.fillna(0).astype(int) if "max_staleness" in at_g
         else pd.Series(0, index=at_g.index))
    corr = (at_g.off_policy_correction.fillna("none").astype(str)
            if "off_policy_correction" in at_g else pd.Series("none", index=at_g.index))
    parts = sorted({(bool(f), int(a), str(c)) for f, a, c in zip(filtered, k, corr)},
                   key=lambda p: (p[0], p[1], p[2] != "none", p[2]))
    for on, stale, correction in parts:
      d = at_g[(filtered == on) & (k == stale) & (corr == correction)]
      d = d[d.num_minibatches == d.num_minibatches.mode().iloc[0]]
      b0 = float(d.B0.mode().iloc[0]) if d.B0.notna().any() else float(d.B.min())
      ss = (_best(study, kind, d, b0) + _runner_up(study, kind, d, b0) + _fixed(kind, d, b0)
            + _rules(study, kind, d, b0))
      tail = ((" filtered" if on else "") + (f" k={stale}" if stale else "")
              + (f" {correction}" if correction != "none" else ""))
      for s in ss:
        s.name, s.filtered, s.staleness, s.correction = (s.name + tail, on, stale, correction)
      out += ss
  return out


def _close(a: float, b: float) -> bool:
  return abs(a - b) <= 1e-3 * max(abs(a), abs(b))


def _best(study: st.Study, kind: str, d: pd.DataFrame, b0: float) -> list[Series]:
  chosen = chosen_lr(study, kind)
  if not chosen and not (d.groupby("B").lr.nunique() > 1).any():
    return []
  configs = {}
  for b, at_b in d.groupby("B"):
    p = int(at_b.P.iloc[0])
    if p in chosen:
      hit = at_b[[_close(lr, chosen[p]) for lr in at_b.lr]]
      if len(hit):
        configs[int(b)] = hit.config.iloc[0]
      continue
    best = at_b.assign(_r=at_b.rtt.replace(np.inf, 1e300)).sort_values(["_r", "final"],
                                                                       ascending=[True, False])
    configs[int(b)] = best.config.iloc[0]
  if len(configs) < 2:
    return []
  how = ("the study's choice per B (on seeds the verdict does not use)" if chosen else
         "the fewest median responses to target per B, chosen on the same seeds the verdict "
         "uses: optimistic for the chosen lr, and what a fixed lr costs is overstated")
  s = _reference(kind, chosen_name(chosen_rule(study, kind) if chosen else None), configs, b0)
  s.chosen = True
  s.shift = joint_shift(study, kind, s.b0) if chosen else {}
  read = ("; E read at each B's fitted optimum: the chosen rate's E corrected by the joint "
          "fit, its uncertainty carried into every interval" if s.shift else "")
  s.note = "; ".join(filter(None, [f"lr: {how}{read}", s.note]))
  return [s]


def _runner_up(study: st.Study, kind: str, d: pd.DataFrame, b0: float) -> list[Series]:
  """Every B at the runner-up of the study's choice, where its verdict seeds ran it: the
  verdict at the second-best rate, so that a break is not an artefact of which of two close
  rates was chosen."""
  second = chosen_lr(study, kind, "runner_up")
  configs = {}
  for b, at_b in d.groupby("B"):
    p = int(at_b.P.iloc[0])
    hit = at_b[[_close(lr, second[p]) for lr in at_b.lr]] if p in second else at_b.iloc[:0]
    if len(hit):
      configs[int(b)] = hit.config.iloc[0]
  if len(configs) < 2 or b0 not in configs or second == chosen_lr(study, kind):
    return []  # (the joint fit's choice: one rate per B, no runner-up run)
  s = _reference(kind, RUNNER_UP, configs, b0)
  joint = ((choice_of(study, kind) or {}).get("joint") or {}).get("identified")
  s.note = ("lr: each B's own choice from its scan alone where the joint fit of E(B, lr) chose "
            "another rate (the joint fit's rate elsewhere)" if joint else
            "lr: the runner-up of the study's choice per B (the same rule, second)")
  return [s]


def _fixed(kind: str, d: pd.DataFrame, b0: float) -> list[Series]:
  """The reference's lr run at two or more other batches (three batches in all: two chosen
  rates that happen to be equal are no fixed-lr series)."""
  out = []
  at_b0 = d[d.B == b0]
  for lr in sorted(at_b0.lr.unique()):
    same = d[[_close(v, lr) for v in d.lr]]
    if same.B.nunique() >= 3:
      out.append(Series(kind, f"fixed lr {lr:.3g}",
                        {int(b): c.config.iloc[0] for b, c in same.groupby("B")},
                        same[same.B == b0].config.iloc[0], int(b0)))
  return out


def _rules(study: st.Study, kind: str, d: pd.DataFrame, b0: float) -> list[Series]:
  runs = study.verdict_runs()
  runs = runs[runs.config.isin(d.config) & (runs.lr_rule != "none")]
  out = []
  for (rule, base), g in runs.groupby(["lr_rule", "lr_base"]):
    configs = {int(b): c.config.iloc[0] for b, c in g.groupby("B")}
    if len(configs) >= 2:
      out.append(_reference(kind, f"{rule} from lr {base:.3g}", configs, b0))
  return out

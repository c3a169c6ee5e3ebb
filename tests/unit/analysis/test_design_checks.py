"""The report's design checks (analysis/sections/decision.design): each one fails when the
study breaks what it checks, and none passes by construction."""

import math
import types

import numpy as np
import pandas as pd
import pytest

from analysis import study_table as st
from analysis.sections import decision
from analysis.sections.types import Section

BS = [8, 16, 32, 64, 128, 256]


def _study(**target):
  runs = pd.DataFrame([dict(config=f"c{b}", label=f"grpo B={b}", responses_to_target=1000.0 + s,
                            drop_after_target=0.0, final=0.55)
                       for b in BS for s in range(10)])
  t = dict(metric="eval/accuracy_sampled", value=0.41, base=0.15, plateau=0.5, stage="target")
  t.update(target)
  return types.SimpleNamespace(opts=st.Options(), record={"target": t}, target=t["value"],
                               runs=runs, verdict_runs=lambda: runs)


def _done(steps=12.0, seeds=10, edge=False):
  rows = pd.DataFrame([dict(kind="grpo", series="chosen lr", B=b, config=f"c{b}",
                            steps=steps if b == 256 else 40.0, seeds=seeds,
                            is_reference=b == 16) for b in BS])
  lr = pd.DataFrame({"B": BS, "at_edge": [edge] + [False] * 5, "tried": [5] * 6})
  return {"invariance": Section("i", facts={"rows": rows}),
          "learning_rate": Section("l", tables=[("grpo: lr per B (chosen: ...)", lr)])}


def _table(clip=0.0, fractions=None):
  fractions = fractions or [0.0] * len(BS)
  return pd.DataFrame({"config": [f"c{b}" for b in BS], "B": BS, "grad_clip": clip,
                       "clip_fraction": fractions, "grad_norm": 1.0})


def _checks(study=None, table=None, done=None):
  sec = decision.design(study or _study(), _table() if table is None else table,
                        done or _done())
  return {name: ok for name, ok, _ in sec.facts["checks"]}


def test_a_sound_study_passes_every_check():
  checks = _checks()
  assert all(checks.values()), checks
  assert len(checks) == 9, checks  # every check ran, the rate-edge one included
  assert "grpo: every chosen lr inside its scan" in checks


@pytest.mark.parametrize("name, broken", [
    ("target set before the rates were scanned",
     dict(study=lambda: _study(stage="grpo_lr"))),
    ("target well above the base", dict(study=lambda: _study(base=0.35))),
    ("grpo chosen lr: the largest batch is not a transient", dict(done=lambda: _done(8.0))),
    ("grpo chosen lr: the largest batch is not a transient",
     dict(done=lambda: _done(math.inf))),
    ("grpo chosen lr: seeds", dict(done=lambda: _done(seeds=5))),
    ("grpo: every chosen lr inside its scan", dict(done=lambda: _done(edge=True))),
    ("grpo chosen lr: gradient clipping the same at every batch",
     dict(table=lambda: _table(1.0, [0.9, 0.6, 0.1, 0, 0, 0]))),
])
def test_each_check_fails_when_its_premise_does(name, broken):
  kw = {k: v() for k, v in broken.items()}
  checks = _checks(**kw)
  assert checks[name] is False, checks


def test_a_reference_seed_that_never_arrives_fails_two_checks():
  study = _study()
  runs = study.runs.copy()
  runs.loc[(runs.config == "c16") & (runs.index % 10 == 3), "responses_to_target"] = np.inf
  study.verdict_runs = lambda: runs
  checks = _checks(study)
  assert checks["grpo chosen lr: the reference B=16 reaches the target and does not collapse"] is False
  assert checks["grpo chosen lr: every verdict seed reaches the target"] is False


def test_a_target_the_reference_barely_reaches_fails():
  study = _study()
  runs = study.runs.assign(final=0.43)
  study.verdict_runs = lambda: runs
  assert _checks(study)["grpo chosen lr: the target below what the reference reaches"] is False


@pytest.mark.parametrize("plateau, ok", [(0.5, True), (0.44, False)])
def test_a_reference_stopped_at_the_target_is_judged_by_the_target_stage(plateau, ok):
  """Seeds stopped at the target end just past it (final 0.42 here): the target stage's
  plateau, run to its budget, says whether the target sits a band below what it reaches."""
  study = _study(plateau=plateau)
  runs = study.runs.assign(final=0.42, stopped=True)
  study.verdict_runs = lambda: runs
  assert _checks(study)["grpo chosen lr: the target below what the reference reaches"] is ok
  # One seed that ran to its budget without reaching the target does not decide it either.
  runs = runs.assign(stopped=runs.index % 10 != 3, final=np.where(runs.index % 10 == 3, 0.3,
                                                                  0.42))
  study.verdict_runs = lambda: runs
  assert _checks(study)["grpo chosen lr: the target below what the reference reaches"] is ok


def test_a_stopped_reference_without_a_plateau_is_not_checkable():
  study = _study(plateau=None)
  runs = study.runs.assign(final=0.42, stopped=True)
  study.verdict_runs = lambda: runs
  assert _checks(study)["grpo chosen lr: the target below what the reference reaches"] is False


def test_a_collapsing_reference_fails():
  study = _study()
  runs = study.runs.copy()
  runs.loc[runs.config == "c16", "drop_after_target"] = 0.2
  study.verdict_runs = lambda: runs
  assert _checks(study)[
      "grpo chosen lr: the reference B=16 reaches the target and does not collapse"] is False

"""The report's claims no stronger than its numbers: PPO's critic warm-up counted wherever PPO
meets GRPO, gradient clipping that acts at some batches only, intervals too weak to exclude,
a test without power, and the chosen-lr series named after how it was chosen.

Each test builds its own small synthetic runs (tests/support/fixtures/fake_study.py's configs,
metrics written here) or the sections' facts by hand."""

import json
import math
import os
import types

import pandas as pd
import pytest

from analysis import series as se
from analysis import stats
from analysis import study_table as st
from analysis.sections import questions as q
from analysis.sections import rules
from analysis.sections.types import Section
from tests.support.fixtures import fake_study

TARGET = fake_study.TARGET


def _write_run(d: str, kind: str, p: int, g: int, seed: int, lr: float, e: float,
               steps: int, warmup_steps: int = 0, step_s: float = 1.0,
               warmup_step_s: float | None = None, grad_norms=None, grad_clip: float = 1.0):
  """A run whose actor's evaluations rise linearly to cross the target after exactly `e`
  trained responses (plus any warm-up), each step taking `step_s` seconds (`warmup_step_s` in
  the warm-up) and logging the actor grad norm `grad_norms[step - 1]` (0 in the warm-up)."""
  os.makedirs(d, exist_ok=True)
  n = p * g
  cfg = fake_study._config(kind, p, g, seed, lr, warmup_steps)
  cfg["optim"]["grad_clip"] = grad_clip
  rows = [{"step": 0, "responses_seen": 0, "eval/accuracy_greedy": fake_study.R0}]
  for step in range(1, steps + 1):
    trained = max(step - warmup_steps, 0) * n
    warm = step <= warmup_steps
    row = {"step": step, "responses_seen": step * n,
           "time/step": (warmup_step_s if warm and warmup_step_s else step_s),
           "eval/accuracy_greedy": fake_study.R0 + (TARGET - fake_study.R0) * trained / e,
           "actor/grad_norm": 0.0 if warm else (grad_norms[step - 1] if grad_norms else 0.5)}
    rows.append(row)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(cfg, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump({"kind": kind, "responses_seen": steps * n, "platform": "cpu"}, f)


def _read(root: str) -> st.Study:
  return st.read_study([root], st.Options(reps=200, fit_reps=20), stream=open(os.devnull, "w"))


def _total(p: int, g: int) -> int:
  """The steps of a run of the tiny config's length at P x G (it must finish to be used)."""
  return fake_study.TOTAL // (p * g)


# 1. PPO's critic warm-up ------------------------------------------------------------------


def test_a_ppo_run_that_trains_faster_after_its_warm_up_is_slower_from_its_start(tmp_path):
  """The actor of PPO reaches the target in 704 responses, GRPO's in 1,024 at the same
  responses per second: ranked by the actor's numbers PPO comes first (the report's old
  'fastest' line); with its 512 warm-up responses (16 steps of 1 s) it comes second, by
  (704 + 512) / 1024 = 1.19x in responses and (22 + 16) / 32 s in time."""
  _write_run(str(tmp_path / "grpo"), "grpo", 4, 8, 0, 1e-4, e=1024, steps=_total(4, 8))
  _write_run(str(tmp_path / "ppo"), "ppo", 8, 4, 0, 1e-4, e=704, steps=_total(8, 4),
             warmup_steps=16)
  study = _read(str(tmp_path))
  runs = study.runs.set_index("kind")
  assert runs.loc["ppo", "warmup"] == 512
  assert runs.loc["ppo", "responses_to_target"] == pytest.approx(704)
  assert runs.loc["ppo", "responses_to_target_incl_warmup"] == pytest.approx(704 + 512)
  assert runs.loc["ppo", "time_to_target"] == pytest.approx(22.0)  # 704 / 32 per s
  assert runs.loc["ppo", "time_to_target_incl_warmup"] == pytest.approx(22.0 + 16.0)
  assert runs.loc["grpo", "time_to_target_incl_warmup"] == runs.loc["grpo", "time_to_target"]
  table = st.config_table(study)
  assert table.sort_values("ttt").kind.iloc[0] == "ppo"  # the bias: warm-up left out
  assert table.sort_values("ttt_incl").kind.iloc[0] == "grpo"
  assert table.sort_values("rtt_incl").kind.iloc[0] == "grpo"
  ppo = table[table.kind == "ppo"].iloc[0]
  assert ppo.rtt_incl_iv.point == pytest.approx(1216) and ppo.ttt_incl == pytest.approx(38.0)
  # At another target the warm-up is counted again (seed_values recomputes the crossing).
  at = st.seed_values(study, ppo.config, "responses_to_target_incl_warmup", target=0.3)
  assert at == pytest.approx([704 * (0.3 - 0.1) / 0.4 + 512])


def test_the_warm_up_takes_its_own_steps_seconds(tmp_path):
  """Warm-up steps (the actor idle) are faster: their own median time counts, not the
  steady one."""
  _write_run(str(tmp_path / "ppo"), "ppo", 8, 4, 0, 1e-4, e=704, steps=_total(8, 4),
             warmup_steps=16, step_s=1.0, warmup_step_s=0.25)
  run = st.load_run(str(tmp_path / "ppo"))[0]
  assert st.warmup_seconds(run) == pytest.approx(16 * 0.25)
  assert st.time_to_target(run, 704, 32.0, incl_warmup=True) == pytest.approx(22 + 4)


def test_the_lr_section_says_why_ppo_ratios_may_leave_the_warm_up_out():
  table = pd.DataFrame({"kind": ["ppo"] * 3, "B": [16, 32, 64], "warmup": [512] * 3})
  assert "the same at every B and lr" in rules._warmup_note("ppo", table)
  table["warmup"] = [512, 256, 512]
  assert "differs between configurations" in rules._warmup_note("ppo", table)


# 2. Gradient clipping -----------------------------------------------------------------------


def test_the_fraction_of_steps_clipped_is_read_from_the_grad_norms(tmp_path):
  """Norms 2.3 at every step of B = 8, and 0.8 / 1.2 alternating at B = 32: clip 1 acts on
  all of the first and half of the second (up to the crossing); clip 0 on none; a PPO actor's
  warm-up steps (norm 0) are not optimizer steps of the actor."""
  _write_run(str(tmp_path / "b8"), "grpo", 1, 8, 0, 1e-4, e=1024, steps=_total(1, 8),
             grad_norms=[2.3] * _total(1, 8))
  _write_run(str(tmp_path / "b32"), "grpo", 4, 8, 0, 1e-4, e=1024, steps=_total(4, 8),
             grad_norms=[0.8, 1.2] * _total(4, 8))
  _write_run(str(tmp_path / "off"), "grpo", 2, 8, 0, 1e-4, e=1024, steps=_total(2, 8),
             grad_norms=[2.3] * _total(2, 8), grad_clip=0.0)
  _write_run(str(tmp_path / "ppo"), "ppo", 8, 4, 0, 1e-4, e=704, steps=_total(8, 4),
             warmup_steps=16, grad_norms=[1.3] * _total(8, 4))
  runs = _read(str(tmp_path)).runs.set_index("name")
  assert runs.loc["b8", "clip_fraction"] == 1.0 and runs.loc["b8", "grad_norm"] == 2.3
  assert runs.loc["b32", "clip_fraction"] == pytest.approx(0.5)
  assert runs.loc["off", "clip_fraction"] == 0.0 and runs.loc["off", "grad_clip"] == 0.0
  assert runs.loc["ppo", "clip_fraction"] == 1.0 and runs.loc["ppo", "grad_norm"] == 1.3


def _clip_rows(clip, fractions, norms=(2.3, 1.3, 0.8, 0.5)):
  return pd.DataFrame({"B": [8, 16, 32, 64][:len(fractions)], "grad_clip": clip,
                       "clip_fraction": fractions, "grad_norm": list(norms)[:len(fractions)]})


def test_the_clip_check_fails_when_clipping_acts_at_some_batches_only():
  """The committed study's confound: clip 1 with median norms 2.3 and 1.3 at B <= 16 and
  below 1 at B >= 32."""
  ok, text = st.clip_fraction_check(_clip_rows(1.0, [1.0, 0.85, 0.0, 0.0]))
  assert not ok
  assert "B = 8: 100%" in text and "B = 32: 0%" in text and "allowed: 0.1" in text
  assert "update rule changes with B" in text


def test_the_clip_check_passes_when_clipping_is_off_or_alike():
  ok, text = st.clip_fraction_check(_clip_rows(0.0, [0.0, 0.0, 0.0, 0.0]))
  assert ok and "off at every batch" in text
  assert st.clip_fraction_check(_clip_rows(1.0, [0.0, 0.05, 0.0, 0.0]))[0]
  assert st.clip_fraction_check(_clip_rows(1.0, [1.0, 1.0, 1.0, 1.0]))[0]
  assert not st.clip_fraction_check(_clip_rows(1.0, [0.0, 0.2]))[0]
  assert st.clip_fraction_check(_clip_rows(1.0, [0.0, 0.2]), max_difference=0.25)[0]
  ok, text = st.clip_fraction_check(_clip_rows(1.0, [1.0, math.nan]))
  assert not ok and "unknown" in text


# 3. Claims no stronger than their intervals ---------------------------------------------------


def _iv(point, lo, hi, n, coverage):
  return stats.Interval(point, lo, hi, n, coverage, "bootstrap")


def _fixed_done(interval):
  sec = Section("learning_rate")
  sec.facts["fixed_cost"] = {"grpo": pd.DataFrame({"B": [64], "ratio": [interval]})}
  return {"learning_rate": sec}


def test_the_fixed_lr_cost_excludes_1_only_with_enough_coverage():
  runs = pd.DataFrame({"kind": ["grpo"], "B0": [16]})
  study = types.SimpleNamespace(runs=runs)
  assert q.q_fixed(study, _fixed_done(_iv(1.55, 1.2, 1.9, 5, 0.97)))["mark"] == "reproduced"
  weak = q.q_fixed(study, _fixed_done(_iv(1.55, 1.2, 1.9, 3, 0.75)))
  assert weak["mark"] == "not settled" and "only suggests" in weak["why"]
  miss = q.q_fixed(study, _fixed_done(_iv(1.1, 1.02, 1.2, 3, 0.75)))
  assert miss["mark"] == "not settled"
  assert q.q_fixed(study, _fixed_done(_iv(1.1, 1.02, 1.2, 5, 0.97)))["mark"] == \
      "not reproduced"


def _pairs_done(interval):
  sec = Section("pairs")
  sec.facts["pairs"] = pd.DataFrame({"configuration": ["grpo P=8 G=4"], "q": [interval]})
  return {"pairs": sec}


def test_equal_pxg_differs_only_by_an_interval_of_enough_coverage():
  assert q.q_pairs(None, _pairs_done(_iv(1.5, 1.2, 1.8, 5, 0.97)))["mark"] == "not reproduced"
  weak = q.q_pairs(None, _pairs_done(_iv(1.5, 1.2, 1.8, 3, 0.75)))
  assert weak["mark"] == "not settled" and "(n=3, 75%)" in weak["why"]
  assert q.q_pairs(None, _pairs_done(_iv(1.05, 0.9, 1.2, 5, 0.97)))["mark"] == "reproduced"


def _actor_critic_done(actor_g2, critic_g2):
  def row(model, e, lo, hi, g2):
    return dict(kind="ppo", model=model, runs=19, batches=3,
                power=dict(exponent=e, exponent_lo=lo, exponent_hi=hi),
                fit=dict(grad_sq_true_interval=g2))
  sec = Section("actor_critic")
  sec.facts["rows"] = [row("actor", -0.519, -0.719, -0.319, actor_g2),
                       row("critic", -0.401, -0.505, -0.297, critic_g2)]
  return {"actor_critic": sec}


def test_actor_vs_critic_without_a_measured_signal_is_not_testable_here():
  """The committed study: both norms fall, but every |G|^2 interval includes 0: both are
  noise at every batch tried, so 'the critic's does not stay flat' is no evidence against
  the claim."""
  none = q.q_actor_critic(None, _actor_critic_done((-3.46, 1.69), (-0.0263, 0.235)))
  assert none["mark"] == "not testable here"
  assert "every |G|² interval includes 0" in none["why"] and "19 and 19 runs" in none["why"]
  some = q.q_actor_critic(None, _actor_critic_done((-3.46, 1.69), (0.05, 0.235)))
  assert some["mark"] == "not reproduced"


def test_the_lr_exponent_excludes_a_rule_only_with_enough_coverage():
  ex = dict(exponent=0.425, lo=0.35, hi=0.65)
  weak = rules.exponent_claim(dict(ex, coverage=0.66))
  assert "admits sqrt" in weak and "excludes" not in weak
  assert "66% coverage" in weak and "only suggests" in weak and "not settled" in weak
  strong = rules.exponent_claim(dict(ex, coverage=0.95))
  assert strong == "the interval admits sqrt and excludes none, linear"
  assert "excludes" not in rules.exponent_claim(dict(ex, coverage=math.nan))
  # An interval between the rules names no rule twice ("admits none of them and excludes none")
  between = rules.exponent_claim(dict(exponent=0.68, lo=0.52, hi=0.69, coverage=0.97))
  assert between == "the interval excludes all three rules (none, sqrt, linear)"


def test_the_questions_state_every_mark_and_the_coverage_rule():
  sec = q.questions(types.SimpleNamespace(records={}), pd.DataFrame(), {})
  text = " ".join(sec.text)
  for mark in ("*reproduced*", "*not reproduced*", "*not settled*", "*not testable* here",
               "or on a CPU"):
    assert mark in text
  assert f"at least {q.MIN_COVERAGE:.0%}" in text


# 4. The chosen-lr series ------------------------------------------------------------------------


def _chosen_study(root: str, rule: str | None, record: bool = True) -> st.Study:
  """GRPO at P = 1, 2, 4 (G = 8): a scan stage at two rates per P (1 seed), a verdict stage at
  both rates (3 seeds); study.json's choice (with `rule` unless None) the larger rate but at
  P = 1 (the smaller, so that the reference's rate, 2e-4 at B0 = 16, differs from it there)."""
  lrs = {p: (1e-4, 2e-4) for p in (1, 2, 4)}
  for stage, seeds in (("scan", (0,)), ("confirm", (3, 4, 5))):
    points = []
    for p, pair in lrs.items():
      for lr in pair:
        for s in seeds:
          name = f"p={p},lr={lr:g},seed={s}"
          e = 1024 * (1.0 if lr == 2e-4 else 1.3)
          _write_run(os.path.join(root, stage, name), "grpo", p, 8, s, lr, e=e,
                     steps=_total(p, 8))
          points.append({"name": name, "overrides": {"p": p, "lr": lr, "seed": s},
                         "status": "done"})
    with open(os.path.join(root, stage, "sweep.json"), "w") as f:
      json.dump({"sweep": stage, "points": points}, f)
  entry = {"stage": "scan", "per": ["p"], "values": {"p=1": 1e-4, "p=2": 2e-4, "p=4": 2e-4}}
  if rule is not None:
    entry["rule"] = rule
  with open(os.path.join(root, "study.json"), "w") as f:
    json.dump({"chosen": {"lr": entry}} if record else {}, f)
  return _read(root)


@pytest.mark.parametrize("rule, name", [
    ("median over scan seeds", "chosen lr (median over scan seeds)"),
    (None, "chosen lr")])
def test_the_chosen_series_is_named_after_its_rule(tmp_path, rule, name):
  study = _chosen_study(str(tmp_path), rule)
  table = st.config_table(study)
  ss = se.series(study, table)
  chosen = [s for s in ss if s.chosen]
  assert [s.name for s in chosen] == [name] and se.is_chosen(name)
  assert not any("best" in s.name for s in ss)
  lr = table.set_index("config").lr
  assert {b: lr[c] for b, c in chosen[0].configs.items()} == {8: 1e-4, 16: 2e-4, 32: 2e-4}


def test_without_a_study_choice_the_series_says_it_chose_on_the_verdict_seeds(tmp_path):
  study = _chosen_study(str(tmp_path), None, record=False)
  (s,) = [s for s in se.series(study, st.config_table(study)) if s.chosen]
  assert s.name == "chosen lr (on the verdict seeds)" and "optimistic" in s.note


def test_the_lr_per_b_table_title_and_facts(tmp_path):
  """The design check (sections/decision.py) finds the table by 'lr per B' and reads its
  values from facts['lr_per_B'][kind]."""
  study = _chosen_study(str(tmp_path), "median over scan seeds")
  sec = rules.learning_rate(study, st.config_table(study))
  (title, shown), = [(t, d) for t, d in sec.tables if "lr per B" in t]
  titles = [title]
  assert title == rules.lr_per_b_title("grpo", "the study's choice, median over scan seeds")
  assert {"tried", "at_edge"} <= set(shown.columns) and shown.at_edge.all()  # 2 rates each
  assert titles[0].startswith("grpo: lr per B (chosen: the study's choice, median over scan")
  opt = sec.facts["lr_per_B"]["grpo"]
  assert list(opt.B) == [8, 16, 32] and list(opt.chosen) == [1e-4, 2e-4, 2e-4]
  assert {"tried", "at_edge", "lr_star"} <= set(opt.columns)
  # What the reference's rate costs is against the chosen series, by its name.
  assert "at the chosen lr (median over scan seeds)" in " ".join(t for t, _ in sec.tables)
  assert any("the responses of the chosen lr (median over scan seeds) (at B = 8)" in v
             for v in sec.verdict)


def test_the_runner_rule_picks_the_fewest_median_responses():
  """Where the study recorded no choice the report chooses as the runner now does: the
  stable rate with the fewest median responses, not the one whose slowest seed is fastest."""
  scan = pd.DataFrame({"B": [8, 8], "P": [1, 1], "lr": [1e-4, 2e-4], "rtt": [900.0, 1000.0],
                       "worst": [2000.0, 1100.0], "final_med": [0.6, 0.6],
                       "eligible": [True, True], "scanned": [True, True]})
  assert rules.lr_optima(scan).chosen.iloc[0] == 1e-4


@pytest.mark.parametrize("variance", [0.0, 0.02])
def test_a_joint_rate_fit_reads_the_chosen_series_at_the_fitted_optimum(tmp_path, variance):
  """study.json's choice by the joint fit of E(B, lr) (rlscale/study/study.joint_choice): the
  chosen series' ratio is divided by exp(correction at B - at B0), the correction's variance
  widens its interval, the series says so, and no runner-up series is made."""
  from analysis.sections import decision
  study = _chosen_study(str(tmp_path), "joint fit of E(B, lr), 1 scan seeds")
  with open(tmp_path / "study.json") as f:
    record = json.load(f)
  cov = [[variance if i == j else 0.0 for j in range(3)] for i in range(3)]
  record["chosen"]["lr"]["runner_up"] = record["chosen"]["lr"]["values"]
  record["chosen"]["lr"]["joint"] = {
      "identified": True, "order": ["p=1", "p=2", "p=4"],
      "batches": {"p=1": 8.0, "p=2": 16.0, "p=4": 32.0},
      "correction": {"p=1": 0.05, "p=2": 0.0, "p=4": 0.2}, "covariance": cov}
  with open(tmp_path / "study.json", "w") as f:
    json.dump(record, f)
  study = _read(str(tmp_path))
  table = st.config_table(study)
  ss = se.series(study, table)
  (chosen,) = [s for s in ss if s.chosen]
  assert chosen.shift[32] == pytest.approx((0.2, 2 * variance))
  assert "fitted optimum" in chosen.note
  assert not any(s.name == se.RUNNER_UP for s in ss)
  rows = decision.invariance_rows(study, table, 0.2, 0.05, curves=False)
  at = rows[(rows.series == chosen.name) & (rows.B == 32)].iloc[0]
  assert at.ratio.point == pytest.approx(math.exp(-0.2))  # the verdict seeds' ratio is 1.0
  width = math.log(at.ratio.hi) - math.log(at.ratio.lo)
  if variance:
    assert width > 2 * 1.96 * math.sqrt(2 * variance) * 0.8  # the correction's spread
  else:
    assert width == pytest.approx(0.0, abs=1e-9)  # identical seeds, an exact correction


def test_the_rate_section_says_what_the_joint_fit_chose_or_why_not(tmp_path):
  study = _chosen_study(str(tmp_path), "joint fit of E(B, lr), 1 scan seeds")
  with open(tmp_path / "study.json") as f:
    record = json.load(f)
  joint = {"identified": True, "order": ["p=1", "p=2", "p=4"],
           "batches": {"p=1": 8.0, "p=2": 16.0, "p=4": 32.0},
           "values": {"p=1": 1e-4, "p=2": 2e-4, "p=4": 2e-4},
           "optimum": {"p=1": 1.2e-4, "p=2": 1.8e-4, "p=4": 2.4e-4},
           "correction": {"p=1": 0.01, "p=2": 0.0, "p=4": 0.02},
           "covariance": [[0.0] * 3] * 3, "redraws": 500,
           "fit": {"a": 1.0, "c1": 0.0, "c2": -0.6, "resid_sd": 0.1, "expected_sd": 0.16,
                   "points": 6}}
  for case in (joint, {"identified": False, "why": "lack of fit: residual spread 0.50"}):
    record["chosen"]["lr"]["joint"] = case
    with open(tmp_path / "study.json", "w") as f:
      json.dump(record, f)
    study = _read(str(tmp_path))
    text = " ".join(rules.learning_rate(study, st.config_table(study)).text)
    if case["identified"]:
      assert "one fit of E(B, lr)" in text and "B^0.30" in text
      assert "B = 32: optimum 0.00024, chosen 0.0002 (2.0% slower)" in text
    else:
      assert "not identified (lack of fit: residual spread 0.50)" in text
      assert "runner-up ran beside it" in text


def test_where_the_joint_fit_and_a_batch_own_scan_disagree_both_rates_make_series(tmp_path):
  study = _chosen_study(str(tmp_path), "joint fit of E(B, lr), 1 scan seeds")
  with open(tmp_path / "study.json") as f:
    record = json.load(f)
  entry = record["chosen"]["lr"]
  entry["runner_up"] = dict(entry["values"], **{"p=4": 1e-4})  # p=4's own scan chose 1e-4
  entry["joint"] = {"identified": True, "order": ["p=1", "p=2", "p=4"],
                    "batches": {"p=1": 8.0, "p=2": 16.0, "p=4": 32.0},
                    "correction": {"p=1": 0.0, "p=2": 0.0, "p=4": 0.0},
                    "covariance": [[0.0] * 3] * 3}
  with open(tmp_path / "study.json", "w") as f:
    json.dump(record, f)
  study = _read(str(tmp_path))
  table = st.config_table(study)
  (second,) = [s for s in se.series(study, table) if s.name == se.RUNNER_UP]
  assert "own choice from its scan alone" in second.note
  lr = table.set_index("config").lr
  assert {b: lr[c] for b, c in second.configs.items()} == {8: 1e-4, 16: 2e-4, 32: 1e-4}

"""The advisor (analysis/advise.py) on fake studies with a known answer, and its refusals."""

import os
import math

import numpy as np
import pandas as pd
import pytest

from analysis import advise
from tests.support import REPO

G = 8


def fake_runs(b_crit=64.0, e_min=1000.0, batches=(8, 16, 32, 64), seeds=5, noise=0.05,
              lrs=(1e-4, 2e-4), seed=0, never=()):
  """Verdict runs of a study whose responses to target follow E = E_min (1 + B / B_crit) at the
  better of two rates (the other needs 30% more), with lognormal seed noise."""
  rng = np.random.default_rng(seed)
  rows = []
  for b in batches:
    for lr in lrs:
      for s in range(seeds):
        e = e_min * (1 + b / b_crit) * math.exp(noise * rng.standard_normal())
        e *= 1.0 if lr == lrs[0] else 1.3
        rows.append(dict(role="verdict", status="done", kind="grpo", G=G, P=b // G, B=b,
                         num_minibatches=1, lr=lr, lr_rule="none", stage="grpo",
                         config=f"P={b // G},lr={lr}", seed=s,
                         responses_to_target=math.inf if b in never else e))
  return pd.DataFrame(rows)


def step_time(c0=16.0, c1=1.0):
  """c0 fixed seconds per step plus c1 per response per chip: T(B) = E_min (1/B + 1/B_crit)
  (c0 + c1 B / n) is least at B* = sqrt(c0 B_crit n / c1)."""
  def step(responses, chips, layout, staleness=0):
    t = c0 + c1 * responses / chips + (0.5 if layout == "split" else 0.0)
    return t * (0.6 if staleness else 1.0)  # the sampler ahead: decode beside the update
  return step


def test_picks_the_batch_the_law_says_is_fastest_measured_and_extrapolated():
  points, lrs, g, minibatches = advise.best_lr_points(fake_runs(), {})
  assert g == G and minibatches == 1 and sorted(points) == [8, 16, 32, 64]
  # The faster rate at every B, said to be chosen on the seeds it is reported on.
  assert all(v.startswith("0.0001 (fewest median") and "optimistic" in v for v in lrs.values())
  estimates, fit = advise.from_study(points, lrs)
  assert fit["identified"] and fit["b_crit"] == pytest.approx(64, rel=0.25)
  df = advise.choose(estimates, step_time(), [1, 64], ["colocated", "split"])
  tab = advise.table(df, g).set_index("chips")
  # B* = sqrt(16 x 64 x n): 32 at one chip (measured), 256 at 64 chips (beyond the batches run).
  assert tab.loc[1, "B"] == 32 and tab.loc[1, "E from"] == "measured"
  assert tab.loc[64, "B"] == 256 and tab.loc[64, "E from"] == "fit"
  assert tab.loc[1, "layout"] == "colocated" and tab.loc[1, "seeds"] == 5
  assert "not run" in tab.loc[64, "lr"]
  best = df[df.chips == 1].iloc[0]
  assert best.time_lo <= best.time_s <= best.time_hi


def test_a_critical_batch_bounded_below_extrapolates_pessimistically():
  points, lrs, _, _ = advise.best_lr_points(fake_runs(b_crit=1e5, noise=0.03), {})
  estimates, fit = advise.from_study(points, lrs)
  assert not fit["identified"] and fit["bound"][0] == "lower"
  beyond = [e for e in estimates if e.b > 64]
  assert beyond and all(e.how.startswith("bound (pessimistic") for e in beyond)
  top = next(e for e in estimates if e.b == 64)
  assert all(e.e >= top.e for e in beyond)  # never more optimistic than the largest measured B
  for e in beyond:  # both ends carried by one factor; the row stands for the upper end
    assert e.lo / top.lo == pytest.approx(e.hi / top.hi) and e.e == e.hi >= top.hi


def test_the_study_choice_of_rate_wins_over_the_fewest_responses():
  record = {"chosen": {"lr": {"stage": "grpo", "per": ["p"],
                              "values": {f"p={b // G}": 2e-4 for b in (8, 16, 32, 64)}}}}
  _, lrs, _, _ = advise.best_lr_points(fake_runs(), record)
  assert set(lrs.values()) == {"0.0002 (the study's choice)"}


def test_refuses_when_fewer_than_two_batches_reach_the_target():
  points, lrs, _, _ = advise.best_lr_points(fake_runs(never=(16, 32, 64)), {})
  with pytest.raises(advise.Refusal, match="1 batch"):
    advise.from_study(points, lrs)


def test_refuses_a_study_without_the_algorithm():
  with pytest.raises(advise.Refusal, match="no 'ppo' runs"):
    advise.best_lr_points(fake_runs(), {}, kind="ppo")


def test_a_probe_carries_the_runs_own_responses_to_other_batches():
  est = advise.from_probe(5120.0, 256, 1e-4, b_crit=64.0, lo=32.0, hi=128.0, seeds=3,
                          batches=[64, 256, 1024])
  by_b = {e.b: e for e in est}
  assert by_b[256].e == 5120.0 and by_b[256].how == "measured (one run)"
  assert math.isnan(by_b[256].lo)  # one run: no interval
  assert by_b[64].e == pytest.approx(5120 * (1 + 1) / (1 + 4))
  assert by_b[1024].how == "probe" and by_b[1024].lo < by_b[1024].e < by_b[1024].hi


def test_the_command_refuses_in_one_line(tmp_path, capsys):
  rc = advise.main([str(tmp_path / "nothing"), "--run", str(tmp_path)])
  err = capsys.readouterr().err
  assert rc == 2 and err.startswith("advise.py: cannot recommend:") and err.count("\n") == 1


def test_a_step_of_several_mini_batches_counts_its_responses():
  """E(B) over B x minibatches responses per RL step: half the RL steps of twice the rows."""
  est = [advise.Estimate(32, 1000.0, 900.0, 1100.0, 5, "measured", "1e-4")]
  one = advise.choose(est, step_time(), [1], ["colocated"], minibatches=1).iloc[0]
  two = advise.choose(est, step_time(), [1], ["colocated"], minibatches=2).iloc[0]
  assert two.steps == pytest.approx(one.steps / 2)
  assert two.step_s == step_time()(64, 1, "colocated")
  assert advise.table(advise.choose(est, step_time(), [1], ["colocated"], 2), G, 2).iloc[0][
      "P x G"] == "8 x 8"


def test_rates_beyond_the_batches_run_are_flagged_and_capped_at_what_worked():
  runs = fake_runs()
  scan = runs.assign(role="tuning", lr=4e-4, responses_to_target=math.inf, stage="lr")
  runs = pd.concat([runs, scan])  # 4e-4 never reached the target: 2e-4 is the largest that did
  points, lrs, _, _ = advise.best_lr_points(runs, {})
  assert advise.largest_working_rate(runs, "grpo") == 2e-4
  estimates, _ = advise.from_study(points, lrs, max_lr=2e-4)
  far = [e for e in estimates if e.b > 64]
  assert all("not run" in e.lr for e in far)
  assert all(float(e.lr.split()[0]) <= 2e-4 for e in far)
  assert any("capped" in e.lr for e in far)


@pytest.mark.parametrize("point, lo, hi, want", [
    (8.64, 7.2, 10.5, "8.6 [7.2, 10]"),  # 38% wide: two digits
    (8.64, 8.5, 8.8, "8.64 [8.5, 8.8]"),  # 3.5%: three
    (8.64, 2.0, 40.0, "9 [2, 40]"),  # wider than the point: one
])
def test_seconds_carry_the_digits_their_interval_justifies(point, lo, hi, want):
  row = pd.Series(dict(time_s=point, time_lo=lo, time_hi=hi))
  assert advise._iv(row) == want


def _study_dir(tmp_path, model="tiny"):
  study = tmp_path / "study"
  study.mkdir()
  fake_runs().to_csv(study / "runs.csv", index=False)
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text('{"model": {"name": "%s"}}' % model)
  return str(study), str(run)


def test_the_command_writes_its_advice_without_optional_packages(tmp_path, monkeypatch):
  """main() end to end on a fake study (the step-time model replaced): advice.md is written
  with the report's own markdown tables (to_markdown needed tabulate, which `pip install -e .`
  does not bring)."""
  study, run = _study_dir(tmp_path)
  monkeypatch.setattr(advise, "throughput", lambda *a: (step_time(), "fake step time"))
  monkeypatch.setattr(pd.DataFrame, "to_markdown", None, raising=False)
  assert advise.main([study, "--run", run, "--chips=1,64"]) == 0
  text = (tmp_path / "study" / "advice" / "advice.md").read_text()
  assert "| chips | P x G |" in text and "fake step time" in text


def test_another_model_needs_assume_transfer_and_then_says_so(tmp_path, monkeypatch, capsys):
  study, run = _study_dir(tmp_path)
  monkeypatch.setattr(advise, "throughput", lambda *a: (step_time(), "fake step time"))
  assert advise.main([study, "--run", run, "--model=qwen2.5-7b"]) == 2
  assert "--assume_transfer" in capsys.readouterr().err
  assert advise.main([study, "--run", run, "--model=qwen2.5-7b", "--assume_transfer"]) == 0
  text = (tmp_path / "study" / "advice" / "advice.md").read_text()
  assert "**assumed transfer**" in text and "E / E(smallest B)" in text
  assert "time to target (s, assumed transfer)" in text
  assert advise.main([study, "--run", run, "--model=tiny"]) == 0  # the run's own: no flag


def test_a_run_from_a_checkpoint_folder_is_that_model(tmp_path):
  (tmp_path / "config.json").write_text(
      '{"model": {"name": "tiny", "hf_checkpoint": "/models/Qwen2.5-0.5B"}}')
  assert advise.run_model(str(tmp_path)) == "/models/Qwen2.5-0.5B"  # name is ignored then


def _costs_csv(path, ratios, kind="grpo", correction="none", axis="generated"):
  """A staleness report's CSV (analysis/sections/staleness.py's columns the advisor reads):
  {k: {B: ratio}}, intervals +-10%, 5 seeds."""
  rows = [dict(kind=kind, dynamic_sampling=False, correction=correction, B=b, k=k,
               ratio_to_k0=r, ratio_lo=r * 0.9, ratio_hi=r * 1.1, ratio_n=5, sample_axis=axis)
          for k, by_b in ratios.items() for b, r in by_b.items()]
  rows += [dict(kind=kind, dynamic_sampling=False, correction=correction, B=b, k=0,
                ratio_to_k0=1.0, ratio_lo=1.0, ratio_hi=1.0, ratio_n=5, sample_axis=axis)
           for b in (16, 64)]
  pd.DataFrame(rows).to_csv(path, index=False)
  return str(path)


def test_staleness_costs_read_the_reports_csv_and_the_nearest_batch_stands_in():
  from analysis.sections import staleness
  import inspect
  src = inspect.getsource(staleness._csv)
  for col in ("ratio_to_k0", "ratio_lo", "ratio_hi", "ratio_n", "dynamic_sampling"):
    assert f'"{col}"' in src  # the columns the advisor reads are the section's
  assert staleness.STEM + ".csv" == advise.STALENESS_CSV
  # The committed sweep's report (docs/staleness) is read as written: k = 1 ... 8 at its B.
  costs = advise.staleness_costs(os.path.join(REPO, "docs", "staleness"), "grpo", "none")
  assert sorted(costs) == [1, 2, 4, 8] and [c.b for c in costs[1]] == [16, 64, 256]
  assert costs[4][2].ratio == pytest.approx(3.06, rel=0.01) and costs[4][2].seeds == 5
  # An unbounded upper end (a censored seed) and a B whose median never reached the target
  # stay: at B = 4096 k = 2 and 8 are read from B = 256, not from a smaller B's finite ratio.
  assert advise.cost_at(costs[2], 4096)[0].b == 256 and costs[2][2].hi == math.inf
  assert advise.cost_at(costs[8], 4096)[0].ratio == math.inf


def test_staleness_costs_counted_in_responses_trained_are_refused(tmp_path):
  csv = _costs_csv(tmp_path / "s.csv", {1: {16: 1.0}}, axis="trained")
  with pytest.raises(advise.Refusal, match="its ratios count trained"):
    advise.staleness_costs(csv, "grpo", "none")


@pytest.mark.parametrize("ratio, best", [(1.1, "split k=1"), (2.0, "colocated")])
def test_k_wins_where_its_faster_step_outweighs_its_measured_sample_cost(tmp_path, ratio, best):
  """The fake pipelined step is 0.6x the synchronous one: k = 1 wins when it costs 1.1x the
  responses, not when it costs 2x."""
  costs = advise.staleness_costs(_costs_csv(tmp_path / "s.csv", {1: {16: ratio, 64: ratio}}),
                                 "grpo", "none")
  assert [c.b for c in costs[1]] == [16, 64]
  assert advise.cost_at(costs[1], 32)[0].b == 16 and not advise.cost_at(costs[1], 32)[1]
  # 32 lies as near 16 as 64 (in log B): of two as near, the costlier stands in
  two = [advise.Cost(16, 1.0, 0.9, 1.1, 5), advise.Cost(64, 1.5, 1.2, 1.9, 5)]
  assert advise.cost_at(two, 32) == (two[1], False) and advise.cost_at(two, 20)[0] is two[0]
  assert advise.cost_at(costs[1], 256) == (costs[1][1], False)  # nearest in log B: 64
  points, lrs, g, _ = advise.best_lr_points(fake_runs(), {})
  estimates, _ = advise.from_study(points, lrs)
  df = advise.choose(estimates, step_time(), [8], ["colocated", "split"], 1, costs)
  tab = advise.table(df, g).set_index("chips")
  assert tab.loc[8, "layout"] == best
  k1 = df[df.k == 1].iloc[0]
  assert "x" in k1.how and k1.time_lo < k1.time_s < k1.time_hi


def test_k_above_0_without_its_measured_cost_is_refused(tmp_path, monkeypatch, capsys):
  study, run = _study_dir(tmp_path)
  monkeypatch.setattr(advise, "throughput", lambda *a: (step_time(), "fake step time"))
  assert advise.main([study, "--run", run, "--max_staleness=0,1"]) == 2
  assert "--staleness=REPORT_DIR" in capsys.readouterr().err
  assert advise.main([study, "--run", run, "--max_staleness=1", "--layout=colocated"]) == 2
  assert "split layout only" in capsys.readouterr().err
  csv = _costs_csv(tmp_path / "s.csv", {1: {16: 1.1, 64: 1.2}})
  assert advise.main([study, "--run", run, "--max_staleness=0,4", f"--staleness={csv}"]) == 2
  assert "no 'none' runs at k = 4" in capsys.readouterr().err
  assert advise.main([study, "--run", run, "--max_staleness=0,1", f"--staleness={csv}",
                      "--chips=8"]) == 0
  text = (tmp_path / "study" / "advice" / "advice.md").read_text()
  assert "x1.1 at B = 16 (5 seeds)" in text and "split k=1" in text

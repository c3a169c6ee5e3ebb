"""The sample axis (report.py / compare_runs.py --x generated|trained), the effective batch and
dynamic sampling in a study: synthetic runs whose answers are known by hand."""

import copy
import functools
import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from analysis import compare_runs
from analysis import report
from analysis import study_table as st
from analysis.sections import decision
from tests.support.fixtures import fake_study


@functools.lru_cache(maxsize=None)
def _base_config() -> str:
  return json.dumps(fake_study._config("grpo", 2, fake_study.G, 0, 1e-4, 0))


def _config(p: int, seed: int, dynamic_sampling: bool | None, total: int) -> dict:
  cfg = copy.deepcopy(json.loads(_base_config()))
  cfg["seed"], cfg["rl"]["num_prompts"], cfg["train"]["total_responses"] = seed, p, total
  cfg["rollout"].pop("dynamic_sampling", None)  # an old config.json: the field is missing
  if dynamic_sampling is not None:
    cfg["rollout"]["dynamic_sampling"] = dynamic_sampling
  return cfg


def _write(d, seen, acc, trained=None, effective=None, dynamic_sampling=True, p=2, seed=0):
  """A run directory whose step i generated seen[i] responses in all (trained[i] of them
  trained), evaluated acc[i] (None: no evaluation), with effective[i] informative responses
  per optimizer step; each step takes 1 s."""
  os.makedirs(d)
  rows = []
  for i, s in enumerate(seen):
    row = {"step": i, "responses_seen": s}
    if i:
      row["time/step"] = 1.0
    if acc[i] is not None:
      row["eval/accuracy_greedy"] = acc[i]
    if trained is not None:
      row["responses_trained"] = trained[i]
    if effective is not None and i:
      row["rollout/effective_batch"] = effective[i]
    rows.append(row)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(_config(p, seed, dynamic_sampling, seen[-1]), f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump({"platform": "cpu"}, f)
  return str(d)


# Evaluated every other step; the monotone fit crosses 0.5 halfway between steps 4 and 6.
ACC = [0.1, None, 0.3, None, 0.45, None, 0.55, None, 0.7, None, 0.8]
SEEN = [16 * i for i in range(11)]


def _options(x: str) -> st.Options:
  return st.Options(x=x, reps=50, fit_reps=10)


def _study(root, x: str) -> st.Study:
  return st.read_study([str(root)], _options(x), stream=open(os.devnull, "w"))


def test_trained_at_half_the_rate_halves_responses_to_target(tmp_path, capsys):
  """responses_trained grows at half the rate of responses_seen: the crossing at 80 responses
  generated (halfway between 64 and 96) is at 40 trained, exactly; the step of the crossing,
  the optimizer steps and the time to it do not depend on the axis."""
  run = _write(tmp_path / "ds", SEEN, ACC, trained=[s // 2 for s in SEEN])
  loaded, _ = st.load_run(run)
  exact = functools.partial(pytest.approx, rel=1e-12)  # the same interpolation, rounded alike
  assert st.responses_to_target(loaded, "eval/accuracy_greedy", 0.5) == exact(80.0)
  assert st.responses_to_target(loaded, "eval/accuracy_greedy", 0.5, "trained") == exact(40.0)
  by_axis = {x: _study(tmp_path, x).runs.iloc[0] for x in ("generated", "trained")}
  assert by_axis["generated"].responses_to_target == exact(80.0)
  assert by_axis["trained"].responses_to_target == exact(40.0)
  for col in ("steps_to_target", "time_to_target"):
    assert by_axis["generated"][col] == exact(5.0) == by_axis["trained"][col]
  lines = {}
  for x in ("generated", "trained"):
    compare_runs.main([run, "--x", x])
    out = [json.loads(v) for v in capsys.readouterr().out.splitlines()]
    assert out[0]["sample_axis"] == out[-1]["sample_axis"] == x
    assert out[0]["dynamic_sampling"] is True
    lines[x] = out[0]
  assert lines["generated"]["responses_to_target"] == exact(80.0)
  assert lines["trained"]["responses_to_target"] == exact(40.0)
  assert lines["trained"]["optimizer_steps_to_target"] == exact(5.0)


def test_old_runs_give_the_same_numbers_on_both_axes(tmp_path):
  """Runs without responses_trained and without rollout.dynamic_sampling in their config.json
  trained on every response they generated: every number is the same on both axes, and their
  effective batch reads 'not logged'."""
  for p in (4, 8):
    fake_study.write_run(str(tmp_path / f"p{p}"), "grpo", p, fake_study.G, 0, 1e-4)
    path = tmp_path / f"p{p}" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["rollout"].pop("dynamic_sampling", None)
    path.write_text(json.dumps(cfg))
  a, b = _study(tmp_path, "generated"), _study(tmp_path, "trained")
  cols = ["responses_to_target", "steps_to_target", "time_to_target", "throughput",
          "b_simple_prompts", "b_simple_responses"]
  assert np.isfinite(a.runs.responses_to_target).all()
  pd.testing.assert_frame_equal(a.runs[cols], b.runs[cols])
  assert not a.runs.dynamic_sampling.any() and a.runs.effective_B.isna().all()
  table = st.config_table(a)
  assert table.effective_B.isna().all()
  assert set(decision.decision(a, table).tables[0][1]["effective B"]) == {"not logged"}


def test_dynamic_sampling_on_and_off_are_separate_configurations_and_series(tmp_path):
  """The same P, lr and seeds with dynamic sampling on and off: two configurations per B and
  two series, the one with it named 'filtered'; the report says which axis it used."""
  for p in (2, 4, 8):
    for on in (False, True):
      for seed in (0, 1):
        d = tmp_path / f"p={p},ds={on},seed={seed}"
        fake_study.write_run(str(d), "grpo", p, fake_study.G, seed, 1e-4)
        cfg = json.loads((d / "config.json").read_text())
        cfg["rollout"]["dynamic_sampling"] = on
        (d / "config.json").write_text(json.dumps(cfg))
  study = _study(tmp_path, "generated")
  assert "rollout.dynamic_sampling" in study.varying
  table = st.config_table(study)
  assert len(table) == 6 and (table.n_seeds == 2).all()
  for on, g in table.groupby("dynamic_sampling"):
    assert all(("filtered" in label) == on for label in g.label)
  from analysis.sections.common import study_series
  series = {s.name: s for s in study_series(study, table)}
  assert set(series) == {"fixed lr 0.0001", "fixed lr 0.0001 filtered"}
  for s in series.values():
    on = set(table[table.config.isin(s.configs.values())].dynamic_sampling)
    assert on == {s.filtered} and sorted(s.configs) == [16, 32, 64]
  out = str(tmp_path / "report")
  assert report.main([str(tmp_path), "--out", out, "--x", "trained", "--reps", "50",
                      "--fit_reps", "10"]) == 0
  md = open(os.path.join(out, "report.md")).read()
  assert "**Sample axis** (--x trained)" in md and "responses trained to target" in md
  assert "grpo, fixed lr 0.0001 filtered: **invariant up to B = " in md
  for name in ("runs.csv", "configurations.csv", "2_curves_vs_responses.csv"):
    assert set(pd.read_csv(os.path.join(out, name)).sample_axis) == {"trained"}, name


def test_effective_batch_is_the_mean_up_to_the_crossing_and_the_median_over_seeds(tmp_path):
  """Seed 0 crosses at step 3 exactly: mean(10, 12, 14) = 12. Seed 1 crosses inside step 3
  (2.5 steps): mean(4, 6, 8) = 6. Seed 2 never crosses: the mean of all its steps, 3.5. The
  configuration's effective B is their median, 6."""
  seen = [16 * i for i in range(7)]
  runs = {0: ([0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8], [0, 10, 12, 14, 100, 100, 100]),
          1: ([0.1, 0.2, 0.45, 0.55, 0.6, 0.7, 0.8], [0, 4, 6, 8, 50, 50, 50]),
          2: ([0.1, 0.2, 0.3, 0.3, 0.4, 0.4, 0.4], [0, 1, 2, 3, 4, 5, 6])}
  for seed, (acc, eff) in runs.items():
    _write(tmp_path / f"seed={seed}", seen, acc, trained=seen, effective=eff, seed=seed)
  study = _study(tmp_path, "generated")
  got = dict(zip(study.runs.seed, study.runs.effective_B))
  assert got == {0: 12.0, 1: 6.0, 2: 3.5}
  assert math.isinf(study.runs.set_index("seed").responses_to_target[2])
  (b_eff,) = st.config_table(study).effective_B
  assert b_eff == 6.0


def test_the_verdict_against_effective_b_orders_the_batches_by_it():
  """B = 64 informs fewer responses per step (20) than B = 32 (40): ordered by effective B,
  the walk up from the reference meets B = 64, not invariant, first."""
  rows = pd.DataFrame({"B": [8, 16, 32, 64], "B_eff": [7.0, 12.0, 40.0, 20.0],
                       "is_reference": [False, True, False, False],
                       "invariant": [True, True, True, False]})
  assert decision.largest_invariant(rows) == (8, 32)
  assert decision.largest_invariant(rows, by="B_eff") == (7.0, 12.0)
  text = decision._effective_verdict(rows)
  assert "**largest invariant effective B = 12**" in text
  assert "B = 8, 16, 64, 32, not in nominal order" in text
  assert "not logged" in decision._effective_verdict(rows.assign(B_eff=np.nan))


@pytest.mark.parametrize("main", [report.main, compare_runs.main])
def test_an_unknown_axis_is_refused_naming_its_flag(main, capsys):
  with pytest.raises(SystemExit) as e:
    main(["any_run", "--x", "seen"])
  assert e.value.code == 2 and "argument --x: invalid choice: 'seen'" in capsys.readouterr().err


def test_time_to_target_of_uneven_steps_is_their_count_times_a_step(tmp_path):
  """Dynamic sampling's steps generate 8 or 24 responses (16 trained each) and take 1 s each:
  the time to target is the steps to the crossing (80 generated: a third into step 6) x 1 s,
  not 80 / the median rate of responses per second (16/s or 24/s, by the median's pick)."""
  seen = [0, 8, 32, 40, 64, 72, 96, 104, 128, 136, 160]
  _write(tmp_path / "ds", seen, ACC, trained=[16 * i for i in range(11)])
  row = _study(tmp_path, "generated").runs.iloc[0]
  assert row.responses_to_target == pytest.approx(80.0)
  assert row.time_to_target == pytest.approx(5 + 8 / 24)

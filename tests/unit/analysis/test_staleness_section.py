"""analysis/sections/staleness.py on synthetic run directories of known answer.

Responses to target follow E(k, B) = E0 (1 + C k B / B0) x a per-seed log-normal factor of
fake_study's spread (5%), so staleness costs little at the smallest batch and a known factor
at the largest; under E_min (1 + B/B_crit) the law at each k has B_crit = B0 / (C k) (k = 4:
128, k = 0: none). A run's accuracy is fake_study's sigmoid crossing the target at its E,
evaluated every 128 responses with fake_study's noise. Runs log rollout/policy_lag =
min(k, step - 1) and, with a correction, off_policy/mismatch_kl = KL_PER_K x k. The tolerances
were set before the first run: ratios within their 95% intervals (one miss of six allowed: a
bootstrap interval at 5 seeds covers about 90%), points within 10%.
"""

import functools
import io
import json
import math
import os
import zlib

import numpy as np
import pandas as pd
import pytest

from analysis import report
from analysis import study_table as st
from analysis.report_md import iv
from analysis.sections import staleness
from tests.support.fixtures import fake_study

E0, C, B0, G = 2000.0, 1 / 32, fake_study.B0, fake_study.G  # B0 = 16 responses per step
TOTAL, EVERY = 8192, fake_study.EVAL_EVERY
KL_PER_K = 0.002
SEEDS = range(5)


def truth(k: int, b: int, c: float = C) -> float:
  """E(k, B) / E(0, B)."""
  return 1 + c * k * b / B0


@functools.lru_cache(maxsize=None)
def _base() -> str:
  return json.dumps(fake_study._config("grpo", 1, G, 0, fake_study.LR0, 0))


def write_run(d: str, p: int, k: int, seed: int, cost: float = C, correction: str = "none",
              overlap: bool | None = None, never: bool = False,
              reference_batch: int = B0) -> None:
  """A finished run at P = p (B = 8p) and staleness k (written as rollout.overlap when
  `overlap` is given), E = E0 truth(k, B) x its seed factor; `never`: it never reaches the
  target (its accuracy stays at the base). Its lr is the same at every B (no scaling rule)."""
  os.makedirs(d, exist_ok=True)
  cfg = json.loads(_base())
  cfg["seed"], cfg["rl"]["num_prompts"] = seed, p
  cfg["rl"]["off_policy_correction"] = correction
  cfg["train"]["total_responses"] = TOTAL
  cfg["optim"]["reference_batch"] = reference_batch
  if overlap is None:
    cfg["rollout"]["max_staleness"] = k
  else:
    del cfg["rollout"]["max_staleness"]
    cfg["rollout"]["overlap"] = overlap
  n = p * G
  rng = np.random.default_rng(zlib.crc32(repr((p, k, seed, correction, cost)).encode()))
  e = math.inf if never else E0 * truth(k, n, cost) * rng.lognormal(0, fake_study.SEED_SPREAD)
  rows = [{"step": 0, "responses_seen": 0, "eval/accuracy_greedy": fake_study.R0}]
  for step in range(1, TOTAL // n + 1):
    row = {"step": step, "responses_seen": step * n, "time/step": 1.0,
           staleness.LAG: min(k, step - 1)}
    if correction != "none":
      row[staleness.KL] = KL_PER_K * k
    if step * n % EVERY == 0:
      row["eval/accuracy_greedy"] = float(fake_study.accuracy(step * n, e)
                                          + fake_study.EVAL_NOISE * rng.standard_normal())
    rows.append(row)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(cfg, f)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(d, "summary.json"), "w") as f:
    json.dump({"kind": "grpo", "responses_seen": rows[-1]["responses_seen"]}, f)


def write_grid(root: str, prompts, ks, seeds=SEEDS, stage: str = "stale", **kw) -> str:
  """Runs at every P, k and seed under root/stage/."""
  for p in prompts:
    for k in ks:
      for s in seeds:
        write_run(os.path.join(root, stage, f"p={p},k={k},seed={s}"), p, k, s, **kw)
  return root


def read(root: str):
  study = st.read_study([root], st.Options(reps=500, fit_reps=200), stream=io.StringIO())
  return study, st.config_table(study)


def lag_mean(k: int, b: int) -> float:
  steps = TOTAL // b
  return float(np.mean([min(k, t - 1) for t in range(1, steps + 1)]))


def cell(cells: pd.DataFrame, b: int, k: int, correction: str = "none"):
  hit = cells[(cells.B == b) & (cells.k == k) & (cells.correction == correction)]
  assert len(hit) == 1, (b, k, correction)
  return hit.iloc[0]


@pytest.fixture(scope="module")
def known(tmp_path_factory):
  """B = 16, 64, 128 at k = 0, 1, 4, 5 seeds each, through the whole report."""
  root = write_grid(str(tmp_path_factory.mktemp("stale")), (2, 8, 16), (0, 1, 4))
  study, table = read(root)
  out = os.path.join(root, "report")
  assert report.main([root, "--out", out, "--reps", "500", "--fit_reps", "200"]) == 0
  with open(os.path.join(out, "report.md")) as f:
    md = f.read()
  return study, table, staleness.staleness(study, table), out, md


def test_ratios_to_k0_recover_the_known_cost(known):
  _, _, sec, _, _ = known
  cells = sec.facts["cells"]
  assert sorted(set(zip(cells.B, cells.k))) == [(b, k) for b in (16, 64, 128) for k in (0, 1, 4)]
  misses = 0
  for b in (16, 64, 128):
    assert cell(cells, b, 0).state == staleness.K0
    for k in (1, 4):
      r = cell(cells, b, k)
      q, want = r.ratio, truth(k, b)
      assert q.n == 5 and q.method == "bootstrap" and 0.8 <= q.coverage <= 1, q
      assert q.point == pytest.approx(want, rel=0.10), (b, k, q)
      misses += not q.lo <= want <= q.hi
      assert r.rtt.n == 5 and r.rtt.point == pytest.approx(E0 * want, rel=0.10), (b, k, r.rtt)
  assert misses <= 1
  # Settled against 1 + 0.2: k = 1 at B = 16 (truth 1.03) within; k = 4 at 64 and 128 (1.5,
  # 2.0) beyond.
  assert cell(cells, 16, 1).state == "within"
  assert cell(cells, 64, 4).state == "beyond" and cell(cells, 128, 4).state == "beyond"
  # Every interval printed with its seeds and coverage.
  shown = sec.tables[0][1]
  for text in shown["ratio to k = 0"]:
    assert text == "1× (n=5)" or ("(n=5, " in text and "%" in text), text
  assert all("(n=5, 94%)" in text for text in shown["responses generated to target"])


def test_the_bracket_and_b_crit_against_k(known):
  _, _, sec, _, _ = known
  ks = sec.facts["k_rows"].set_index("k")
  # k = 0: E flat in B, invariant over every batch; k = 4: E(64)/E(16) = 1.5/1.125 = 1.33 and
  # E(128)/E(16) = 1.78, broken from 64.
  assert (ks.loc[0].x, ks.loc[0].y) == (128, None), ks.loc[0].bracket
  assert (ks.loc[4].x, ks.loc[4].y) == (16, 64), ks.loc[4].bracket
  assert "reference B = 16" in ks.loc[4].bracket
  # B_crit = B0 / (C k): 128 at k = 4, identified with an interval holding it; none at k = 0.
  f4, f0 = ks.loc[4].fit, ks.loc[0].fit
  assert f4["identified"] and f4["b_crit_lo"] <= 128 <= f4["b_crit_hi"], f4["reasons"]
  assert f4["b_crit"] == pytest.approx(128, rel=0.3)
  assert not f0["identified"] and f0["reasons"]
  assert "not identified (" in staleness.b_crit_text(f0)


def test_mean_policy_lag_per_batch_and_k(known):
  _, _, sec, _, _ = known
  cells = sec.facts["cells"]
  for b in (16, 64, 128):
    for k in (0, 1, 4):
      lag = cell(cells, b, k).lag
      assert lag.n == 5 and lag.point == pytest.approx(lag_mean(k, b), abs=1e-12), (b, k)
  # No correction: no run logged a mismatch KL.
  assert (cells.kl.map(lambda v: v.n) == 0).all()
  assert set(sec.tables[0][1][f"mean {staleness.KL}"]) == {"not logged"}


def test_the_report_writes_the_section_its_csv_and_figure(known):
  _, _, sec, out, md = known
  assert "## 9. Staleness" in md and "Skipped" not in md.split("## 9. Staleness")[1][:200]
  assert "- Staleness (grpo), k = 4: responses to target over k = 0's" in md
  assert "largest invariant B: k = 0: up to B = 128; k = 1:" in md
  assert "k = 4: up to B = 16, broken from B = 64." in md
  for ext in ("png", "pdf", "csv"):
    assert os.path.getsize(os.path.join(out, f"{staleness.STEM}.{ext}")) > 0
  d = pd.read_csv(os.path.join(out, f"{staleness.STEM}.csv"))
  assert len(d) == 9 and set(d.k) == {0, 1, 4} and set(d.B) == {16, 64, 128}
  at = d[(d.B == 128) & (d.k == 4)].iloc[0]
  assert at.ratio_n == 5 and at.ratio_lo <= at.ratio_to_k0 <= at.ratio_hi
  assert at.ratio_to_k0 == pytest.approx(truth(4, 128), rel=0.1) and at.vs_tolerance == "beyond"
  assert at.policy_lag == pytest.approx(lag_mean(4, 128)) and at.invariant_up_to_B == 16
  assert at.b_crit_identified and at.b_crit_lo <= 128 <= at.b_crit_hi


def test_runs_of_one_k_have_no_section(tmp_path):
  root = write_grid(str(tmp_path), (2, 16), (0,), seeds=range(3))
  study, table = read(root)
  assert staleness.staleness(study, table) is None
  out = os.path.join(root, "report")
  assert report.main([root, "--out", out, "--reps", "200", "--fit_reps", "50"]) == 0
  with open(os.path.join(out, "report.md")) as f:
    md = f.read()
  assert "Staleness" not in md and "staleness" not in md
  assert not os.path.exists(os.path.join(out, f"{staleness.STEM}.csv"))


def test_a_run_that_never_reached_the_target_is_censored_not_dropped(tmp_path):
  root = write_grid(str(tmp_path), (2, 16), (0, 4))
  # Seed 0 at B = 128, k = 4 never reaches the target: rewritten in place.
  write_run(os.path.join(root, "stale", "p=16,k=4,seed=0"), 16, 4, 0, never=True)
  study, table = read(root)
  runs = study.verdict_runs()
  lost = runs[runs.name == "p=16,k=4,seed=0"]
  assert len(lost) == 1 and math.isinf(lost.responses_to_target.iloc[0])  # kept, as inf
  r = cell(staleness.staleness(study, table).facts["cells"], 128, 4)
  values = np.sort(runs[runs.config == r.config].responses_to_target.to_numpy(float))
  assert values.size == 5 and np.isinf(values[-1])
  # The median of 5 with one censored: the third value (dropped, it would be the mean of the
  # second and third of four), finite; its upper bound the censored run.
  assert r.rtt.n == 5 and r.rtt.point == values[2] and math.isinf(r.rtt.hi)
  assert r.rtt.point != pytest.approx(np.median(values[:4]))
  k0 = np.median(runs[runs.config == cell(staleness.staleness(study, table).facts["cells"],
                                          128, 0).config].responses_to_target)
  assert r.ratio.n == 5 and r.ratio.point == pytest.approx(values[2] / k0)
  assert math.isfinite(r.ratio.point) and r.ratio.point == pytest.approx(truth(4, 128), rel=0.15)
  assert "(n=5, " in iv(r.ratio, "×") and "(n=5, " in iv(r.rtt)


def test_old_runs_with_overlap_read_as_k_1_and_0(tmp_path):
  for p in (2, 16):
    for on in (False, True):
      for s in range(3):
        write_run(os.path.join(tmp_path, "old", f"p={p},overlap={on},seed={s}"), p, int(on), s,
                  overlap=on)
  with open(os.path.join(tmp_path, "old", "p=2,overlap=True,seed=0", "config.json")) as f:
    assert "max_staleness" not in json.load(f)["rollout"]  # written as an old run was
  study, table = read(str(tmp_path))
  t = staleness.with_staleness(study, table)
  runs = study.verdict_runs()
  for r in t.itertuples():
    names = set(runs[runs.config == r.config].name)
    assert names and all(f"overlap={bool(r.k)}," in n for n in names), (r.k, names)
  sec = staleness.staleness(study, table)
  cells = sec.facts["cells"]
  assert sorted(set(zip(cells.B, cells.k))) == [(16, 0), (16, 1), (128, 0), (128, 1)]
  assert cell(cells, 128, 1).ratio.point == pytest.approx(truth(1, 128), rel=0.1)
  assert cell(cells, 128, 1).lag.point == pytest.approx(lag_mean(1, 128))


def test_which_correction_keeps_the_ratio_within_the_tolerance(tmp_path):
  # Uncorrected: 2x at B = 128, k = 4; "tis" (cost C / 50): 1.02x; "mis" as "tis", run at
  # k = 4 only: read against the uncorrected k = 0.
  write_grid(str(tmp_path), (2, 16), (0, 4), stage="none")
  write_grid(str(tmp_path), (2, 16), (0, 4), stage="tis", correction="tis", cost=C / 50)
  write_grid(str(tmp_path), (2, 16), (4,), stage="mis", correction="mis", cost=C / 50)
  study, table = read(str(tmp_path))
  sec = staleness.staleness(study, table)
  line = [v for v in sec.verdict if v.startswith("Off-policy correction (grpo, k = 4)")]
  assert len(line) == 1, sec.verdict
  assert "none: **does not** (beyond at B = 128)" in line[0]
  assert "tis: **keeps it within** at every B" in line[0]
  assert "mis: **keeps it within** at every B" in line[0]
  assert ("grpo, correction mis: against k = 0 of correction none (no k = 0 run with mis)."
          in sec.text)
  cells = sec.facts["cells"]
  assert cell(cells, 128, 4, "tis").ratio.point == pytest.approx(truth(4, 128, C / 50), rel=0.1)
  assert cell(cells, 128, 4, "mis").ratio.point == pytest.approx(truth(4, 128, C / 50), rel=0.1)
  # tis is read against its own k = 0; only it logs a mismatch KL, KL_PER_K x k every step.
  assert cell(cells, 128, 4, "tis").kl.point == pytest.approx(4 * KL_PER_K)
  assert cell(cells, 16, 0, "tis").kl.point == 0 and cell(cells, 16, 4, "none").kl.n == 0
  assert "correction" in sec.tables[0][1].columns


def test_without_the_batches_the_bracket_and_fit_need_they_say_why(tmp_path):
  """configs/grpo.py's staleness sweep runs B below its B0 = 512 only: the series' reference is
  the nearest batch run, the largest, with none above it to test; two batches fit no B_crit."""
  root = write_grid(str(tmp_path), (2, 8), (0, 2), seeds=range(3), reference_batch=512)
  study, table = read(root)
  sec = staleness.staleness(study, table)
  ks = sec.facts["k_rows"].set_index("k")
  for k in (0, 2):
    assert ks.loc[k].series == staleness.AS_RUN and ks.loc[k].x is None
    assert ks.loc[k].bracket.startswith("not testable here (no batch above the reference "
                                        "B = 64, standing in for B0 = 512"), ks.loc[k].bracket
    assert staleness.b_crit_text(ks.loc[k].fit) == "not identified (2 batches (3 are needed))"
  assert "largest invariant B: k = 0: not testable here; k = 2: not testable here." in " ".join(
      sec.verdict)
  # The ratios to k = 0 need no series beyond the batch itself: 3 seeds, their coverage.
  r = cell(sec.facts["cells"], 64, 2)
  assert r.ratio.n == 3 and r.ratio.point == pytest.approx(truth(2, 64), rel=0.1)
  assert "(n=3, " in iv(r.ratio, "×")


def test_the_reports_batch_series_are_one_per_k_and_correction(tmp_path):
  """analysis/series.py: configurations of different k or correction never share a series
  (before, one fixed-lr series took the first configuration at each B, whatever its k);
  k = 0 without a correction keeps its plain name."""
  from analysis import series as se
  write_grid(str(tmp_path), (2, 4, 16), (0, 4), stage="none")  # a fixed lr at three B
  write_grid(str(tmp_path), (2, 4, 16), (4,), stage="tis", correction="tis", cost=C / 50)
  study, table = read(str(tmp_path))
  got = {(s.staleness, s.correction): s for s in se.series(study, table)}
  assert set(got) == {(0, "none"), (4, "none"), (4, "tis")}
  assert not got[(0, "none")].name.endswith(("k=4", "tis"))
  assert got[(4, "none")].name.endswith(" k=4") and got[(4, "tis")].name.endswith(" k=4 tis")
  for (k, corr), s in got.items():
    rows = table.set_index("config").loc[list(s.configs.values())]
    assert set(rows.max_staleness) == {k} and set(rows.off_policy_correction) == {corr}

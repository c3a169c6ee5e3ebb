"""rlscale/metrics/crossing.py: responses to target that neither the evaluation spacing nor a
later evaluation moves.

Why: a trailing mean over 3 evaluations read one noiseless curve as crossing at 2,278, 2,973
and 4,818 responses when evaluated every 512, 1,024 and 2,048 (true 1,687); a monotone fit read
0.40, 0.43, 0.36, 0.44 at 1,024 ... 1,408 responses as crossing 0.41 at 1,319 (raw: 1,067).
Tolerances are stated beside each assertion and were set before the first run.
"""

import math

import numpy as np
import pytest

from rlscale.metrics import crossing

R0, A, EXPONENT = 0.12, 0.6, 1.5


def curve(c, c_mid):
  """ScaleRL's sigmoid in responses, the shape of the study's learning curves."""
  c = np.maximum(np.asarray(c, float), 1e-9)
  return R0 + (A - R0) / (1 + (c_mid / c) ** EXPONENT)


def true_crossing(c_mid, target):
  return c_mid / ((A - R0) / (target - R0) - 1) ** (1 / EXPONENT)


def test_monotone_fit_pools_adjacent_violators_by_hand():
  np.testing.assert_allclose(crossing.monotone([1, 3, 2, 4]), [1, 2.5, 2.5, 4])
  np.testing.assert_allclose(crossing.monotone([5, 1, 0]), [2, 2, 2])
  np.testing.assert_allclose(crossing.monotone([0, 1, 2]), [0, 1, 2])
  assert crossing.monotone([]).size == 0


def test_first_crossing_interpolates_the_raw_evaluations_by_hand():
  x = [0, 10, 20, 30, 40]
  assert crossing.first_crossing(x, [0.0, 0.2, 0.4, 0.6, 0.8], 0.5) == pytest.approx(25.0)
  # The review's curve: a dip after the crossing does not move it (a monotone fit said 1,319).
  assert crossing.first_crossing([1024, 1152, 1280, 1408], [0.40, 0.43, 0.36, 0.44],
                                 0.41) == pytest.approx(1024 + 128 / 3)
  assert crossing.first_crossing(x, [0.0, 0.6, 0.1, 0.6, 0.8], 0.5) == pytest.approx(
      10 * 0.5 / 0.6)
  assert crossing.first_crossing(x, [0.0, 0.2, 0.4, 0.45, 0.3], 0.5) == math.inf
  assert crossing.first_crossing(x, [0.9, 0.1, 0.1, 0.1, 0.9], 0.3) == 0.0
  assert crossing.bracket(x, [0.0, 0.2, 0.4, 0.6, 0.8], 0.5) == (20.0, 30.0)
  with pytest.raises(ValueError, match="increase"):
    crossing.first_crossing([0, 10, 10], [0, 1, 2], 0.5)


@pytest.mark.parametrize("spacing", [256, 512, 1024, 2048, 4096])
@pytest.mark.parametrize("dip", [1, 2, 3])
def test_a_dip_or_a_collapse_after_the_crossing_does_not_move_it(spacing, dip):
  """Dips of 1-3 evaluations (to 0.05 below the target) right after the crossing, at every
  spacing the study uses: the crossing moves by less than 5% (here: not at all)."""
  c_mid, target = 6000.0, 0.45
  x = np.arange(0, 8 * c_mid, spacing, dtype=float)
  y = curve(x, c_mid)
  clean = crossing.first_crossing(x, y, target)
  after = int(np.flatnonzero(y >= target)[0]) + 1
  dipped = y.copy()
  dipped[after:after + dip] = target - 0.05
  assert abs(crossing.first_crossing(x, dipped, target) / clean - 1) < 0.05
  collapsed = y.copy()
  collapsed[after:] = 0.1  # a late collapse keeps the crossing the run made
  assert crossing.first_crossing(x, collapsed, target) == clean


@pytest.mark.parametrize("c_mid", [6000.0, 12000.0])
def test_identical_noiseless_curves_at_any_spacing_agree_within_5_percent(c_mid):
  """The check: spacings 256 ... 4,096 responses, ratios within 5%. The crossing must
  come after a few evaluations at the coarsest spacing (the study makes its largest batch take
  >= 10 optimizer steps, so >= 10 evaluations): targets whose true crossing lies at >= 3 x
  4,096 responses. A crossing inside the first coarse bracket is unresolvable by any estimator
  that sees only those evaluations; `bracket` reports how wide it was."""
  target = R0 + 0.75 * (A - R0)  # past the steepest part
  truth = true_crossing(c_mid, target)
  assert truth >= 3 * 4096
  got = {}
  for h in (256, 512, 1024, 2048, 4096):
    x = np.arange(0, 20 * truth, h, dtype=float)
    got[h] = crossing.first_crossing(x, curve(x, c_mid), target)
  ratios = np.array(list(got.values())) / got[256]
  assert np.all(np.abs(ratios - 1) < 0.05), got
  assert abs(got[256] / truth - 1) < 0.01


@pytest.mark.parametrize("evals", [10, 20])
def test_noisy_curves_at_any_spacing_agree_within_5_percent(evals):
  """Evaluation noise of the study's 2,000-problem held-out set (0.011, under a quarter of its
  band of 0.05): the raw first crossing reads early when noise pokes above the target, the
  more so the flatter the curve is per evaluation. A curve that crosses after 10 or 20
  evaluations (the study's: 7-23), whatever the spacing from 256 to 4,096 responses, has its
  median over 400 runs within 5% of the truth: the spacing, which grows with B, adds no bias.
  (A curve that climbs 0.003 per evaluation near the target reads ~5% early.)"""
  target = 0.45
  rng = np.random.default_rng(1)
  for h in (256, 512, 1024, 2048, 4096):
    c_mid = evals * h / true_crossing(1.0, target)  # its truth `evals` evaluations in
    truth = true_crossing(c_mid, target)
    x = np.arange(0, 4 * truth, h, dtype=float)
    med = np.median([crossing.first_crossing(x, curve(x, c_mid) + 0.011 *
                                             rng.standard_normal(x.size), target)
                     for _ in range(400)])
    assert abs(med / truth - 1) < 0.05, (h, med, truth)


def test_run_crossing_reads_metrics_rows_and_subtracts_an_offset():
  rows = [{"step": 0, "responses_seen": 0, "acc": 0.1}, {"step": 1, "responses_seen": 64},
          {"step": 2, "responses_seen": 128, "acc": 0.3}, {"step": 3, "responses_seen": 192,
                                                           "acc": "nan"},
          {"step": 4, "responses_seen": 256, "acc": 0.5}]
  assert crossing.run_crossing(rows, "acc", 0.4) == pytest.approx(192.0)
  assert crossing.run_crossing(rows, "acc", 0.4, offset=64) == pytest.approx(128.0)
  assert crossing.run_crossing(rows, "acc", 0.9) == math.inf
  assert crossing.run_crossing([], "acc", 0.4) == math.inf

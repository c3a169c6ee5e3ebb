"""analysis/curve_test.py: a configuration's curve below the reference's, calibrated by permuting
seeds.

Why: comparing the median-over-seeds curves with a band of 0.05 called IDENTICAL
configurations a break in 9-21% of draws per batch at the study's seed spread (5 seeds each),
and its 16-point grid missed the largest gap at an evaluation (0.058 at 1,280 responses).

The simulated study (`study_seeds`): a shared mean curve in responses rising from 0.15 to 0.52,
ScaleRL's sigmoid 0.15 + 0.37 / (1 + (c_mid / c)^2) (logistic in log responses); each seed's
curve shifted in log responses by N(0, 0.28) (the measured seed-to-seed spread of log
time-to-target); evaluation noise N(0, 0.011) per evaluation (2,000 held-out problems); each side
evaluated every `spacing` responses (128 ... 4,096), from one spacing to 32 x the coarser one, the
curve's midpoint at 8 x the coarser spacing. The exponent 2 was chosen so that the old rule
(median gap > 0.05 on a 16-point grid) calls identical 5 v 5 configurations a break in 13-14% of
draws, inside the review's 9-21%. Rates were measured with the seeds below (and, where stated,
with more draws) before the floors were set.
"""

import math

import numpy as np
import pandas as pd
import pytest

from analysis import curve_test as ct

R0, A, EXPONENT = 0.15, 0.52, 2.0
LOG_SPREAD, EVAL_SE = 0.28, 0.011


def mean_curve(c, c_mid):
  c = np.maximum(np.asarray(c, float), 1e-9)
  return R0 + (A - R0) / (1 + (c_mid / c) ** EXPONENT)


def study_seeds(rng, n, spacing, coarse, slower=1.0):
  """n seeds evaluated every `spacing` responses; `coarse` is the coarser spacing of the two
  sides (it sets the span and the midpoint); `slower` stretches the curve in responses."""
  x = np.arange(spacing, 32 * coarse + 1, spacing, dtype=float)
  return [(x, mean_curve(x / (slower * np.exp(LOG_SPREAD * rng.standard_normal())), 8 * coarse)
           + EVAL_SE * rng.standard_normal(x.size)) for _ in range(n)]


def old_rule(cfg, ref, band=0.05):
  """The rule the review measured: the median gap on 16 evenly spaced points > band."""
  x = ct.common_points(cfg, ref)
  grid = np.linspace(x[0], x[-1], 16)
  gap = (np.median([np.interp(grid, *c) for c in ref], 0)
         - np.median([np.interp(grid, *c) for c in cfg], 0))
  return gap.max() > band


def simulate(n, spacing, ref_spacing, slower, draws, seed, permutations=ct.PERMUTATIONS):
  """(fraction of draws curve_test calls a break, fraction the old rule does)."""
  rng = np.random.default_rng(seed)
  coarse = max(spacing, ref_spacing)
  breaks = old = 0
  for d in range(draws):
    cfg = study_seeds(rng, n, spacing, coarse, slower)
    ref = study_seeds(rng, n, ref_spacing, coarse)
    breaks += ct.curve_test(cfg, ref, permutations=permutations, seed=d).rejected
    old += old_rule(cfg, ref)
  return breaks / draws, old / draws


# ---- by hand -------------------------------------------------------------------------------

def test_points_are_the_union_of_evaluations_within_the_span_every_seed_covers():
  cfg = [([0, 100, 200, 300], [0.1, 0.2, 0.3, 0.4]), ([50, 150, 250], [0.1, 0.2, 0.3])]
  ref = [([0, 120, 240, 360], [0.1, 0.2, 0.3, 0.4])]
  np.testing.assert_array_equal(ct.common_points(cfg, ref), [50, 100, 120, 150, 200, 240, 250])
  x, gap = ct.median_gap(cfg, ref)
  assert x.size == gap.size == 7
  # at 150: config seeds 0.25 and 0.2 (median 0.225), reference 0.1 + 0.1 * 30 / 120 = 0.225
  assert gap[3] == pytest.approx(0.0)


def test_the_largest_gap_at_an_evaluation_is_found_where_a_16_point_grid_misses_it():
  """The review's miss: a gap of 0.058 at 1,280 responses only (one evaluation of every seed of
  the configuration reads low there). A 16-point grid over 128 ... 4,096 falls on 1,186.7 and
  1,451.2 and reads 0.016; the union of the evaluations contains 1,280."""
  x = np.arange(128, 4097, 128, dtype=float)
  base = mean_curve(x, 1500.0)
  dip = np.where(x == 1280, 0.058, 0.0)
  cfg = [(x, base - dip + 0.002 * k) for k in range(5)]
  ref = [(x, base + 0.002 * k) for k in range(5)]
  grid = np.linspace(128, 4096, 16)
  grid_gap = np.max(np.median([np.interp(grid, *c) for c in ref], 0)
                    - np.median([np.interp(grid, *c) for c in cfg], 0))
  assert grid_gap == pytest.approx(0.058 * (1 - (1280 - 1186.67) / 128), abs=1e-3)  # 0.016
  r = ct.curve_test(cfg, ref)
  assert r.shortfall == pytest.approx(0.058)
  assert r.at == 1280
  assert r.points == 32 and r.n == r.n_ref == 5
  # every seed of the configuration dips and no seed of the reference does: among the 252
  # splits only 6 reach as far (a median keeps most of the gap when a split moves a dipping
  # seed), and 0.058 > 0.05: a break.
  assert r.exact and r.permutations == math.comb(10, 5)
  assert r.p_value == pytest.approx(6 / 252)
  assert r.rejected


def test_a_real_gap_under_the_band_or_a_curve_above_is_not_a_break():
  x = np.arange(128, 4097, 128, dtype=float)
  ref = [(x, mean_curve(x, 1500.0) + 0.001 * k) for k in range(5)]
  below = [(c[0], c[1] - 0.03) for c in ref]
  r = ct.curve_test(below, ref)
  assert r.shortfall == pytest.approx(0.03)
  assert r.p_value < 0.05  # beyond what the seeds explain ...
  assert not r.rejected  # ... but within the band
  above = [(c[0], c[1] + 0.1) for c in ref]
  r = ct.curve_test(above, ref)
  assert r.shortfall == pytest.approx(-0.1)
  assert not r.rejected
  far_below = [(c[0], c[1] - 0.1) for c in ref]
  assert ct.curve_test(far_below, ref).rejected


def test_random_permutations_past_the_exact_limit_are_seeded_and_include_the_observed_split():
  rng = np.random.default_rng(3)
  cfg = study_seeds(rng, 10, 256, 256)
  ref = study_seeds(rng, 10, 256, 256)
  a, b = ct.curve_test(cfg, ref, seed=1), ct.curve_test(cfg, ref, seed=1)
  assert a == b
  assert not a.exact and a.permutations == ct.PERMUTATIONS + 1  # C(20, 10) = 184,756 > 5,000
  assert 1 / a.permutations <= a.p_value <= 1
  exact = ct.curve_test(cfg[:6], ref[:6])
  assert exact.exact and exact.permutations == math.comb(12, 6)


def test_a_long_dataframe_reads_like_a_list_of_seeds_and_degenerate_inputs_are_not_breaks():
  rng = np.random.default_rng(4)
  cfg = study_seeds(rng, 3, 512, 512)
  ref = study_seeds(rng, 4, 512, 512)
  frame = pd.DataFrame([{"run": f"r{i}", "responses": x, "value": y}
                        for i, c in enumerate(cfg) for x, y in zip(*c)])
  assert ct.curve_test(frame, ref) == ct.curve_test(cfg, ref)
  assert ct.curve_test([(c[0], np.where(c[0] == 1024, np.nan, c[1])) for c in cfg], ref).n == 3
  none = ct.curve_test([], ref)
  assert math.isnan(none.shortfall) and not none.rejected and none.n == 0
  apart = ct.curve_test([([0, 1], [0.1, 0.2])], [([2, 3], [0.1, 0.2])])
  assert math.isnan(apart.p_value) and not apart.rejected
  with pytest.raises(ValueError, match="columns"):
    ct.curve_test(pd.DataFrame({"responses": [1.0], "value": [0.1]}), ref)


# ---- calibration and power by simulation ---------------------------------------------------

@pytest.mark.parametrize("spacing,ref_spacing,measured_old", [(256, 256, 0.13), (1024, 128, 0.14)])
def test_identical_5_v_5_configurations_break_in_at_most_5_percent_of_draws(
    spacing, ref_spacing, measured_old):
  """400 draws of identical configurations, 5 seeds a side (every one of the 252 splits), the
  same spacing or the configuration's 8x coarser than the reference's (B = 1,024 against 128:
  249 points). Measured: breaks in 1.5% (256 v 256) and 3.5% (1,024 v 128) of these draws
  (2.6% and 3.8-4.0% in 1,000-2,000 other draws, 4,096 v 128 included); the old rule in 13% and
  14% of the same draws. The permutation test alone has level 5% (exact when the seeds are
  exchangeable, as at equal spacings); requiring a shortfall over the band removes rejections."""
  rate, old = simulate(5, spacing, ref_spacing, 1.0, 400, seed=spacing + ref_spacing)
  assert rate <= 0.05, (rate, old)
  assert old == pytest.approx(measured_old, abs=0.03), old  # the review's 9-21%


def test_a_5_v_5_configuration_1_5x_slower_in_responses_breaks_in_about_half_the_draws():
  """Power at 5 seeds a side: a configuration whose curve is stretched 1.5x in responses (a log
  shift of 0.41, 1.4 seed spreads; its largest true gap 0.06, just over the band) is a break in
  49.5% of these 400 draws (52-56% in 300 other draws each, spacings 128 ... 4,096 v 128).
  The old rule said "break" in 82% of them, at the price of 13-14% on identical ones."""
  rate, old = simulate(5, 512, 512, 1.5, 400, seed=11)
  assert rate > 0.40, (rate, old)


@pytest.mark.slow(seconds=40)  # heavy for the default run (README); .ci/run runs it
@pytest.mark.parametrize("slower", [1.0, 1.5])
def test_10_v_10_seeds_keep_the_false_break_rate_and_detect_1_5x_slower_in_most_draws(slower):
  """10 seeds a side, 400 draws (2,000 random splits + the observed one): identical
  configurations break in 3.75% of draws, a configuration 1.5x slower in 86%. (The old rule:
  4.25% and 87%: at 10 seeds its trouble is mostly gone; at 5 it is not.)"""
  rate, old = simulate(10, 256, 256, slower, 400, seed=12)
  if slower == 1.0:
    assert rate <= 0.05, (rate, old)
  else:
    assert rate > 0.78, (rate, old)


@pytest.mark.slow(seconds=150)
def test_10_v_10_seeds_at_mixed_spacings():
  """10 seeds a side, the configuration evaluated every 1,024 responses and the reference every
  128 (249 points: the coarse side's seeds are interpolated, so the pooled seeds are only nearly
  exchangeable). False breaks: 4.5% of 2,000 draws (200 random splits each, a valid level-5%
  test at any number of splits; +-0.5% sampling error; 4.65% and 4.55% with the spacings either
  way in 2,000 other draws, against 4.1% at equal spacings). Power against 1.5x slower: 88% of
  400 draws (500 splits each)."""
  rate, old = simulate(10, 1024, 128, 1.0, 2000, seed=13, permutations=200)
  assert rate <= 0.05, (rate, old)
  rate, old = simulate(10, 1024, 128, 1.5, 400, seed=14, permutations=500)
  assert rate > 0.80, (rate, old)

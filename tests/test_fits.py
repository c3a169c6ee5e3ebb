"""analysis/fits.py: every fit recovers the parameters synthetic data were made with.

Tolerances are stated beside each assertion and were set before the first run, not tuned to it.
"""

import math
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "analysis"))
import fits  # noqa: E402

BATCHES = np.array([16, 32, 64, 128, 256, 512, 1024], float)
S_MIN, E_MIN = 200.0, 2e4          # B_crit = 100


def _steps(b):
  # (S/S_min - 1)(E/E_min - 1) = 1 with E = B S  =>  S = S_min + E_min / B.
  return S_MIN + E_MIN / b


def rel(a, b):
  return abs(a / b - 1)


# --- crossing a target -----------------------------------------------------------------------

def test_smooth_is_a_trailing_mean():
  np.testing.assert_allclose(fits.smooth([1, 2, 3, 4, 5], 3), [1, 1.5, 2, 3, 4])
  np.testing.assert_allclose(fits.smooth([1, 5, 2], 1), [1, 5, 2])
  with pytest.raises(ValueError, match="window"):
    fits.smooth([1, 2], 0)


def test_first_crossing_interpolates_by_hand():
  x, y = [0, 10, 20, 30, 40], [0.0, 0.2, 0.4, 0.6, 0.8]
  # Unsmoothed: 0.5 lies halfway between (20, 0.4) and (30, 0.6).
  assert fits.first_crossing(x, y, 0.5, window=1) == pytest.approx(25.0)
  # Window 3: smoothed [0, .1, .2, .4, .6]; 0.5 halfway between (30, .4) and (40, .6) -> 35,
  # later than the raw crossing (the trailing mean never crosses early).
  assert fits.first_crossing(x, y, 0.5, window=3) == pytest.approx(35.0)
  # 0.3 between (20, .2) and (30, .4) -> 25.
  assert fits.first_crossing(x, y, 0.3, window=3) == pytest.approx(25.0)
  assert fits.first_crossing(x, y, 0.9) is None
  assert fits.first_crossing(x, [0.9, 0.1, 0.1, 0.1, 0.1], 0.5) == 0


# --- steps-samples trade-off -----------------------------------------------------------------

def test_fit_tradeoff_noiseless():
  s = _steps(BATCHES)
  f = fits.fit_tradeoff(s, BATCHES * s)
  # Noiseless data: within 5% (it is exact up to the optimizer's tolerance).
  assert rel(f["b_crit"], 100) < 0.05
  assert rel(f["s_min"], S_MIN) < 0.05 and rel(f["e_min"], E_MIN) < 0.05
  assert f["residual"] < 1e-3 and not f["at_bound"]


def test_fit_tradeoff_with_noise():
  rng = np.random.default_rng(0)
  s = _steps(BATCHES) * (1 + 0.03 * rng.standard_normal(BATCHES.size))   # 3% noise on S
  f = fits.fit_tradeoff(s, BATCHES * s)
  assert rel(f["b_crit"], 100) < 0.25         # 25% with 3% noise
  assert f["e_min"] < (BATCHES * s).min()     # E_min is bounded by the smallest E


def test_fit_tradeoff_needs_three_points():
  with pytest.raises(ValueError, match="at least 3"):
    fits.fit_tradeoff([300, 250], [3e3, 8e3])
  with pytest.raises(ValueError, match="non-finite"):
    fits.fit_tradeoff([300, 250, math.inf], [3e3, 8e3, 1e4])


def test_tradeoff_interval_covers_b_crit():
  rng = np.random.default_rng(1)
  points = {}
  for b in BATCHES:   # 4 seeds per batch, 5% noise on steps-to-target
    s = _steps(b) * (1 + 0.05 * rng.standard_normal(4))
    points[int(b)] = list(zip(s, b * s))
  out = fits.tradeoff_interval(points, reps=200, seed=0)
  p, lo, hi = out["b_crit"]
  assert lo <= 100 <= hi and lo <= p <= hi
  assert hi / lo < 1.6                        # an interval, not the whole axis
  assert out["failed"] == 0 and out["reps"] == 200
  assert set(out) >= {"b_crit", "s_min", "e_min"}


def test_tolerance_batch_is_where_e_is_within_tolerance_of_e_min():
  b = fits.tolerance_batch(100.0, 0.2)
  assert b == pytest.approx(20.0)             # B_crit / 5 at 20%
  # On the trade-off curve, E at that batch is exactly 1.2 E_min; a batch above it is not.
  assert b * _steps(b) / E_MIN == pytest.approx(1.2)
  assert 1.5 * b * _steps(1.5 * b) / E_MIN > 1.2


# --- compute-performance sigmoid -------------------------------------------------------------

R0, A, B, C_MID = 0.2, 0.7, 1.2, 3e4
C = np.geomspace(1e3, 1e6, 25)


def test_sigmoid_shape():
  assert fits.sigmoid(0.0, R0, A, B, C_MID) == pytest.approx(R0)
  assert fits.sigmoid(C_MID, R0, A, B, C_MID) == pytest.approx((R0 + A) / 2)
  assert fits.sigmoid(1e30, R0, A, B, C_MID) == pytest.approx(A)


def test_fit_sigmoid_noiseless_and_r0_from_c0():
  f = fits.fit_sigmoid(np.r_[0, C], np.r_[R0, fits.sigmoid(C, R0, A, B, C_MID)])
  assert f["r0"] == R0
  # Noiseless: A within 0.005 (one grid step), B and c_mid within 2%.
  assert abs(f["A"] - A) < 0.005 and rel(f["B"], B) < 0.02 and rel(f["c_mid"], C_MID) < 0.02
  assert f["rmse"] < 1e-3


def test_fit_sigmoid_with_noise():
  rng = np.random.default_rng(2)
  r = fits.sigmoid(C, R0, A, B, C_MID) + 0.005 * rng.standard_normal(C.size)
  f = fits.fit_sigmoid(np.r_[0, C], np.r_[R0, r])
  # DESIGN: A is resolvable to about +-0.02; B within 25%, c_mid within 30% at 0.005 noise.
  assert abs(f["A"] - A) < 0.02 and rel(f["B"], B) < 0.25 and rel(f["c_mid"], C_MID) < 0.3


def test_fit_sigmoid_a_bounded_by_one_and_needs_points():
  r = fits.sigmoid(C, 0.5, 1.0, 2.0, 1e4)
  assert fits.fit_sigmoid(C, r)["A"] <= 1.0
  with pytest.raises(ValueError, match="at least 3"):
    fits.fit_sigmoid([0, 1e3, 1e4], [0.2, 0.3, 0.4])


def test_fit_sigmoid_interval_bootstraps_the_mean_curve():
  rng = np.random.default_rng(3)
  curves = [(np.r_[0, C], np.r_[R0, fits.sigmoid(C, R0, A, B, C_MID)
                                + 0.01 * rng.standard_normal(C.size)]) for _ in range(6)]
  out = fits.fit_sigmoid_interval(curves, reps=60, seed=0)
  mean = fits.fit_sigmoid(np.r_[0, C], np.mean([r for _, r in curves], axis=0))
  for name in ("A", "B", "c_mid"):
    p, lo, hi = out[name]
    assert p == mean[name] and lo <= p <= hi
  # Not "the interval covers the truth" on one data set: with 6 seeds the percentile bootstrap
  # covered A in 24 of 30 data sets (measured offline), so such a test fails 1 time in 5.
  # Instead both bounds of A lie within DESIGN's +-0.02 of the truth, and the interval is narrow.
  assert abs(out["A"][1] - A) < 0.02 and abs(out["A"][2] - A) < 0.02
  assert out["A"][2] - out["A"][1] < 0.05
  assert rel(out["B"][0], B) < 0.25 and rel(out["c_mid"][0], C_MID) < 0.3
  assert out["failed"] == 0


def test_fit_sigmoid_unbiased_on_a_plateau():
  # Data reaching the plateau (C to 330x c_mid) with 0.01 noise: the largest noisy point lies
  # above A, so a grid starting at max(R) would bias A upward (by +0.009 here). Mean error over
  # 10 data sets within 0.004.
  c = np.geomspace(1e3, 1e7, 25)
  errors = []
  for seed in range(10):
    r = fits.sigmoid(c, R0, A, B, C_MID) + 0.01 * np.random.default_rng(seed).standard_normal(25)
    errors.append(fits.fit_sigmoid(c, r, r0=R0)["A"] - A)
  assert abs(np.mean(errors)) < 0.004


def test_extrapolation_check():
  c = np.linspace(0, 3e5, 31)
  r = fits.sigmoid(c, R0, A, B, C_MID)
  out = fits.extrapolation_check(c, r, frac=0.5)
  assert out["n_fit"] == 16 and out["measured"] == pytest.approx(r[-1])
  assert abs(out["error"]) < 0.01             # noiseless: the first half predicts the end


# --- straight lines --------------------------------------------------------------------------

def test_fit_signal_noise():
  g2, tr = 4.0, 400.0                         # B_simple = 100
  b = np.repeat([8, 16, 32, 64, 128], 3).astype(float)
  rng = np.random.default_rng(4)
  y = (g2 + tr / b) * (1 + 0.01 * rng.standard_normal(b.size))     # 1% noise
  f = fits.fit_signal_noise(b, y)
  assert rel(f["b_simple"], 100) < 0.1        # 10% at 1% noise
  lo, hi = f["grad_sq_true_interval"]
  assert lo <= g2 <= hi
  lo, hi = f["trace_interval"]
  assert lo <= tr <= hi and f["r2"] > 0.99
  two = fits.fit_signal_noise([8, 8, 64, 64], [54, 54, 10.25, 10.25])
  assert two["b_simple"] == pytest.approx(100) and math.isnan(two["trace_interval"][0])
  with pytest.raises(ValueError, match="distinct"):
    fits.fit_signal_noise([8, 8], [54, 53])


def test_fit_generation_time_and_critical_batch():
  n = np.array([64, 128, 256, 512, 1024, 2048, 4096], float)
  t0, theta = 2.0, 1000.0
  f = fits.fit_generation_time(n, t0 + n / theta)
  assert rel(f["t0"], t0) < 0.01 and rel(f["theta_max"], theta) < 0.01   # noiseless: 1%
  assert rel(f["n_gen"], t0 * theta) < 0.01
  # Throughput 92 is within 10% of the plateau 100; 50 is not.
  assert fits.critical_generation_batch([8, 1, 4, 2], [100, 10, 92, 50]) == 4
  assert fits.critical_generation_batch([1, 2, 4, 8], [10, 50, 85, 100]) == 8


def test_fit_linear_and_power():
  f = fits.fit_linear([0, 1, 2, 3], [1, 4, 7, 10])
  assert f["slope"] == pytest.approx(3) and f["intercept"] == pytest.approx(1)
  assert f["r2"] == pytest.approx(1)
  b = np.array([16, 32, 64, 128, 256, 512], float)
  rng = np.random.default_rng(6)
  g = 2.0 * b ** -0.5 * np.exp(0.02 * rng.standard_normal(b.size))   # 2% log noise
  p = fits.fit_power(b, g)
  assert abs(p["exponent"] + 0.5) < 0.05 and rel(p["coef"], 2.0) < 0.15
  with pytest.raises(ValueError, match="positive"):
    fits.fit_power([0, 1, 2], [1, 2, 3])

"""analysis/fits.py: every fit recovers the parameters synthetic data were made with, and says
"not identified" (with why) when its data cannot.

Tolerances are stated beside each assertion and were set before the first run, not tuned to it.
"""

import math

import numpy as np
import pytest

from analysis import fits  # noqa: E402

BATCHES = np.array([8, 16, 32, 64, 128], float)  # the CPU study's
E_MIN, B_CRIT = 500.0, 64.0


def rel(a, b):
  return abs(a / b - 1)


def _study(rng, spread, b_crit=B_CRIT, seeds=5):
  """Responses to target per batch and seed: E_min (1 + B/B_crit) x log-normal(spread)."""
  return {int(b): E_MIN * (1 + b / b_crit) * np.exp(spread * rng.standard_normal(seeds))
          for b in BATCHES}


# --- the critical training batch ------------------------------------------------------------

def test_fit_critical_batch_noiseless():
  e = E_MIN * (1 + BATCHES / B_CRIT)
  f = fits.fit_critical_batch(BATCHES, e)
  # Noiseless: within 1% (the grid's parabola refinement).
  assert rel(f["b_crit"], B_CRIT) < 0.01 and rel(f["e_min"], E_MIN) < 0.01
  assert rel(f["s_min"], E_MIN / B_CRIT) < 0.01 and f["residual"] < 1e-3 and not f["at_bound"]
  # The same law McCandlish writes as (S/S_min - 1)(E/E_min - 1) = 1 with S = E/B.
  s = e / BATCHES
  np.testing.assert_allclose((s / f["s_min"] - 1) * (e / f["e_min"] - 1), 1, rtol=0.03)


def test_fit_critical_batch_needs_three_batches():
  with pytest.raises(ValueError, match="at least 3"):
    fits.fit_critical_batch([16, 32], [500, 600])
  with pytest.raises(ValueError, match="non-finite"):
    fits.fit_critical_batch([16, 32, 64], [500, 600, math.inf])


def test_critical_batch_recovers_b_crit_at_low_noise():
  """5% seed spread, 5 seeds: B_crit within 25% in each of 20 synthetic studies, identified in
  at least 18 (the residual test at its 99% quantile, with the spread estimated from the seeds,
  refuses about 2% of correct fits: 1 of these 20)."""
  identified = 0
  for seed in range(20):
    out = fits.critical_batch(_study(np.random.default_rng(seed), 0.05), reps=200, seed=seed)
    identified += out["identified"]
    assert rel(out["b_crit"], B_CRIT) < 0.25, (seed, out["b_crit"])
    assert out["b_crit_lo"] <= out["b_crit"] <= out["b_crit_hi"]
  assert identified >= 18


def test_critical_batch_at_high_noise_covers_or_says_not_identified():
  """30% seed spread: over 100 synthetic studies, an interval it prints covers B_crit at least
  80% of the time; the others say "not identified"."""
  covered = identified = 0
  for seed in range(100):
    out = fits.critical_batch(_study(np.random.default_rng(100 + seed), 0.3), reps=200,
                              seed=seed)
    if out["identified"]:
      identified += 1
      covered += out["b_crit_lo"] <= B_CRIT <= out["b_crit_hi"]
    else:
      assert out["reasons"]
  assert identified >= 20  # it is not silent about everything
  assert covered / identified >= 0.8, (covered, identified)


def test_critical_batch_says_why_it_is_not_identified():
  rng = np.random.default_rng(7)
  # No batch effect at all: B_crit far beyond the batches, a lower bound only.
  flat = fits.critical_batch(_study(rng, 0.05, b_crit=1e6), reps=200)
  assert not flat["identified"] and flat["bound"][0] == "lower"
  assert flat["bound"][1] > 4 * BATCHES.max() / 4
  # E proportional to B: B_crit below the batches, an upper bound only.
  steep = fits.critical_batch(_study(rng, 0.05, b_crit=0.1), reps=200)
  assert not steep["identified"] and steep["bound"][0] == "upper"
  # E that falls with B breaks the law.
  falling = {int(b): 5000 / b * np.exp(0.02 * rng.standard_normal(5)) for b in BATCHES}
  out = fits.critical_batch(falling, reps=100)
  assert not out["identified"] and any("falls" in r for r in out["reasons"])
  # A batch whose median never reached the target: no fit.
  half = _study(rng, 0.05)
  half[128] = np.array([math.inf] * 5)
  reasons = fits.critical_batch({8: half[8], 128: half[128]})["reasons"]
  assert "2 batches (3 are needed)" in reasons
  assert "the median of B = 128 never reached the target" in reasons
  # Two seeds per batch: a bootstrap of medians of 2 takes 3 values; no interval is given.
  two = {b: v[:2] for b, v in _study(rng, 0.05).items()}
  assert any("fewer than 3 seeds" in r for r in fits.critical_batch(two)["reasons"])


def test_critical_batch_keeps_the_reps_whose_median_never_got_there():
  """One of B = 128's 5 seeds never reached the target: its resampled median is inf in
  P(Bin(5, 1/5) >= 3) = 5.8% of the reps, which have no fit. They are kept on the side that
  widens each bound (not dropped, which gave a finite interval conditioned on the other 94%):
  more than 2.5% on each side, so B_crit is unbounded both ways and not identified."""
  study = _study(np.random.default_rng(3), 0.1)
  clean = fits.critical_batch(study, reps=1000)
  assert clean["identified"] and clean["failed_share"] == 0
  study[128][0] = math.inf
  out = fits.critical_batch(study, reps=1000)
  assert abs(out["failed_share"] - 0.0579) < 0.02 and out["failed_reps"] == round(
      1000 * out["failed_share"])
  assert (out["b_crit_lo"], out["b_crit_hi"]) == (0.0, math.inf) and out["e_min_hi"] == math.inf
  assert not out["identified"] and any("never reached" in r for r in out["reasons"])
  assert out["inside"] <= 1 - out["failed_share"] and out["b_crit_draws"].size == out[
      "reps"] - out["failed_reps"]
  # 1 of 10 seeds: 0.16% of the reps fail, the interval stays finite and holds them.
  ten = {b: np.r_[v, v * 1.01] for b, v in _study(np.random.default_rng(4), 0.1).items()}
  ten[128][0] = math.inf
  out = fits.critical_batch(ten, reps=1000)
  assert out["failed_share"] < 0.01 and out["b_crit_lo"] <= out["b_crit"] <= out["b_crit_hi"]
  assert math.isfinite(out["b_crit_hi"])


def test_tolerance_batch_is_where_e_is_within_tolerance_of_e_min():
  b = fits.tolerance_batch(100.0, 0.2)
  assert b == pytest.approx(20.0)             # B_crit / 5 at 20%
  assert (1 + b / 100.0) == pytest.approx(1.2)


# --- the learning rate per batch -------------------------------------------------------------

def test_lr_optimum_refines_between_grid_points_and_flags_edges():
  lrs = np.array([5e-5, 1e-4, 2e-4])
  e = 800 * (1 + 0.2 * np.log2(lrs / 1.3e-4) ** 2)   # best at 1.3e-4, between grid points
  f = fits.lr_optimum(lrs, e)
  assert f["grid_lr"] == 1e-4 and not f["at_edge"]
  assert rel(f["lr"], 1.3e-4) < 0.02       # the parabola in log-log is exact here
  edge = fits.lr_optimum(lrs, [900, 800, 700])
  assert edge["at_edge"] and edge["lr"] == 2e-4
  assert fits.lr_optimum(lrs, [math.inf, 800, math.inf])["lr"] == 1e-4   # no refinement
  assert not fits.lr_optimum(lrs, [math.inf] * 3)["reached"]


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
  # A is resolvable to about +-0.02; B within 25%, c_mid within 30% at 0.005 noise.
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
  # Instead both bounds of A lie within +-0.02 of the truth, and the interval is narrow.
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


# --- diagnostics: "not identified" instead of a number ---------------------------------------

def test_sigmoid_reasons():
  c = np.geomspace(1e3, 1e6, 25)
  ok = fits.fit_sigmoid(np.r_[0, c], np.r_[R0, fits.sigmoid(c, R0, A, B, C_MID)])
  assert ok["reasons"] == []
  # Data that stop before the half-gain point: A is an extrapolation.
  early = np.geomspace(1e3, 1e4, 12)
  f = fits.fit_sigmoid(np.r_[0, early], np.r_[R0, fits.sigmoid(early, R0, A, B, C_MID)])
  assert any("extrapolation" in r or "bound" in r or "edge" in r for r in f["reasons"])
  # A step (B at its upper bound 10): the efficiency is not determined.
  step = fits.fit_sigmoid(c, np.where(c < C_MID, R0, A))
  assert any("B at its bound" in r for r in step["reasons"])
  one = fits.fit_sigmoid_interval([(np.r_[0, c], np.r_[R0, fits.sigmoid(c, R0, A, B, C_MID)])],
                                  reps=5)
  assert any("too few to resample" in r for r in one["reasons"])


def test_signal_noise_reasons():
  b = np.repeat([8, 16, 32, 64], 3).astype(float)
  rng = np.random.default_rng(9)
  noise_only = 0.5 * (1 + 0.3 * rng.standard_normal(b.size))   # no 1/B trend
  f = fits.fit_signal_noise(b, noise_only)
  assert any("tr(Sigma)" in r for r in f["reasons"])
  two = fits.fit_signal_noise([8, 8, 64, 64], [54, 54, 10.25, 10.25])
  assert any("distinct" in r for r in two["reasons"])


def test_generation_time_reasons():
  n = np.array([64, 128, 256, 512], float)
  assert fits.fit_generation_time(n, 0.2 + n / 1000)["reasons"] == []  # N_gen = 200
  # Time that falls with N, or no latency floor: the law does not describe the data.
  assert fits.fit_generation_time(n, 10 - n / 100)["reasons"]
  assert any("t0" in r for r in fits.fit_generation_time(n, -1 + n / 100)["reasons"])
  # A crossing N_gen beyond the batches measured is an extrapolation.
  far = fits.fit_generation_time(n, 100 + n / 1000)
  assert any("outside" in r for r in far["reasons"])


def test_fit_power_interval_covers_the_exponent():
  b = np.array([16, 32, 64, 128, 256, 512], float)
  covered = 0
  for seed in range(200):
    g = 2.0 * b ** -0.5 * np.exp(0.05 * np.random.default_rng(seed).standard_normal(b.size))
    p = fits.fit_power(b, g)
    covered += p["exponent_lo"] <= -0.5 <= p["exponent_hi"]
  assert covered / 200 >= 0.9          # a t interval of a correct model: 95% nominal
  assert math.isnan(fits.fit_power([1, 2], [1, 2])["exponent_lo"])


def _scan_design(seeds):
  """The CPU study's scan: B = 8 ... 64, 4 rates a factor sqrt(2) apart around the sqrt rule."""
  out = {}
  for p in (1, 2, 4, 8):
    j = round(math.log2(p / 2))
    for d in (-1, 0, 1, 2):
      out[(8 * p, float(f"{1e-4 * 2 ** ((j + d) / 2):.3g}"))] = seeds
  return out


def test_lr_exponent_recovers_the_rule_and_its_coverage_is_measured():
  design = _scan_design(3)
  b = np.array([k[0] for k in design], float)
  lr = np.array([k[1] for k in design], float)
  star = 1.2e-4 * (b / 16) ** 0.5
  e = 800 * (1 + 0.3 * np.log2(lr / star) ** 2)
  noiseless = fits.lr_exponent({k: [v] * 3 for k, v in zip(design, e)}, reps=50)
  assert abs(noiseless["exponent"] - 0.5) < 0.05   # the parabola refinement on a sqrt(2) grid
  # On simulated scans with 25% seed spread the interval covers the true exponent >= 90% of
  # the time at 3 seeds per rate; at 2 seeds it covers less, which is why the study runs 3
  # and the report prints the simulated coverage beside the interval.
  three = fits.lr_exponent_coverage(design, 0.5, 0.25, 0.3, datasets=100, reps=100)
  two = fits.lr_exponent_coverage(_scan_design(2), 0.5, 0.25, 0.3, datasets=100, reps=100)
  assert three >= 0.9 and two < three, (three, two)

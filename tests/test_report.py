"""analysis/report.py on a fake study with known laws, on the real tiny sweep, and on bad input."""

import os
import re
import subprocess
import sys

import pandas as pd
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "analysis"))
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures"))
import fake_study  # noqa: E402
import report  # noqa: E402

STEMS = ["1_time_to_target_PxG", "2_curves_vs_responses", "2_rtt_ratio_vs_batch",
         "3_bcrit_vs_target", "3_steps_vs_responses", "4_compute_curves", "4_compute_curves_flops",
         "5_grad_sq_vs_inverse_batch", "5_grad_norm_vs_batch", "6_generation_time",
         "6_training_time", "7_rtt_per_rule", "7_equal_PxG_curves"]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("study"))
  fake_study.write_study(root)
  out = os.path.join(root, "report")
  assert report.main([root, "--out", out, "--reps", "500", "--fit_reps", "10"]) == 0
  with open(os.path.join(out, "report.md")) as f:
    return out, f.read()


def _number(text: str, pattern: str) -> float:
  m = re.search(pattern, text)
  assert m, pattern
  value = m.group(1)
  return float(value[:-1]) * 1e3 if value.endswith("k") else float(value)


def test_every_section_writes_png_pdf_and_csv(fake):
  out, md = fake
  for stem in STEMS:
    for ext in ("png", "pdf", "csv"):
      assert os.path.getsize(os.path.join(out, f"{stem}.{ext}")) > 0, (stem, ext)
    assert len(pd.read_csv(os.path.join(out, f"{stem}.csv"))) > 0, stem
    assert f"]({stem}.png)" in md
  assert "Skipped" not in md and "failed to compute" not in md
  runs = pd.read_csv(os.path.join(out, "runs.csv"))
  assert len(runs) == 50 and (runs.problem.fillna("") == "").sum() == 46
  assert md.index("## Verdict") < md.index("## 1.")


def test_failed_and_unfinished_runs_are_listed(fake):
  _, md = fake
  listed = md[md.index("## Runs not used"):md.index("## 1.")]
  assert f"| batch/{fake_study.FAILED} | failed |" in listed
  assert "RuntimeError: RESOURCE_EXHAUSTED" in listed
  assert f"| batch/{fake_study.UNFINISHED} | running |" in listed
  assert "1 malformed line(s) skipped" in md


def test_largest_invariant_batch_per_rule(fake):
  _, md = fake
  found = {(k, r): int(b) for k, r, b in re.findall(
      r"(\w+), LR rule (\w+): \*\*largest invariant B = (\d+)\*\*", md)}
  assert found == fake_study.LARGEST_INVARIANT


def test_fits_recover_the_known_laws(fake):
  _, md = fake
  assert _number(md, r"grpo generation: t0 = ([\d.]+) s") == pytest.approx(fake_study.T0, rel=0.02)
  assert _number(md, r"grpo generation: .*Θmax = ([\d.]+k?) ") == pytest.approx(
      fake_study.THETA, rel=0.02)
  assert _number(md, r"grpo generation: .*N_gen = t0·Θmax = ([\d.]+)") == pytest.approx(
      fake_study.T0 * fake_study.THETA, rel=0.04)
  # The smoothed crossing lags the law by about one evaluation: B_crit within 25%.
  assert _number(md, r"B_crit = ([\d.]+k?) ") == pytest.approx(fake_study.B_CRIT, rel=0.25)
  actor = fake_study.ACTOR_TRACE / fake_study.ACTOR_G2
  critic = fake_study.CRITIC_TRACE / fake_study.CRITIC_G2
  assert _number(md, r"ppo actor: B_simple from the fit = ([\d.]+)") == pytest.approx(
      actor, rel=0.15)
  assert _number(md, r"ppo critic: B_simple from the fit = ([\d.]+)") == pytest.approx(
      critic, rel=0.15)
  assert "**Fastest to 0.6**: grpo P=32 G=8 B=256 sqrt" in md
  # The PPO actor's window starts after every run's critic warm-up (its zero gradients).
  warmup = fake_study.CRITIC_WARMUP_STEPS * 32 * 8  # responses of the largest P's warm-up
  assert _number(md, r"ppo actor \[([\d.]+k?), ") > warmup


@pytest.mark.slow
def test_a_real_tiny_sweep_says_the_target_was_not_reached(tmp_path):
  """Two real points of the tiny batch_invariance sweep (its base built first), then the report:
  real metrics, none of which reaches the 0.6 target in 512 responses."""
  argv = [sys.executable, os.path.join(REPO, "launch", "sweep.py"),
          f"--config={os.path.join(REPO, 'configs', 'grpo.py')}:tiny",
          "--sweep=batch_invariance", "--workdir=sw", "--only=^p=(4|8),lr_scaling=sqrt,seed=0$"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  d = str(tmp_path / "sw")
  assert report.main([d, "--reps", "500"]) == 0
  with open(os.path.join(d, "report", "report.md")) as f:
    md = f.read()
  assert "**No configuration reached the target**" in md
  assert "undetermined (the reference" in md
  assert md.count("| pending | pending |") == 10  # the points --only left out: listed


def test_a_directory_without_runs_is_a_one_line_error(tmp_path):
  r = subprocess.run([sys.executable, os.path.join(REPO, "analysis", "report.py"),
                      str(tmp_path)], capture_output=True, text=True)
  assert r.returncode == 2
  assert r.stderr.strip().count("\n") == 0 and "error: no runs in" in r.stderr

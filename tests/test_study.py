"""launch/study.py: stages run in order; a stage's choice reaches the later stages' config."""

import json
import os
import subprocess
import sys

import pytest

from rlscale.batch import ConfigError
from rlscale.sweep import study
from sweep_helpers import FAKE_RUN, HERE, REPO

STUDY = os.path.join(HERE, "fixtures", "fake_study_stages.py")


def study_cli(tmp_path, *flags, spec=STUDY):
  argv = [sys.executable, os.path.join(REPO, "launch", "study.py"), f"--study={spec}",
          f"--workdir={tmp_path / 'st'}", "--run_command=" + " ".join(FAKE_RUN), *flags]
  return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_choose_takes_the_fewest_responses_to_target_over_seeds():
  runs = [{"overrides": {"lr": 1.0}, "responses_to_target": 300, "final": 0.7},
          {"overrides": {"lr": 1.0}, "responses_to_target": 500, "final": 0.7},
          {"overrides": {"lr": 2.0}, "responses_to_target": 200, "final": 0.6},
          {"overrides": {"lr": 2.0}, "responses_to_target": None, "final": 0.4},
          {"overrides": {"lr": 2.0}, "responses_to_target": 100, "final": 0.8}]
  value, table = study.choose(runs, "lr")
  assert value == 2.0  # medians: 400 against 200 (the unreached seed counts as infinite)
  assert {t["lr"]: t["median_responses_to_target"] for t in table} == {1.0: 400, 2.0: 200}


def test_choose_breaks_a_tie_of_unreached_values_by_the_final_metric():
  runs = [{"overrides": {"lr": 1.0}, "responses_to_target": None, "final": 0.3},
          {"overrides": {"lr": 3.0}, "responses_to_target": None, "final": 0.5}]
  value, table = study.choose(runs, "lr")
  assert value == 3.0 and all(t["median_responses_to_target"] is None for t in table)


def test_the_chosen_value_reaches_the_next_stage(tmp_path):
  r = study_cli(tmp_path, "--noreport")
  assert r.returncode == 0, r.stdout + r.stderr
  with open(tmp_path / "st" / "study.json") as f:
    record = json.load(f)
  assert record["chosen"]["lr"]["value"] == 2.0
  assert record["stages"]["after"]["config"].endswith("fake_sweep_config.py:lr=2.0")
  for seed in (0, 1):
    with open(tmp_path / "st" / "after" / f"seed={seed}" / "summary.json") as f:
      assert json.load(f)["config"].endswith(":lr=2.0")
  runs = [d for d in os.listdir(tmp_path / "st" / "lr") if d.startswith("lr=")]
  assert len(runs) == 6
  again = study_cli(tmp_path, "--noreport")  # nothing left to run: the same choice
  assert again.returncode == 0, again.stderr
  for d in runs:  # no run started twice
    assert open(tmp_path / "st" / "lr" / d / "starts.txt").read().count("start") == 1
  with open(tmp_path / "st" / "study.json") as f:
    assert json.load(f)["chosen"]["lr"]["value"] == 2.0


def test_dry_run_lists_stages_and_runs_nothing(tmp_path):
  r = study_cli(tmp_path, "--dry_run")
  assert r.returncode == 0, r.stderr
  assert "lr: sweep lr_scan" in r.stdout and "6 points, chooses lr" in r.stdout
  assert "after the choice of lr" in r.stdout
  assert not (tmp_path / "st").exists()


def test_a_stage_using_an_unmade_choice_is_refused_in_one_line(tmp_path):
  r = study_cli(tmp_path, spec=STUDY + ":unchosen")
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == [
      "error: stage 'after': its config '" + os.path.join(HERE, "fixtures",
                                                          "fake_sweep_config.py")
      + ":lr={lr}' uses ['lr'], which no earlier stage chooses"]


def test_a_file_without_stages_is_refused():
  with pytest.raises(ConfigError, match="declares no stages"):
    study.declared(os.path.join(HERE, "fixtures", "fake_sweep_config.py"))


def test_the_report_script_is_found_in_the_checkout():
  from rlscale.sweep import study_cli
  assert study_cli.report_script() == os.path.join(REPO, "analysis", "report.py")


def test_the_shipped_cpu_study_declares_its_stages(tmp_path):
  r = subprocess.run([sys.executable, os.path.join(REPO, "launch", "study.py"),
                      "--study=configs/studies/chain_sum_cpu.py", f"--workdir={tmp_path}/st",
                      "--dry_run"], capture_output=True, text=True, timeout=300, cwd=REPO)
  assert r.returncode == 0, r.stderr
  heads = [line for line in r.stdout.splitlines() if not line.startswith("  ")]
  assert heads == [
      "lr: sweep lr_tuning of configs/grpo_chain_sum.py, 6 points, chooses lr",
      "batch: sweep batch_invariance of configs/grpo_chain_sum.py:lr={lr} (after the choice of "
      "lr)",
      "pairs: sweep group_vs_prompts of configs/grpo_chain_sum.py:lr={lr} (after the choice of "
      "lr)",
      "ppo: sweep actor_critic of configs/ppo_chain_sum.py, 4 points"]
  # Its later stages are valid sweeps once the lr is chosen (checked before anything runs).
  from rlscale.sweep import points
  config = os.path.join(REPO, "configs", "grpo_chain_sum.py:lr=0.0002")
  assert len(points.points(config, "batch_invariance", str(tmp_path / "b"))) == 18
  assert len(points.points(config, "group_vs_prompts", str(tmp_path / "p"))) == 4

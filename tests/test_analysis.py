"""analysis/: the batch of a run is the plan's B (responses per optimizer step) everywhere."""

import json
import os
import sys

import pytest

from rlscale import config_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "analysis"))
import compare_runs  # noqa: E402


def _run(tmp_path, name, prompts, minibatches, rtt):
  cfg = config_files.load(os.path.join(REPO, "configs", f"grpo.py:p={prompts}"))
  cfg.rl.num_minibatches = minibatches
  d = tmp_path / name
  d.mkdir()
  (d / "config.json").write_text(cfg.to_json_best_effort())
  (d / "summary.json").write_text(json.dumps({
      "responses_to_target": rtt, "time_to_target": rtt / 1000,
      "target": {"metric": "eval/accuracy_greedy", "value": 0.6}}))
  rows = [{"step": 0, "responses_seen": 0, "eval/accuracy_greedy": 0.2},
          {"step": 1, "responses_seen": rtt, "eval/accuracy_greedy": 0.6, "actor/lr": 1e-4}]
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(d)


def test_tradeoff_fit_recovers_s_min_and_e_min():
  s_min, e_min = 50.0, 20000.0
  batches = [64, 256, 1024, 4096]
  steps = [s_min + e_min / b for b in batches]
  got = compare_runs.fit_tradeoff(batches, steps)
  assert got == pytest.approx((s_min, e_min, e_min / s_min), rel=1e-9)


def test_batch_is_responses_per_optimizer_step(tmp_path, capsys):
  """With two mini-batches, B is half of P x G and S counts optimizer steps."""
  s_min, e_min = 40.0, 30000.0
  runs = []
  for p in (16, 64, 256):
    b = p * 8 // 2
    opt_steps = s_min + e_min / b
    runs.append(_run(tmp_path, f"p{p}", p, 2, rtt=int(round(opt_steps / 2)) * p * 8))
  compare_runs.main(runs)
  lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
  assert [r["batch"] for r in lines[:3]] == [64, 256, 1024]
  assert [r["batch_prompts"] for r in lines[:3]] == [8, 32, 128]
  for r in lines[:3]:
    assert r["optimizer_steps_to_target"] == 2 * r["responses_to_target"] / (2 * r["batch"])
  fit = lines[-1]
  assert fit["e_min"] / fit["s_min"] == pytest.approx(e_min / s_min, rel=0.1)


def test_a_sweep_directory_stands_for_its_done_points(tmp_path):
  from runs import expand
  points = [{"name": "p=8,seed=0", "status": "done"}, {"name": "p=16,seed=0", "status": "failed"},
            {"name": "p=32,seed=1", "status": "done"}]
  with open(tmp_path / "sweep.json", "w") as f:
    json.dump({"points": points}, f)
  assert expand([str(tmp_path), "other/run"]) == [
      str(tmp_path / "p=8,seed=0"), str(tmp_path / "p=32,seed=1"), "other/run"]
  assert expand([str(tmp_path)], only="seed=0$") == [str(tmp_path / "p=8,seed=0")]

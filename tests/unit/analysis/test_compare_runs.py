"""analysis/compare_runs.py and runs.py: the batch of a run is the plan's B (responses per
optimizer step) everywhere, and a few runs are compared as the report compares a study."""

import json
import os

import pytest

from tests.support import REPO
from rlscale.config import files as config_files

from analysis import compare_runs  # noqa: E402


def _run(tmp_path, name, prompts, minibatches, rtt):
  """A run whose evaluations cross 0.6 at exactly `rtt` responses (0.2 before, 0.6 at)."""
  cfg = config_files.load(os.path.join(REPO, "configs", f"grpo.py:p={prompts}"))
  cfg.rl.num_minibatches = minibatches
  cfg.target.value = 0.6
  d = tmp_path / name
  d.mkdir()
  (d / "config.json").write_text(cfg.to_json_best_effort())
  (d / "summary.json").write_text(json.dumps({"responses_per_s": 1000}))
  rows = [{"step": 0, "responses_seen": 0, "eval/accuracy_greedy": 0.2},
          {"step": 1, "responses_seen": rtt, "eval/accuracy_greedy": 0.6, "time/step": 1.0},
          {"step": 2, "responses_seen": 2 * rtt, "eval/accuracy_greedy": 0.6, "time/step": 1.0}]
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(d)


def test_batch_is_responses_per_optimizer_step(tmp_path, capsys):
  """With two mini-batches, B is half of P x G and S counts optimizer steps; E(B) =
  E_min (1 + B/B_crit) is fitted to the runs' responses to target."""
  e_min, b_crit = 3000.0, 256.0
  runs = []
  for p in (16, 64, 256):
    b = p * 8 // 2
    runs.append(_run(tmp_path, f"p{p}", p, 2, rtt=int(round(e_min * (1 + b / b_crit)))))
  compare_runs.main(runs)
  lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
  assert [r["batch"] for r in lines[:3]] == [64, 256, 1024]
  assert [r["batch_prompts"] for r in lines[:3]] == [8, 32, 128]
  for r in lines[:3]:
    assert r["optimizer_steps_to_target"] == pytest.approx(r["responses_to_target"] / r["batch"])
  fit = lines[-1]
  assert fit["b_crit"] == pytest.approx(b_crit, rel=0.05)
  assert [r["invariant"] for r in lines[:3]] == [True, False, False]  # 1.19x, 1.8x, 3.4x


def test_a_sweep_directory_stands_for_its_done_points(tmp_path):
  """Done by the run directory (summary.json), not by the status the manifest recorded: a point
  marked done without summary.json (stale, hand-edited) is not a run to compare, and one that
  finished after its launcher was killed (still "running") is."""
  from analysis.runs import expand
  points = [{"name": "p=8,seed=0", "status": "done"}, {"name": "p=16,seed=0", "status": "failed"},
            {"name": "p=32,seed=1", "status": "done"}, {"name": "p=4,seed=0", "status": "done"},
            {"name": "p=64,seed=0", "status": "running"}]
  with open(tmp_path / "sweep.json", "w") as f:
    json.dump({"points": points}, f)
  for name in ("p=8,seed=0", "p=32,seed=1", "p=64,seed=0"):
    os.makedirs(tmp_path / name)
    (tmp_path / name / "summary.json").write_text("{}")
  os.makedirs(tmp_path / "p=4,seed=0")  # says done; its run stopped before summary.json
  assert expand([str(tmp_path), "other/run"]) == [
      str(tmp_path / "p=8,seed=0"), str(tmp_path / "p=32,seed=1"),
      str(tmp_path / "p=64,seed=0"), "other/run"]
  assert expand([str(tmp_path)], only="seed=0$") == [str(tmp_path / "p=8,seed=0"),
                                                     str(tmp_path / "p=64,seed=0")]


def test_a_missing_or_unreadable_run_is_named_and_left_out(tmp_path, capsys):
  """The comparison goes on with the runs it can read; each one left out is named."""
  from analysis import compare_runs
  from analysis.study_table import load_run
  run, why = load_run(str(tmp_path / "gone"))
  assert run is None and why == [f"{tmp_path / 'gone'}: not a run directory (it does not exist)"]
  os.makedirs(tmp_path / "empty")
  run, why = load_run(str(tmp_path / "empty"))
  assert run is None and "no config.json" in why[0]
  with pytest.raises(SystemExit) as e:
    compare_runs.main([str(tmp_path / "gone"), str(tmp_path / "empty")])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "gone: not a run directory (it does not exist); left out" in err
  good = _run(tmp_path, "p16", 16, 1, rtt=3000)
  compare_runs.main([str(tmp_path / "gone"), good])
  out = capsys.readouterr()
  assert "gone: not a run directory (it does not exist); left out" in out.err
  assert json.loads(out.out.splitlines()[0])["run"] == "p16"
  with pytest.raises(SystemExit):
    compare_runs.main([good, "--reference", str(tmp_path / "gone")])
  assert "--reference=" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--band=-1", "--rtt_tolerance=nan", "--band=wide"])
def test_a_bad_tolerance_is_refused_naming_its_flag(flag, capsys):
  with pytest.raises(SystemExit) as e:
    compare_runs.main(["any_run", flag])
  assert e.value.code == 2 and f"argument {flag.split('=')[0]}:" in capsys.readouterr().err

"""The benchmark scripts run and print their JSON lines (tiny sizes; the figures are not tested)."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO



def _run(script, *args, timeout=600):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  out = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), *args],
                       capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
  assert out.returncode == 0, out.stderr[-3000:]
  return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_decode_benchmark():
  (row,) = _run("decode.py", "--batch=8", "--prompt_len=8", "--new_tokens=32", "--layers=2",
                "--d_model=64", "--mlp_dim=128", "--vocab=64", "--repeats=3", "--bandwidth_mb=8")
  assert row["gen_tokens_per_s"] > 0 and row["batch"] == 8 and row["compile_s"] >= 0
  # The roofline's bytes: every weight, and 8 rows' keys and values (2 layers x 2 kv heads x
  # 64 x float32, K and V) over the mean context of 8 prompt + 32 / 2 generated tokens.
  assert row["decode_bytes_per_step"] == row["param_bytes"] + 8 * (2 * 2 * 2 * 64 * 4) * 24
  assert row["bandwidth_gb_per_s"] > 0
  # The decode's time is the call's less the prefill's: on a busy machine the difference of two
  # medians of sub-millisecond calls can vanish, and then it is said, never a negative time.
  if row["decode_step_s"] is None:
    assert "not resolved" in row["decode_note"] and row["decode_tokens_per_s"] is None
    assert row["decode_fraction_of_bandwidth"] is None
  else:
    assert row["decode_step_s"] > 0 and row["decode_tokens_per_s"] > 0
    assert row["decode_fraction_of_bandwidth"] == pytest.approx(
        row["decode_bytes_per_step"] / row["decode_step_s"] / (row["bandwidth_gb_per_s"] * 1e9),
        rel=0.02)  # rounded


@pytest.mark.slow
def test_decode_floor_benchmark():
  (row,) = _run("decode_floor.py", "--batch=8", "--prompt_len=8", "--new_tokens=8", "--layers=2",
                "--d_model=64", "--mlp_dim=128", "--vocab=64", "--steps=4", "--repeats=2")
  assert row["mean_context"] == 12 and row["dots_ms"] > 0 and row["attention_ms"] > 0
  assert row["floor_ms"] == pytest.approx(row["dots_ms"] + row["attention_ms"], abs=2e-3)


@pytest.mark.slow
def test_generation_scaling_benchmark():
  rows = _run("generation_scaling.py", "--config=configs/grpo.py:tiny", "--batches=8,16",
              "--repeats=2")
  assert [r["generation_batch"] for r in rows[:-1]] == [8, 16]
  assert rows[-1]["critical_generation_batch"] in (8, 16)


@pytest.mark.slow
def test_noise_scale_overhead_benchmark(tmp_path):
  (row,) = _run("noise_scale_overhead.py", "--config=configs/grpo.py:tiny", "--steps=4",
                f"--cache_dir={tmp_path}")
  assert row["with_noise_scale"]["microbatch"] == row["without"]["microbatch"]
  assert row["without_one_microbatch"]["microbatch"] == 2 * row["without"]["microbatch"]
  assert "overhead_of_step" in row and "overhead_vs_one_microbatch" in row


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rl_step_benchmark(algorithm):
  (row,) = _run("rl_step.py", f"--algorithm={algorithm}", "--prompts=4", "--group=4",
                "--prompt_len=8", "--new_tokens=8", "--layers=2", "--d_model=64", "--mlp_dim=128",
                "--vocab=64", "--steps=2", "--matmul=128")
  assert row["P"] * row["G"] == 16 and row["steps"] == 2 and row["microbatch_auto"]
  assert 0 < row["microbatch"]["actor"] < 16  # the plan's auto choice: 2+ passes (noise scale)
  assert row["step_s"] >= row["generate_s"] + row["update_s"] > 0
  assert row["responses_per_s"] == pytest.approx(16 / row["step_s"], rel=0.01)  # rounded
  assert row["update_tflops_per_s"] > 0 and row["matmul_tflops_per_s"] > 0
  assert row["host_peak_rss_gb"] > 0
  if algorithm == "ppo":
    assert "critic_update_s" in row and 0 < row["microbatch"]["critic"] < 16


@pytest.mark.slow
def test_profile_step_benchmark():
  rows = _run("profile_step.py", "--prompts=4", "--group=4", "--prompt_len=8", "--new_tokens=8",
              "--layers=2", "--d_model=64", "--mlp_dim=128", "--vocab=64", "--top=5")
  assert [r["phase"] for r in rows] == ["generate", "update"]
  for r in rows:
    assert r["op_s"] > 0 and r["wall_s"] > 0 and len(r["top"]) == 5
    assert sum(t["share"] for t in r["top"]) <= 1.0 + 1e-6
    # ops are named after the framework ops they came from (ops XLA inserted have no origin)
    assert any(t["from"] for t in r["top"])
    assert not any(t["op"].startswith(("while", "Common")) for t in r["top"])  # ops only


@pytest.mark.slow(seconds=30)
def test_real_run_benchmark(tmp_path):
  from tests.support.policy_folder import write_policy_folder
  folder = write_policy_folder(str(tmp_path / "qwen"), num_layers=2, d_model=64, num_heads=2,
                               num_kv_heads=1, head_dim=32, mlp_dim=128)
  (row,) = _run("real_run.py", f"--checkpoint={folder}", "--new_tokens=8", "--remat=full")
  assert row["steps"] == 2 and len(row["per_step"]["time/step"]) == 2
  assert row["remat"] == "full" and row["logprob_chunk"] == 8192
  assert {"model.safetensors", "tokenizer.json"} <= set(row["exported"])
  assert row["memory"]["actor_update"]["compiled_temp_gb"] > 0 and row["host_peak_rss_gb"] > 0


def test_same_numbers_compares_the_computation_not_the_machine():
  """benchmarks/same_numbers.py's comparison: timing, memory and throughput keys may differ;
  any other number, a missing key or a missing row is a difference, named by step and key."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      "same_numbers", os.path.join(REPO, "benchmarks", "same_numbers.py"))
  m = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(m)
  row = {"step": 1, "actor/loss": 0.25, "time/step": 1.0, "memory/host_peak_gb": 2.0,
         "throughput/responses_per_s": 9.0, "wall_time": 3.0}
  machine = dict(row, **{"time/step": 2.0, "memory/host_peak_gb": 3.0,
                         "throughput/responses_per_s": 1.0, "wall_time": 9.0})
  assert m.compare([row], [machine]) is None
  assert m.compare([row], [dict(row, **{"actor/loss": 0.25000000000000006})]) == (
      "step 1: actor/loss = 0.25 before, 0.25000000000000006 after")
  assert "actor/loss = 0.25 before, absent after" in m.compare(
      [row], [{k: v for k, v in row.items() if k != "actor/loss"}])
  assert m.compare([row], [row, row]) == "1 rows before, 2 after"
  # A stated relative tolerance, and keys whose change is the point left out.
  near = dict(row, **{"actor/loss": 0.25 * (1 + 5e-5)})
  assert m.compare([row], [near], rtol=1e-4) is None
  assert m.compare([row], [near], rtol=1e-5) is not None
  assert m.max_relative([row], [near]) == (pytest.approx(5e-5, rel=1e-3), "actor/loss")
  tiny = dict(row, **{"actor/approx_kl": 5.9e-15})  # rounding noise around 0
  assert m.compare([tiny], [dict(tiny, **{"actor/approx_kl": 2.9e-15})], rtol=1e-4, atol=1e-9) is None
  noise = dict(row, **{"actor/noise_responses/b_simple": 3.0})
  assert m.compare([noise], [row], ignore=("actor/noise_responses",)) is None
  assert "absent after" in m.compare([noise], [row])


@pytest.mark.slow
def test_matmul_shapes_benchmark():
  (row,) = _run("matmul_shapes.py", "--rows=32", "--decode_rows=4", "--square=64", "--repeats=2")
  assert row["framework"] == "jax" and row["square_gflops_per_s"] > 0
  # Five weights: forward, input and weight gradients in training; the forward in decode.
  assert len(row["train_each"]) == 15 and len(row["decode_each"]) == 5
  assert row["train_of_square"] == pytest.approx(
      row["train_gflops_per_s"] / row["square_gflops_per_s"], abs=2e-3)


@pytest.mark.slow(seconds=45)
def test_study_throughput_benchmark():
  """The scan slice at the tests' shape (two rates, one side): the runs, their rate, compile
  seconds from the runs' logs and the evaluation's figures."""
  *_, side, last = _run("study_throughput.py", "--slice=scan", "--tiny")
  assert side["side"] == "after" and side["runs"] == 2
  assert side["runs_per_hour"] == pytest.approx(2 * 3600 / side["wall_s"], rel=0.01)
  assert side["compile_s_per_run"] > 0 and side["programs_per_run"] > 0
  assert 0 < side["eval_share"] < 1 and side["eval_rows_per_run"] > 0
  assert last == {"slice": "scan", "runs_per_hour": side["runs_per_hour"],
                  "cpu_s_per_run": side["cpu_s_per_run"]}


@pytest.mark.slow
def test_long_run_benchmark(tmp_path):
  (row,) = _run("long_run.py", "--steps=8", "--every=2", f"--workdir={tmp_path}/run")
  assert row["end"]["step"] == 8 and row["early"]["step"] >= 1
  assert row["end"]["rss_mb"] > 0 and row["end"]["fds"] > 0
  assert row["end_window"]["samples"] >= 1 and row["end_window"]["fds_min"] > 0
  assert row["max_checkpoints"] >= 1 and row["end"]["checkpoints"] <= 3
  assert row["end"]["metrics_bytes"] > row["early"]["metrics_bytes"] > 0

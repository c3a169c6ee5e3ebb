"""The throughput model's algebra, its calibration, the accelerator table and analysis/scale.py
on a synthetic run directory (no timing)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO
from analysis.throughput import accelerators
from rlscale.config import files as config_files
from analysis.throughput import calibration as tc
from analysis.throughput import model as tm



def workload(**kw):
  base = dict(responses=512, prompt_len=100.0, response_len=200.0, decode_steps=256,
              matmul_params=7e9, params=7e9, layers=32, param_bytes=2,
              kv_bytes_per_token=2 * 32 * 8 * 128 * 2, attn_flops_per_key=4 * 32 * 32 * 128,
              train_flops_per_response=6 * 7e9 * 300, trained_models=1, optimizer_steps=4,
              minibatch=128)
  base.update(kw)
  return tm.Workload(**base)


CAL = tm.Calibration(e_train=0.4, e_flops=0.4, e_bw=0.7, t_lat=1e-3, reward_per_response=1e-3,
                     other=0.5, source="test")


def test_table_loads_every_row_with_a_source():
  table = accelerators.load()
  assert {"h100", "h200", "a100", "tpu-v5e", "tpu-v5p", "tpu-v6e", "cpu"} <= set(table)
  assert table["h100"].peak_flops == 989e12 and table["h200"].hbm_bw == 4.8e12
  assert table["cpu"].shared_host and table["cpu"].peak_flops is None
  assert all(a.source for a in table.values())


def test_unknown_accelerator_names_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown accelerator 'b200'; known: a100, cpu, h100"):
    accelerators.get("b200")


def test_a_bad_row_is_refused(tmp_path):
  path = tmp_path / "t.json"
  path.write_text(json.dumps({"x": {"peak_flops": -1, "hbm_bytes": 1, "hbm_bw": 1,
                                    "intra_bw": 1, "chips_per_node": 8, "source": "s"}}))
  with pytest.raises(ValueError, match="accelerator 'x': peak_flops=-1"):
    accelerators.load(str(path))


def test_colocated_is_generate_plus_train_plus_fixed():
  acc = accelerators.get("h100")
  for n in (1, 8, 64):
    p = tm.predict(workload(), acc, CAL, n, "colocated")
    assert p.step == pytest.approx(p.generate + p.train + p.fixed)
    assert p.fixed == pytest.approx(512 * 1e-3 + 0.5)


def test_allreduce_zero_at_one_chip_and_larger_across_nodes():
  acc, w = accelerators.get("h100"), workload()
  assert tm.allreduce(w, acc, 1) == 0
  intra, inter = tm.allreduce(w, acc, 8), tm.allreduce(w, acc, 16)
  assert inter / intra == pytest.approx((15 / 16) / (7 / 8) * acc.intra_bw / acc.inter_bw)
  want = 2 * 7 / 8 * 7e9 * 4 / acc.intra_bw * w.optimizer_steps
  assert intra == pytest.approx(want)


def test_split_sums_or_overlaps_and_best_split_is_best():
  acc, w = accelerators.get("h200"), workload()
  p = tm.split(w, acc, CAL, 16, 8)
  assert p.step == pytest.approx(p.generate + p.sync + p.train + p.fixed)
  q = tm.split(w, acc, CAL, 16, 8, staleness=1)
  assert q.step == pytest.approx(max(q.generate, q.train + q.sync) + q.fixed)
  assert q.layout == "split k=1" and p.layout == "split"
  best = tm.best_split(w, acc, CAL, 16)
  assert all(best.step <= tm.split(w, acc, CAL, 16, s).step for s in range(1, 16))
  assert tm.best_split(w, acc, CAL, 1) is None


def test_the_pipeline_is_serial_at_k0_bounded_by_the_slower_role_and_absorbs_variation():
  assert tm.pipelined(3.0, 2.0, 0, cv=0.5) == 5.0  # k = 0: in turn, whatever the variation
  assert tm.pipelined(3.0, 2.0, 1) == 3.0 and tm.pipelined(1.0, 2.0, 4) == 2.0  # constant
  # A decode time varying from step to step (sd / mean 0.5), the trainer as fast on average:
  # one step ahead stalls on slow decodes; more steps ahead queue responses for it.
  steps = [tm.pipelined(2.0, 2.0, k, cv=0.5) for k in (1, 2, 4, 8)]
  assert steps == sorted(steps, reverse=True)
  assert steps[0] > 2.0 * 1.1  # k = 1 loses more than 10% to the variation
  assert 2.0 <= steps[-1] < steps[0]  # never below the slower role's mean
  assert all(tm.pipelined(g, 1.0, k, cv=0.3, seed=s) >= g  # even where a seed's draws
             for g in (1.0, 3.0) for k in (1, 8) for s in range(20))  # average below g
  # Worked by hand: decodes of 1, 3, 1, 3 s and a 2 s update. k = 0: in turn, 3 + 5 + 3 + 5.
  # k = 1: decode t starts at the later of decode t-1's end and update t-2's: decodes end at
  # 1, 4, 5, 9, updates at 3, 6, 8, 11. k = 2: decode 3 need not wait for update 1: 3, 6, 8, 10.
  gens = [1.0, 3.0, 1.0, 3.0]
  assert tm.update_ends(gens, 2.0, 0) == [3.0, 8.0, 11.0, 16.0]
  assert tm.update_ends(gens, 2.0, 1) == [3.0, 6.0, 8.0, 11.0]
  assert tm.update_ends(gens, 2.0, 2) == [3.0, 6.0, 8.0, 10.0]


def test_generation_and_training_fall_with_chips_until_rows_run_out():
  acc, w = accelerators.get("h200"), workload()
  gen = [tm.generation(w, acc, CAL, n).seconds for n in (1, 2, 8, 64, 512)]
  assert gen == sorted(gen, reverse=True)
  assert tm.generation(w, acc, CAL, 1024).seconds == pytest.approx(gen[-1])  # 512 rows
  train = [tm.training(w, acc, CAL, n).seconds - tm.training(w, acc, CAL, n).allreduce
           for n in (1, 8, 128, 1024)]
  assert train[0] > train[1] > train[2] == pytest.approx(train[3])  # a mini-batch is 128 rows


def test_critical_generation_batch_is_where_latency_meets_throughput():
  acc, w = accelerators.get("h200"), workload(kv_bytes_per_token=0.0)
  g = tm.generation(w, acc, CAL, 1)
  fl, bw = acc.peak_flops * CAL.e_flops, acc.hbm_bw * CAL.e_bw
  t0 = w.params * w.param_bytes / bw + CAL.t_lat
  assert g.critical == pytest.approx(t0 / (w.decode_flops(1) / fl))


def test_bend_reasons_appear_where_constructed():
  acc = accelerators.get("h100")
  idle = tm.predict(workload(responses=16, minibatch=16), acc, CAL, 64, "colocated")
  assert "rows per chip < 1" in idle.reason
  small = tm.predict(workload(), acc, dataclasses.replace(CAL, reward_per_response=0, other=0),
                     64, "colocated")
  assert "decode latency-bound" in small.reason
  slow_host = tm.predict(workload(), acc, dataclasses.replace(CAL, other=1e4), 8, "colocated")
  assert "fixed per-step costs" in slow_host.reason
  big = workload(params=70e9, matmul_params=70e9, optimizer_steps=64, responses=4096,
                 minibatch=4096, train_flops_per_response=1e6)
  assert "all-reduce over inter-node" in tm.predict(big, acc, CAL, 64, "colocated").reason


def test_calibration_reproduces_the_calibration_run():
  small = workload(params=1e6, matmul_params=1e6, train_flops_per_response=1e9)
  for w, name, chips in ((small, "cpu", 1), (small, "cpu", 4), (workload(), "h100", 8)):
    m = tc.Measured(generate=3.0, train=5.0, reward=0.2, other=0.3, sync=0.0, step=8.5,
                    chips=chips)
    cal, acc = tc.calibrate(w, m, accelerators.get(name))
    p = tm.predict(w, acc, cal, chips, "colocated")
    assert (p.generate, p.train, p.fixed) == pytest.approx((3.0, 5.0, 0.5), rel=1e-9)
  w, fast = workload(), tc.Measured(generate=1e-4, train=5.0, reward=0, other=0, sync=0, step=5,
                                    chips=8)
  cal, acc = tc.calibrate(w, fast, accelerators.get("h100"))  # faster than the roofline
  assert tm.predict(w, acc, cal, 8, "colocated").generate == pytest.approx(1e-4)


def test_calibration_reproduces_a_split_run():
  w, acc = workload(), accelerators.get("h100")
  m = tc.Measured(generate=3.0, train=5.0, reward=0.2, other=0.3, sync=0.4, step=8.9, chips=16,
                  layout="split", sampler=4)
  cal, acc = tc.calibrate(w, m, acc)
  p = tm.predict(w, acc, cal, 16, "split", sampler=4)
  assert (p.generate, p.sync, p.train, p.step) == pytest.approx((3.0, 0.4, 5.0, 8.9))


def test_shared_host_devices_add_no_compute():
  w = workload(params=1e6, matmul_params=1e6, train_flops_per_response=1e9)
  m = tc.Measured(generate=1.0, train=2.0, reward=0, other=0, sync=0, step=3, chips=1)
  cal, acc = tc.calibrate(w, m, accelerators.get("cpu"))
  one, eight = (tm.predict(w, acc, cal, n, "colocated") for n in (1, 8))
  assert eight.generate == pytest.approx(one.generate, rel=1e-2)  # + each device's weight reads
  assert eight.train >= one.train  # the same compute, plus host-memory all-reduces


def test_steps_to_target():
  assert tm.steps_to_target(5120, 512, 512, 1) == (10, "the run's responses to target, kept")
  steps, how = tm.steps_to_target(5120, 1024, 1024, 1, bcrit=1024, smin=100)
  assert steps == pytest.approx(200) and "S_min" in how
  assert tm.steps_to_target(None, 512, 512, 1)[0] is None


def synthetic_run(path, devices=1, sampler=0, gen=0.2, train=0.5, reward=0.01, other=0.02):
  """A run directory as the trainer writes it, with made-up phase times (split: `sampler` of
  the devices sample, with a 0.05 s weight sync)."""
  step = gen + train + reward + other
  cfg = config_files.load("configs/grpo.py:tiny")
  if sampler:
    cfg.mesh.roles, cfg.mesh.sampler_devices = "split", sampler
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write(cfg.to_json())
  rows = [{"step": 0, "time/eval": 1.0}]
  for s in range(1, 7):
    rows.append({"step": s, "time/generate": gen, "time/reward": reward,
                 "time/actor_update": train, "time/other": other,
                 "time/step": step + (s == 6) * 0.3 + bool(sampler) * 0.05,
                 **({"time/weight_sync": 0.05} if sampler else {}),
                 "time/eval": (s == 6) * 0.3, "flops/step": 2e8, "response_tokens": 40,
                 "train_tokens": 100, "responses_seen": 16 * s})
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(path, "summary.json"), "w") as f:
    json.dump({"devices": devices, "num_prompts": 4, "group_size": 4,
               "responses_to_target": 64}, f)
  return path


def test_load_run_reads_medians_past_compilation(tmp_path):
  run = tc.load_run(synthetic_run(str(tmp_path / "run")))
  m = run.measured
  assert (m.generate, m.train, m.reward + m.other, m.step) == pytest.approx(
      (0.2, 0.5, 0.03, 0.73))
  assert (m.layout, m.chips, run.workload.responses) == ("colocated", 1, 16)


def test_a_split_run_calibrates_its_weight_sync(tmp_path, capsys):
  run = synthetic_run(str(tmp_path / "run"), devices=4, sampler=2)
  m = tc.load_run(run).measured
  assert (m.layout, m.chips, m.sampler, m.sync, m.step) == pytest.approx(
      ("split", 4, 2, 0.05, 0.78))
  assert scale_cli().main([run, "--chips", "2,4", "--accelerator", "cpu",
                           "--out", str(tmp_path / "out")]) == 0
  text = capsys.readouterr().out
  assert "4 cpu device(s), split 2+2; measured step 0.78 s" in text and "(+0.0%)" in text


def scale_cli():
  from analysis import scale
  return scale


def test_scale_cli_writes_table_csv_and_figure(tmp_path, capsys):
  run = synthetic_run(str(tmp_path / "run"))
  out = tmp_path / "out"
  assert scale_cli().main([run, "--chips", "1,8,64", "--accelerator", "h200",
                           "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "predicted 0.73" in text and "(+0.0%)" in text
  assert "steps to target at 16 responses/step: 4 " in text
  for ext in ("csv", "png", "pdf"):
    assert (out / f"scale.{ext}").stat().st_size > 0
  import pandas as pd
  df = pd.read_csv(out / "scale.csv")
  assert set(df.layout) == {"colocated", "split"} and list(df.chips[:3]) == [1, 8, 64]
  assert df.speedup[0] == 1 and (df.reason.str.len() > 0).all()
  with pytest.raises(ValueError, match="unknown accelerator 'b200'; known: a100"):
    scale_cli().main([run, "--accelerator", "b200", "--out", str(out)])


def test_for_model_keeps_the_runs_passes_with_the_models_shape(tmp_path):
  run = tc.load_run(synthetic_run(str(tmp_path / "run")))
  cfg = tc.model_config("qwen3-0.6b")
  w = tc.for_model(run.workload, cfg, prompt_len=100, max_new_tokens=200)
  assert (w.prompt_len, w.response_len, w.decode_steps) == (100, 200, 200)
  assert (w.params, w.layers, w.param_bytes) == (cfg.num_params(), 28, 2)
  assert w.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
  assert tc.training_passes(w) == pytest.approx(tc.training_passes(run.workload))
  assert (w.responses, w.optimizer_steps) == (16, run.workload.optimizer_steps)
  same = tc.for_model(run.workload, run.model)  # the run's model, its lengths: its workload
  assert same == run.workload
  short = tc.for_model(run.workload, cfg, max_new_tokens=200, response_len=50)
  assert short.response_len == 50 and short.train_flops_per_response < w.train_flops_per_response
  with pytest.raises(ValueError, match="response_len=300 exceeds max_new_tokens=200"):
    tc.for_model(run.workload, cfg, max_new_tokens=200, response_len=300)


# The lead's idle-machine measurement (benchmarks/scale_validation.py): devices -> generate,
# train, reward + other, step (seconds); the step here is the phases' sum.
MEASURED = {1: (0.113, 0.449, 0.0076), 2: (0.0975, 0.525, 0.0096), 4: (0.1027, 0.590, 0.0094),
            8: (0.145, 0.622, 0.0136)}
STEP = {1: 0.560, 2: 0.638, 4: 0.700, 8: 0.788}


def shared_host_runs(tmp_path, counts=(2, 4)):
  out = []
  for n in counts:
    g, t, f = MEASURED[n]
    path = synthetic_run(str(tmp_path / f"d{n}"), devices=n, gen=g, train=t, reward=f / 2,
                         other=f / 2)
    out.append(tc.load_run(path))
  return out


def phases(p):
  return (p.generate, p.train, p.fixed)


def test_two_run_calibration_reproduces_both_runs_and_extrapolates_linearly(tmp_path):
  runs = shared_host_runs(tmp_path)
  w = runs[0].workload
  cal, acc = tc.calibrate_runs([(r.workload, r.measured) for r in runs], accelerators.get("cpu"))
  assert cal.source.startswith("runs on 2, 4 cpu devices") and not cal.per_device.zero
  for n in (2, 4):  # both calibration runs, phase by phase
    assert phases(tm.predict(w, acc, cal, n, "colocated")) == pytest.approx(MEASURED[n])
  bare = dataclasses.replace(cal, per_device=tm.PerDevice())
  for n in (1, 8):  # each phase: the model's own + a + b·N, a straight line through 2 and 4
    p, q = tm.predict(w, acc, cal, n, "colocated"), tm.predict(w, acc, bare, n, "colocated")
    for k, ph in enumerate(tm.PHASES):
      a, b = getattr(cal.per_device, ph)
      assert phases(p)[k] == pytest.approx(phases(q)[k] + a + b * n)
      line = MEASURED[2][k] + (MEASURED[4][k] - MEASURED[2][k]) * (n - 2) / 2
      assert phases(p)[k] == pytest.approx(line, abs=2e-3)  # the tiny model's own N is small
  one, eight = (tm.predict(w, acc, cal, n, "colocated").step for n in (1, 8))
  assert one == pytest.approx(0.60, abs=0.01) and eight == pytest.approx(0.84, abs=0.01)
  assert 0.04 < one / STEP[1] - 1 < 0.10 and 0.03 < eight / STEP[8] - 1 < 0.09  # was -28% at 8


def test_several_runs_fit_a_line_by_least_squares():
  assert tc._line([1, 2, 4], [1, 3, 7]) == pytest.approx((-1, 2))
  assert tc._line([1, 2, 3], [0, 2, 1]) == pytest.approx((0, 0.5))
  assert tc._line([4, 4], [1, 3]) == (2, 0)


def test_the_per_device_cost_is_dropped_for_a_gpu_target(tmp_path):
  runs = shared_host_runs(tmp_path)
  cal, acc = tc.calibrate_runs([(r.workload, r.measured) for r in runs], accelerators.get("cpu"))
  w, h200 = runs[0].workload, accelerators.get("h200")
  gpu = tc.transfer(cal, acc, h200, w)
  assert gpu.per_device.zero and gpu.source == "defaults"
  assert tc.transfer(cal, acc, acc, w) == cal  # the same host keeps it
  bare = dataclasses.replace(cal, per_device=tm.PerDevice())
  for n in (1, 8):  # and the model never adds it off a shared host
    assert tm.predict(w, h200, cal, n, "colocated") == tm.predict(w, h200, bare, n, "colocated")


def test_single_run_calibration_is_unchanged(tmp_path):
  run = shared_host_runs(tmp_path, counts=(1,))[0]
  cpu = accelerators.get("cpu")
  one = tc.calibrate_runs([(run.workload, run.measured)], cpu)
  assert one == tc.calibrate(run.workload, run.measured, cpu)
  assert one[0].per_device.zero and one[0].source == "run"
  p = tm.predict(run.workload, one[1], one[0], 8, "colocated")
  assert p.generate == pytest.approx(MEASURED[1][0], rel=0.05)  # no per-device growth


def test_several_runs_are_refused_off_a_shared_host_or_at_one_count(tmp_path):
  runs = shared_host_runs(tmp_path)
  pairs = [(r.workload, r.measured) for r in runs]
  with pytest.raises(ValueError, match="shared host .cpu. only; on h100"):
    tc.calibrate_runs(pairs, accelerators.get("h100"))
  with pytest.raises(ValueError, match=r"two or more device counts, got \[2, 2\]"):
    tc.calibrate_runs([pairs[0], pairs[0]], accelerators.get("cpu"))
  other = tc.load_run(synthetic_run(str(tmp_path / "x"), devices=8))
  other = dataclasses.replace(other, workload=other.workload.with_responses(32))
  with pytest.raises(ValueError, match="is not the config of"):
    tc.same_config([runs[0], other])


def test_scale_cli_calibrates_on_several_run_dirs(tmp_path, capsys):
  d2, d4 = (r.path for r in shared_host_runs(tmp_path))
  base = ["--chips", "1,8", "--layout", "colocated"]
  assert scale_cli().main([d2, d4, *base, "--accelerator", "cpu", "--out",
                           str(tmp_path / "cpu")]) == 0
  assert scale_cli().main([d2, d4, *base, "--out", str(tmp_path / "h200")]) == 0
  assert scale_cli().main([d2, *base, "--out", str(tmp_path / "one")]) == 0
  text = capsys.readouterr().out
  assert "calibration on " + d4 in text and "calibrated from runs on 2, 4 cpu devices" in text
  assert "per-device cost is kept" in text and "per-device cost is dropped on h200" in text
  assert "calibrated from one run: no per-device cost (b = 0)" in text
  import pandas as pd
  df = pd.read_csv(tmp_path / "cpu" / "scale.csv")
  assert df.step[1] == pytest.approx(0.84, abs=0.01)


def hf_folder(path):
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 512,
               "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 64, "vocab_size": 1000, "rope_theta": 1e6}, f)
  return path


def test_model_config_reads_a_named_size_or_a_hugging_face_folder(tmp_path):
  folder = hf_folder(str(tmp_path / "hf"))
  a, b = tc.model_config(folder), tc.model_config(os.path.join(folder, "config.json"), "float32")
  assert (a.family, a.num_layers, a.num_kv_heads, a.param_dtype) == ("qwen2", 3, 2, "bfloat16")
  assert a.num_params() == b.num_params() and b.param_dtype == "float32"
  assert tc.model_config("qwen3-1.7b").num_layers == 28
  with pytest.raises(ValueError, match="model 'nope' is neither a named size .*qwen3-0.6b"):
    tc.model_config("nope")


def test_scale_cli_predicts_for_a_given_model_and_lengths(tmp_path, capsys):
  run = synthetic_run(str(tmp_path / "run"))
  folder = hf_folder(str(tmp_path / "my-model"))
  base = ["--chips", "1,8", "--layout", "colocated", "--prompts", "8", "--group", "4"]
  assert scale_cli().main([run, *base, "--out", str(tmp_path / "own")]) == 0
  assert scale_cli().main([run, *base, "--model", folder, "--max_new_tokens", "64",
                           "--prompt_len", "32", "--out", str(tmp_path / "hf")]) == 0
  text = capsys.readouterr().out
  assert "predicted 0.73" in text and "(+0.0%)" in text  # the calibration is the run's
  assert "predicting for model my-model (bfloat16)" in text
  assert "predicting for model the run's model: " in text
  assert "32 responses/step, prompt 32 + response 64 tokens, 64 decode steps" in text
  import pandas as pd
  own, hf = (pd.read_csv(tmp_path / d / "scale.csv") for d in ("own", "hf"))
  assert (hf.step > own.step).all() and list(hf.chips) == [1, 8]
  assert tc.load_run(run).workload.responses == 16


@pytest.mark.slow
def test_scale_cli_refuses_a_mistake_in_one_line(tmp_path):
  run = synthetic_run(str(tmp_path / "run"))
  bad = subprocess.run([sys.executable, os.path.join(REPO, "analysis", "scale.py"), run,
                        "--accelerator", "b200"], capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2 and bad.stderr.startswith("error: unknown accelerator 'b200'")


@pytest.mark.parametrize("args, expect", [
    (["--chips", "0"], "argument --chips: 0 in '0': a chip count is at least 1"),
    (["--chips", "8,abc,-4"], "argument --chips: 'abc' in '8,abc,-4' is not a whole number"),
    (["--prompts", "-2"], "argument --prompts: '-2' must be >= 0"),
    (["--bcrit", "nan"], "argument --bcrit: 'nan' must be >= 0"),
])
def test_scale_cli_names_the_flag_of_a_bad_value_before_reading_runs(args, expect, tmp_path,
                                                                   capsys):
  with pytest.raises(SystemExit) as e:
    scale_cli().main([str(tmp_path / "not_read"), *args])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and expect in err[-1], err


def test_scale_cli_names_a_run_directory_it_cannot_use(tmp_path):
  with pytest.raises(ValueError, match="missing: not a run directory \\(it does not exist\\)"):
    tc.load_run(str(tmp_path / "missing"))
  run = synthetic_run(str(tmp_path / "run"))
  os.remove(os.path.join(run, "metrics.jsonl"))
  with pytest.raises(ValueError, match="run: metrics.jsonl has no RL steps"):
    tc.load_run(run)
  os.remove(os.path.join(run, "summary.json"))
  with pytest.raises(ValueError, match="run: no summary.json: the run has not finished"):
    tc.load_run(run)


def test_published_table_is_predicted():
  from analysis.throughput.published import published
  rows = published()
  assert rows and all(r["calibrated"] == (r["chips"] == 8) for r in rows)
  assert all(abs(r["rel_error"]) < 1e-6 for r in rows if r["calibrated"])


def test_the_accelerator_table_and_the_mfu_peaks_agree():
  """flops.PEAKS and flops.HBM_BW (MFU and the decode benchmark's roofline, by jax device_kind)
  and accelerators.json (the throughput model) state the same datasheet figures for the chips
  both know."""
  from analysis.throughput import accelerators
  from rlscale.metrics import flops
  table = accelerators.load()
  pairs = {"NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200",
           "NVIDIA A100-SXM4-80GB": "a100", "TPU v5e": "tpu-v5e", "TPU v5p": "tpu-v5p",
           "TPU v6e": "tpu-v6e"}
  for kind, row in pairs.items():
    assert flops.PEAKS[kind] == table[row].peak_flops, (kind, row)
    if kind in flops.HBM_BW:
      assert flops.HBM_BW[kind] == table[row].hbm_bw, (kind, row)

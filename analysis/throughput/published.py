"""The published strong-scaling tables the throughput model is checked against.

`analysis/throughput/published_scaling.json` holds numbers quoted from published text (source, table
and URL with each). `published()` calibrates the model on each model's smallest chip count and
predicts the others; benchmarks/scale_validation.py prints the rows.
"""

from __future__ import annotations

import json
import os

PUBLISHED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published_scaling.json")


def opt_workload(point: dict, table: dict):
  """A PPO step of DeepSpeed-Chat's recipe on an OPT actor: decoder shape from the point,
  training = actor update (6 N per token) + reference forward (2 N per token); the OPT-350M
  critic and reward model are left out (under 3% of a 13B actor's FLOPs)."""
  from analysis.throughput import model as tm
  n, layers, d = point["params"], point["layers"], point["d_model"]
  tokens = table["prompt_len"] + table["response_len"]
  return tm.Workload(
      responses=table["responses_per_step"], prompt_len=table["prompt_len"],
      response_len=table["response_len"], decode_steps=table["response_len"],
      matmul_params=int(n), params=int(n), layers=layers, param_bytes=2,
      kv_bytes_per_token=2 * layers * d * 2, attn_flops_per_key=4 * layers * d,
      train_flops_per_response=8.0 * n * tokens, trained_models=1, optimizer_steps=1,
      minibatch=table["responses_per_step"])


def published(path: str = PUBLISHED) -> list[dict]:
  """Each model's smallest chip count calibrates one factor k on the datasheet-default
  efficiencies (compute and bandwidth rates / k, decode latency x k); the others are predicted.
  Returns one row per point with the measured and predicted hours and the relative error."""
  from analysis.throughput import accelerators
  from analysis.throughput import model as tm
  with open(path) as f:
    tables = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
  out = []
  for name, t in tables.items():
    acc = accelerators.get(t["hardware"])
    steps = t["responses"] / t["responses_per_step"]
    for model in dict.fromkeys(p["model"] for p in t["points"]):
      pts = sorted((p for p in t["points"] if p["model"] == model), key=lambda p: p["chips"])
      w = opt_workload(pts[0], t)
      cal = tm.Calibration(e_train=tm.DEFAULTS["e_train"], e_flops=tm.DEFAULTS["e_flops"],
                           e_bw=tm.DEFAULTS["e_bw"], t_lat=tm.DEFAULTS["lat_per_layer"] *
                           w.layers, reward_per_response=0.0, other=0.0, source="defaults")
      first = tm.predict(w, acc, cal, pts[0]["chips"], "colocated")
      want = pts[0]["hours"] * 3600 / steps
      k = (want - first.allreduce) / (first.step - first.allreduce)
      cal = tm.Calibration(cal.e_train / k, cal.e_flops / k, cal.e_bw / k, cal.t_lat * k,
                           0.0, 0.0, "published smallest point")
      for p in pts:
        pred = tm.predict(w, acc, cal, p["chips"], "colocated")
        hours = pred.step * steps / 3600
        out.append({"table": name, "model": model, "chips": p["chips"],
                    "measured_hours": p["hours"], "predicted_hours": round(hours, 3),
                    "rel_error": round(hours / p["hours"] - 1, 3),
                    "calibrated": p is pts[0], "reason": pred.reason,
                    "efficiency_factor_k": round(k, 3)})
  return out

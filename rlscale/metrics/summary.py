"""summary.json of an RL run: counters, the batch plan, target, final evaluation, and the
mean throughputs and phase times of its steps."""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from rlscale.plan.batch import BatchPlan

MEAN_PREFIXES = ("throughput/", "mfu/", "time/")  # and every model's explained variance


def _steps(workdir: str) -> list[dict[str, Any]]:
  if jax.process_index() != 0:
    return []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [row for row in rows if row.get("step", 0) > 0]


def summarize(cfg: ml_collections.ConfigDict, workdir: str, counters: dict[str, Any],
              last_eval: dict[str, float], plan: BatchPlan) -> dict[str, Any]:
  steps = _steps(workdir)
  out = {"kind": cfg.kind, "num_prompts": plan.num_prompts, "group_size": plan.group_size,
         "responses_per_step": plan.responses, "batch": plan.describe(), **counters,
         "devices": jax.device_count(), "processes": jax.process_count(),
         "platform": jax.devices()[0].platform, "device_kind": jax.devices()[0].device_kind,
         "target": {"metric": cfg.target.metric, "value": cfg.target.value},
         "responses_to_target": counters.get("responses_to_target"),
         "time_to_target": counters.get("time_to_target"), **last_eval}
  if counters.get("wall_time"):
    out["responses_per_s"] = counters["responses_seen"] / counters["wall_time"]
  variance = [f"{m}/explained_variance" for m in plan.models]
  keys = sorted({k for row in steps for k in row})
  for k in keys:
    if k.startswith(MEAN_PREFIXES) or k in variance:
      values = [row[k] for row in steps if isinstance(row.get(k), (int, float))]
      if values and np.isfinite(np.mean(values)):
        out[f"mean/{k}"] = float(np.mean(values))
  finals = variance + [f"{m}/noise_{u}/b_simple" for m in plan.models
                       for u in ("responses", "prompts")]
  for k in finals:
    last = [row[k] for row in steps if k in row]
    if last:
      out[f"final/{k}"] = last[-1]
  return out


def compilations(workdir: str, counts: dict[str, int]) -> dict[str, int]:
  """This process's compilation counts, or, when it compiled nothing (a restart of a finished
  run), those the run's summary.json recorded."""
  path = os.path.join(workdir, "summary.json")
  if any(counts.values()) or not os.path.exists(path):
    return counts
  with open(path) as f:
    return json.load(f).get("compilations", counts)

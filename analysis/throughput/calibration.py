"""Calibration of the throughput model (analysis/throughput/model.py) from a run directory.

A run's config.json, metrics.jsonl and summary.json give its workload (model shape, batch plan,
measured tokens and FLOPs) and its median phase seconds past compilation. From one run: e_train
from the update's FLOPs; decode compute at e_train, bandwidth at e_bw, and what the roofline
leaves of the measured decode is t_lat (or, when the roofline alone is slower, e_f and e_bw are
scaled down), so the calibration run is reproduced exactly (no per-device term: b = 0).

From runs of one config at two or more device counts N on a shared host (`cpu`): the model is
calibrated on the run with the fewest devices, and each phase's residual (measured less
modelled: generate, train, fixed = reward + other) is fitted by least squares as a + b·N, b the
host's cost per device. A phase is then modelled + a + b·N, so each phase is a + b·N beyond the
model's own N-dependence (host-memory all-reduces, each device's weight reads); with two runs
both are reproduced exactly.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any

from rlscale.metrics import flops
from analysis.throughput.accelerators import Accelerator
from analysis.throughput.model import (DEFAULTS, PHASES, Calibration, PerDevice, Workload,
                                      allreduce, generation, predict, weight_sync)

SKIP_STEPS = 2  # steps 1-2 compile
TRAIN_KEYS = ("time/logprobs", "time/actor_update", "time/critic_update")
FIXED_KEYS = ("time/reward", "time/other")
NOT_STEP_KEYS = ("time/eval", "time/checkpoint")  # periodic, outside the step model


@dataclasses.dataclass(frozen=True)
class Measured:
  """A run's median phase seconds past compilation, and where it ran."""
  generate: float
  train: float
  reward: float
  other: float
  sync: float
  step: float  # time/step less eval and checkpoint
  chips: int
  layout: str = "colocated"
  sampler: int = 0  # split: the sampler's chips
  staleness: int = 0  # rollout.max_staleness
  gen_cv: float = 0.0  # sd / mean of the decode time over steps (0 where not measured)


def medians(rows: list[dict], skip: int = SKIP_STEPS) -> dict[str, float]:
  """Median of each time/ metric over steps past `skip` (step 0 is the starting evaluation)."""
  steps = [r for r in rows if r.get("step", 0) > skip] or [r for r in rows if r.get("step", 0)]
  if not steps:
    raise ValueError("metrics.jsonl has no RL steps to calibrate from")
  def med(fn):
    return statistics.median(fn(r) for r in steps)
  out = {k: med(lambda r, k=k: float(r.get(k, 0.0))) for k in
         TRAIN_KEYS + FIXED_KEYS + ("time/generate", "time/weight_sync", "response_tokens",
                                    "train_tokens", "flops/step")}
  # The decode time's step-to-step variation: from successive differences (sd / sqrt 2), so
  # that a drift over the run (responses growing longer) is not read as jitter.
  gen = [float(r.get("time/generate", 0.0)) for r in steps]
  diffs = [b - a for a, b in zip(gen, gen[1:])]
  out["gen_cv"] = (statistics.pstdev(diffs) / math.sqrt(2) / statistics.fmean(gen)
                   if len(diffs) > 1 and statistics.fmean(gen) > 0 else 0.0)
  out["train"] = med(lambda r: sum(float(r.get(k, 0.0)) for k in TRAIN_KEYS))
  out["step"] = med(lambda r: float(r["time/step"]) - sum(float(r.get(k, 0.0))
                                                          for k in NOT_STEP_KEYS))
  return out


def _uncalibrated(acc: Accelerator, w: Workload, m: Measured) -> Calibration:
  return Calibration(e_train=1.0, e_flops=1.0, e_bw=1.0, t_lat=0.0,
                     reward_per_response=m.reward / w.responses, other=m.other, source="run",
                     gen_cv=m.gen_cv)


def calibrate(w: Workload, m: Measured, acc: Accelerator) -> tuple[Calibration, Accelerator]:
  """Efficiencies and latencies that reproduce the measured run on `acc` exactly.

  Returns the calibration and the accelerator (the cpu row with its compute rate filled in).
  """
  cal = _uncalibrated(acc, w, m)
  trainer = m.chips - m.sampler if m.layout == "split" else m.chips
  sampler = m.sampler if m.layout == "split" else m.chips
  used = min(trainer, w.minibatch)
  compute = m.train - allreduce(w, acc, used)
  if compute <= 0:
    raise ValueError(f"the modelled all-reduce on {acc.name} ({allreduce(w, acc, used):.3g} s) "
                     f"exceeds the measured training time ({m.train:.3g} s): its link bandwidth "
                     f"in the accelerator table is too low for this run")
  train_flops = w.train_flops_per_response * w.responses
  if acc.peak_flops is None:  # the cpu row: the host's rate, with e_train = 1 by definition
    acc = acc.with_peak(train_flops / compute)
  else:
    e = train_flops / (compute * acc.peak_flops * (1 if acc.shared_host else used))
    cal = dataclasses.replace(cal, e_train=e, e_flops=e)
  if not acc.shared_host and acc.name != "cpu":
    cal = dataclasses.replace(cal, e_bw=DEFAULTS["e_bw"])
  if m.layout == "split" and m.sync > 0:
    cal = dataclasses.replace(cal, sync_scale=m.sync / weight_sync(w, acc, m.chips))
  g = generation(w, acc, cal, sampler)  # the roofline alone (t_lat = 0)
  calls = math.ceil(w.responses / (w.generation_batch or w.responses))
  left = m.generate - g.seconds
  if left >= 0:
    return dataclasses.replace(cal, t_lat=left / (calls * w.decode_steps)), acc
  scale = g.seconds / m.generate  # the roofline alone is slower: the efficiencies were higher
  return dataclasses.replace(cal, e_flops=cal.e_flops * scale, e_bw=cal.e_bw * scale), acc


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
  """Least-squares (a, b) of y = a + b·x; b = 0 when every x is the same."""
  xs, ys = [float(x) for x in xs], [float(y) for y in ys]
  mx, my = statistics.fmean(xs), statistics.fmean(ys)
  sxx = sum((x - mx) ** 2 for x in xs)
  b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
  return my - b * mx, b


def _phase_devices(p) -> dict[str, int]:
  """The devices each phase runs on: generation the sampler's, training the trainer's."""
  return {"generate": p.sampler, "train": p.trainer, "fixed": p.chips}


def calibrate_runs(runs: list[tuple[Workload, Measured]],
                   acc: Accelerator) -> tuple[Calibration, Accelerator]:
  """One run: calibrate(). Several runs of one config at different device counts on a shared
  host: calibrated on the fewest devices, plus each phase's a + b·N fitted to the residuals."""
  if len(runs) == 1:
    return calibrate(*runs[0], acc)
  counts = sorted(m.chips for _, m in runs)
  if not acc.shared_host:
    raise ValueError(f"a per-device cost is fitted on a shared host (cpu) only; on {acc.name} "
                     f"each device has its own compute: calibrate from one run")
  if len(set(counts)) < 2:
    raise ValueError(f"calibrating from several runs needs two or more device counts, got "
                     f"{counts}")
  w0, m0 = min(runs, key=lambda r: r[1].chips)
  cal, acc = calibrate(w0, m0, acc)
  points: dict[str, list[tuple[int, float]]] = {k: [] for k in PHASES}
  for w, m in runs:
    p = predict(w, acc, cal, m.chips, m.layout, m.sampler, m.staleness)
    seen = {"generate": m.generate, "train": m.train, "fixed": m.reward + m.other}
    for k, n in _phase_devices(p).items():
      points[k].append((n, seen[k] - getattr(p, k)))
  fit = {k: _line([n for n, _ in v], [r for _, r in v]) for k, v in points.items()}
  source = f"runs on {', '.join(map(str, counts))} {acc.name} devices (a + b*N per phase)"
  return dataclasses.replace(cal, per_device=PerDevice(**fit), source=source), acc


def transfer(cal: Calibration, run_acc: Accelerator, target: Accelerator,
             w: Workload) -> Calibration:
  """The calibration to use on `target`: the run's own when the target is the run's kind or
  the run's efficiencies are against a datasheet peak; typical defaults when the run was on
  the CPU and the target is not (a CPU's efficiencies say nothing about a GPU's). Host costs
  (reward, other) are kept as measured either way; the shared host's per-device cost is kept
  only on the same host (on a GPU/TPU each device has its own compute)."""
  if target.name == run_acc.name or not run_acc.shared_host:
    return cal
  return dataclasses.replace(cal, e_train=DEFAULTS["e_train"], e_flops=DEFAULTS["e_flops"],
                             e_bw=DEFAULTS["e_bw"], t_lat=DEFAULTS["lat_per_layer"] * w.layers,
                             sync_scale=1.0, per_device=PerDevice(), source="defaults")


@dataclasses.dataclass
class Run:
  """What the model reads from a run directory."""
  path: str
  workload: Workload
  measured: Measured
  summary: dict[str, Any]
  batch: float  # responses per optimizer step (the actor's), for S = S_min (1 + B_crit / B)
  model: Any = None  # the run's ModelConfig


def shape(cfg) -> dict[str, Any]:
  """The Workload fields a model's shape and dtypes decide (cfg: a ModelConfig)."""
  act, pb = (2 if "16" in str(d) else 4 for d in (cfg.dtype, cfg.param_dtype))
  return dict(matmul_params=flops.matmul_params(cfg), params=cfg.num_params(),
              layers=cfg.num_layers, param_bytes=pb,
              kv_bytes_per_token=2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * act,
              attn_flops_per_key=4 * cfg.num_layers * cfg.num_heads * cfg.head_dim)


def workload(cfg, config: dict, plan, med: dict[str, float]) -> Workload:
  """The step's sizes from the model `cfg`, the config, the batch plan and the measured tokens."""
  r = plan.responses
  rlen = med["response_tokens"] / r
  plen = (med["train_tokens"] - med["response_tokens"]) / r
  gen = flops.rollout_flops(cfg, [plen] * r, [rlen] * r)
  gb = config.get("rollout", {}).get("generation_batch", "auto")
  models = list(plan.models.values())
  return Workload(
      responses=r, prompt_len=plen, response_len=rlen,
      decode_steps=int(config["rollout"]["max_new_tokens"]), **shape(cfg),
      train_flops_per_response=max(med["flops/step"] - gen, 0.0) / r,
      trained_models=len(models), optimizer_steps=sum(m.optimizer_steps for m in models),
      minibatch=plan.main.minibatch, generation_batch=gb if isinstance(gb, int) else 0)


def forward_flops(w: Workload) -> float:
  """FLOPs of one forward pass over one response (prompt and response, causal attention)."""
  n = w.prompt_len + w.response_len
  return 2.0 * w.matmul_params * n + w.attn_flops_per_key * n * (n + 1) / 2


def training_passes(w: Workload) -> float:
  """The step's training FLOPs per response in forward passes over it: 3 per epoch of each
  trained model's update, 1 per extra forward (reference, recomputed log-probs)."""
  return w.train_flops_per_response / forward_flops(w)


def for_model(w: Workload, cfg, prompt_len: float = 0.0, max_new_tokens: int = 0,
              response_len: float = 0.0) -> Workload:
  """The run's step on the model `cfg` and, where given, other sequence lengths: the same
  responses, optimizer steps, generation batch and training passes per response. A new
  max_new_tokens without response_len: every response runs to it (an upper bound)."""
  steps = max_new_tokens or w.decode_steps
  rlen = response_len or (float(max_new_tokens) if max_new_tokens else w.response_len)
  if rlen > steps:
    raise ValueError(f"response_len={rlen:g} exceeds max_new_tokens={steps}")
  new = dataclasses.replace(w, prompt_len=float(prompt_len or w.prompt_len), response_len=rlen,
                            decode_steps=steps, **shape(cfg))
  return dataclasses.replace(new, train_flops_per_response=training_passes(w) *
                             forward_flops(new))


def model_config(spec: str, dtype: str = "bfloat16"):
  """A named size of rlscale.models.NAMED, or a Hugging Face folder or its config.json, with
  activations and parameters in `dtype`."""
  from rlscale import models
  kw = dict(dtype=dtype, param_dtype=dtype)
  if spec in models.NAMED:
    return models.named(spec, **kw)
  folder = os.path.dirname(spec) if os.path.basename(spec) == "config.json" else spec
  if not os.path.isdir(folder or "."):
    raise ValueError(f"model {spec!r} is neither a named size ({', '.join(sorted(models.NAMED))})"
                     f" nor a Hugging Face folder or config.json")
  from rlscale.checkpoints.hf import config_from_folder
  return config_from_folder(folder or ".", **kw)


def _model(config: dict):
  import ml_collections
  from rlscale.resolve import experiment
  return experiment.model_config(ml_collections.ConfigDict(config))


def load_run(path: str, skip: int = SKIP_STEPS) -> Run:
  """A run directory's workload and median phase times (mesh.roles and mesh.sampler_devices
  read with defaults, so runs from before the split layout read as colocated)."""
  from analysis import runs as runs_lib
  from rlscale.plan import batch
  run, warnings = runs_lib.read(path)
  if run is None:
    raise ValueError("; ".join(warnings))
  config, summary = run.config, run.summary
  if not summary:
    raise ValueError(f"{path}: no summary.json: the run has not finished (or stopped early), so "
                     "its devices and its steady step times are not known; give a finished run")
  try:
    med = medians(run.rows, skip)
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path}: {e if isinstance(e, ValueError) else repr(e)}") from e
  plan = batch.plan(config)
  mesh, rollout = config.get("mesh", {}), config.get("rollout", {})
  layout = mesh.get("roles", "colocated")
  m = Measured(generate=med["time/generate"], train=med["train"], reward=med["time/reward"],
               other=med["time/other"], sync=med["time/weight_sync"], step=med["step"],
               chips=int(summary.get("devices") or _devices(mesh)), layout=layout,
               sampler=int(mesh.get("sampler_devices") or 0) if layout == "split" else 0,
               staleness=int(rollout.get("max_staleness", 0) or 0),
               # the decode's own variation: a stale or refilled step's time/generate is a wait
               gen_cv=(med["gen_cv"] if not rollout.get("max_staleness")
                       and not rollout.get("dynamic_sampling") else 0.0))
  cfg = _model(config)
  return Run(path, workload(cfg, config, plan, med), m, summary, float(plan.batch), cfg)


def same_config(runs: list[Run]) -> None:
  """Refuse runs of different configs (model, responses, decode steps, optimizer steps)."""
  def key(r: Run):
    w = r.workload
    return (r.model, w.responses, w.decode_steps, w.optimizer_steps, w.minibatch)
  for r in runs[1:]:
    if key(r) != key(runs[0]):
      raise ValueError(f"{r.path} is not the config of {runs[0].path} (model, responses, "
                       f"decode steps, optimizer steps or mini-batch differ)")


def _devices(mesh: dict) -> int:
  n = math.prod(int(s) for s in mesh.get("shape", [1]))
  if n <= 0:
    raise ValueError("summary.json has no 'devices' and mesh.shape has a -1: pass the run's "
                     "devices")
  return n

"""A calibrated throughput model of one RL step against the number of chips (issue 14).

Decode, per step of a call with b rows per model replica (m chips each, tensor-parallel):
    t_dec(b) = max(bytes(b) / (m·bw·e_bw), flops(b) / (m·peak·e_f)) + t_lat
    bytes(b) = weights + b·KV(context),  flops(b) = b·(2·matmul_params + attention)
so decode is bandwidth-bound at small b and compute-bound at large b; with t0 = W/(m·bw·e_bw)
+ t_lat and per-row time c = f/(m·peak·e_f) − kv/(m·bw·e_bw), the critical generation batch is
N_gen = t0 / c (DESIGN.md: t_gen ≈ t0 + N/Θmax, N_gen ≈ t0·Θmax).
Training: FLOPs / (chips·peak·e_train), plus per optimizer step a ring all-reduce of the
gradients, 2(N−1)/N · bytes / link, over inter-node links once N passes one node.
Fixed: reward scoring (per response) and host time, measured on the host and kept as measured.

Calibration (one run, its median step past compilation): e_train from the update's FLOPs; decode
compute at e_train, bandwidth at e_bw, and what the roofline leaves of the measured decode is
t_lat (or, when the roofline alone is slower, e_f and e_bw are scaled down), so the calibration
run is reproduced exactly. On the `cpu` row (simulated devices of one host) the host's compute
rate is calibrated and shared by all N devices (N of them add no compute); t_lat stays as
calibrated (the devices' programs run concurrently on the host's thread pool), and collectives
are host memory copies at the row's nominal link bandwidth.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from typing import Any

from rlscale import flops
from rlscale.accelerators import Accelerator

SKIP_STEPS = 2  # steps 1-2 compile
TRAIN_KEYS = ("time/logprobs", "time/actor_update", "time/critic_update")
FIXED_KEYS = ("time/reward", "time/other")
NOT_STEP_KEYS = ("time/eval", "time/checkpoint")  # periodic, outside the step model
# Used on a datasheet accelerator when the run is on the CPU (whose efficiencies say nothing
# about a GPU's): typical large-model MFU and decode bandwidth, and a launch latency per layer.
DEFAULTS = {"e_train": 0.4, "e_flops": 0.4, "e_bw": 0.7, "lat_per_layer": 20e-6}
MEMORY_FRACTION = 0.5  # of HBM a replica's weights may take; the rest: KV cache, activations


@dataclasses.dataclass(frozen=True)
class Workload:
  """One RL step: sizes the model counts bytes and FLOPs of."""
  responses: int  # P x G
  prompt_len: float  # mean tokens per prompt
  response_len: float  # mean tokens per response
  decode_steps: int  # decode iterations of a call: it runs until its longest row (max_new_tokens)
  matmul_params: int
  params: int
  layers: int
  param_bytes: int  # per parameter as decode reads and the weight sync sends it
  kv_bytes_per_token: float  # 2 x layers x kv_heads x head_dim x activation bytes
  attn_flops_per_key: float  # 4 x layers x heads x head_dim
  train_flops_per_response: float  # the step's FLOPs less generation, per response
  trained_models: int  # actor (+ critic): gradients all-reduced
  optimizer_steps: int  # per RL step, all trained models
  minibatch: int  # rows of one optimizer step: the most chips it splits over
  generation_batch: int = 0  # rows of one decode call over all chips; 0: the whole step

  def with_responses(self, responses: int) -> "Workload":
    scale = responses / self.responses
    gb = self.generation_batch and min(responses, self.generation_batch)
    return dataclasses.replace(self, responses=int(responses), generation_batch=gb,
                               minibatch=max(1, round(self.minibatch * scale)))

  @property
  def context(self) -> float:
    return self.prompt_len + self.decode_steps / 2  # mean keys a decode step attends to

  def decode_flops(self, rows: float) -> float:
    return rows * (2.0 * self.matmul_params + self.attn_flops_per_key * self.context)

  def decode_bytes(self, rows: float) -> float:
    return self.params * self.param_bytes + rows * self.kv_bytes_per_token * self.context

  def prefill_flops(self, rows: float) -> float:
    return rows * flops_per_token(self) * self.prompt_len

  def generation_flops(self) -> float:
    return self.prefill_flops(self.responses) + self.decode_flops(self.responses) * \
        self.response_len


def flops_per_token(w: Workload) -> float:
  return 2.0 * w.matmul_params + w.attn_flops_per_key * w.prompt_len / 2


@dataclasses.dataclass(frozen=True)
class Calibration:
  e_train: float
  e_flops: float
  e_bw: float
  t_lat: float  # seconds per decode step beyond the roofline (dispatch, launches)
  reward_per_response: float
  other: float  # host seconds per step
  source: str  # "run" or "defaults"
  sync_scale: float = 1.0  # measured / modelled weight sync of a split run (1: not measured)


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase on `chips` chips: seconds, and what bounds it."""
  seconds: float
  chips: int
  rows_per_chip: float = 0.0
  critical: float = 0.0
  allreduce: float = 0.0


def replica_chips(w: Workload, acc: Accelerator) -> int:
  """Chips per model replica: the fewest (a power of two) whose memory holds the weights."""
  if not acc.hbm_bytes:
    return 1
  m = 1
  while w.params * w.param_bytes / m > MEMORY_FRACTION * acc.hbm_bytes:
    m *= 2
  return m


def _rates(acc: Accelerator, cal: Calibration, chips: int, m: int):
  """(FLOP/s, bytes/s, latency) of one replica of m chips out of `chips` on `acc`."""
  if acc.shared_host:  # N devices share one host: each gets 1/N of it
    share = m / max(chips, 1)
    return acc.peak_flops * share * cal.e_flops, acc.hbm_bw * share * cal.e_bw, cal.t_lat
  return m * acc.peak_flops * cal.e_flops, m * acc.hbm_bw * cal.e_bw, cal.t_lat


def generation(w: Workload, acc: Accelerator, cal: Calibration, chips: int) -> Phase:
  m = min(replica_chips(w, acc), chips)
  replicas = chips // m
  per_call = w.generation_batch or w.responses
  calls = math.ceil(w.responses / per_call)
  rows = math.ceil(per_call / replicas)  # a replica's rows of one call
  fl, bw, lat = _rates(acc, cal, chips, m)
  step = max(w.decode_bytes(rows) / bw, w.decode_flops(rows) / fl) + lat
  t = calls * (w.decode_steps * step + w.prefill_flops(rows) / fl)
  per_row = w.decode_flops(1) / fl - w.kv_bytes_per_token * w.context / bw
  t0 = w.params * w.param_bytes / bw + lat
  crit = t0 / per_row if per_row > 0 else math.inf
  return Phase(t, chips, rows_per_chip=per_call / replicas, critical=crit)


def allreduce(w: Workload, acc: Accelerator, chips: int) -> float:
  """Ring all-reduce of float32 gradients, per RL step (every optimizer step of every model)."""
  if chips <= 1:
    return 0.0
  per = 2 * (chips - 1) / chips * w.params * 4 / acc.link_bw(chips)
  return per * w.optimizer_steps


def training(w: Workload, acc: Accelerator, cal: Calibration, chips: int) -> Phase:
  used = min(chips, w.minibatch)  # a mini-batch splits over at most its rows
  if acc.shared_host:
    rate = acc.peak_flops * cal.e_train  # the host's, whatever the device count
  else:
    rate = used * acc.peak_flops * cal.e_train
  ar = allreduce(w, acc, used)
  return Phase(w.train_flops_per_response * w.responses / rate + ar, chips,
               rows_per_chip=w.minibatch / chips, allreduce=ar)


def weight_sync(w: Workload, acc: Accelerator, chips: int) -> float:
  """The trainer's parameters to the sampler's chips over the link between them."""
  return w.params * w.param_bytes / acc.link_bw(chips)


def fixed(w: Workload, cal: Calibration) -> float:
  return cal.reward_per_response * w.responses + cal.other


@dataclasses.dataclass
class Prediction:
  chips: int
  layout: str
  sampler: int
  trainer: int
  generate: float
  train: float
  allreduce: float
  sync: float
  fixed: float
  step: float
  gen_rows_per_chip: float
  critical_gen_batch: float
  train_rows_per_chip: float
  reason: str = ""

  def row(self) -> dict:
    return dataclasses.asdict(self)


def colocated(w, acc, cal, chips: int) -> Prediction:
  g, t, f = generation(w, acc, cal, chips), training(w, acc, cal, chips), fixed(w, cal)
  p = Prediction(chips, "colocated", chips, chips, g.seconds, t.seconds, t.allreduce, 0.0, f,
                 g.seconds + t.seconds + f, g.rows_per_chip, g.critical, t.rows_per_chip)
  p.reason = reason(p, acc)
  return p


def split(w, acc, cal, chips: int, sampler: int, overlap: bool = False) -> Prediction:
  trainer = chips - sampler
  g, t = generation(w, acc, cal, sampler), training(w, acc, cal, trainer)
  s, f = weight_sync(w, acc, chips) * cal.sync_scale, fixed(w, cal)
  step = (max(g.seconds, t.seconds + s) if overlap else g.seconds + s + t.seconds) + f
  p = Prediction(chips, "split-overlap" if overlap else "split", sampler, trainer, g.seconds,
                 t.seconds, t.allreduce, s, f, step, g.rows_per_chip, g.critical, t.rows_per_chip)
  p.reason = reason(p, acc)
  return p


def best_split(w, acc, cal, chips: int, overlap: bool = False) -> Prediction | None:
  """The sampler:trainer split with the shortest step (None below 2 chips)."""
  best = None
  for s in range(1, chips):
    p = split(w, acc, cal, chips, s, overlap)
    if best is None or p.step < best.step:
      best = p
  return best


def reason(p: Prediction, acc: Accelerator) -> str:
  """What bounds this point: idle chips, latency-bound decode, a collective, fixed costs."""
  share = {k: getattr(p, k) / p.step for k in ("generate", "train", "allreduce", "sync", "fixed")}
  out = []
  if p.gen_rows_per_chip < 1 or p.train_rows_per_chip < 1:
    out.append(f"rows per chip < 1: idle chips (generate {p.gen_rows_per_chip:.2g}, "
               f"train {p.train_rows_per_chip:.2g} rows/chip)")
  if math.isinf(p.critical_gen_batch) and share["generate"] > 0.2:
    out.append("decode bound by KV-cache reads at every batch (never compute-bound)")
  elif p.gen_rows_per_chip < p.critical_gen_batch and share["generate"] > 0.2:
    out.append(f"decode latency-bound: generation batch per replica {p.gen_rows_per_chip:.3g} "
               f"< critical {p.critical_gen_batch:.3g}")
  where = "inter-node" if p.trainer > acc.chips_per_node else "intra-node"
  if share["allreduce"] > 0.1:
    out.append(f"gradient all-reduce over {where} links: {share['allreduce']:.0%} of step")
  if share["sync"] > 0.1:
    out.append(f"weight sync: {share['sync']:.0%} of step")
  if share["fixed"] > 0.2:
    out.append(f"fixed per-step costs: {share['fixed']:.0%} of step")
  top = max(("generate", "train", "fixed", "sync"), key=share.get)
  return "; ".join(out) or f"{top} {share[top]:.0%} of step"


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
  overlap: bool = False


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
  out["train"] = med(lambda r: sum(float(r.get(k, 0.0)) for k in TRAIN_KEYS))
  out["step"] = med(lambda r: float(r["time/step"]) - sum(float(r.get(k, 0.0))
                                                          for k in NOT_STEP_KEYS))
  return out


def predict(w: Workload, acc: Accelerator, cal: Calibration, chips: int, layout: str,
            sampler: int = 0, overlap: bool = False) -> Prediction:
  if layout == "colocated":
    return colocated(w, acc, cal, chips)
  if sampler:
    return split(w, acc, cal, chips, sampler, overlap)
  p = best_split(w, acc, cal, chips, overlap)
  if p is None:
    raise ValueError(f"layout 'split' needs at least 2 chips, got {chips}")
  return p


def _uncalibrated(acc: Accelerator, w: Workload, m: Measured) -> Calibration:
  return Calibration(e_train=1.0, e_flops=1.0, e_bw=1.0, t_lat=0.0,
                     reward_per_response=m.reward / w.responses, other=m.other, source="run")


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


def transfer(cal: Calibration, run_acc: Accelerator, target: Accelerator,
             w: Workload) -> Calibration:
  """The calibration to use on `target`: the run's own when the target is the run's kind or
  the run's efficiencies are against a datasheet peak; typical defaults when the run was on
  the CPU and the target is not (a CPU's efficiencies say nothing about a GPU's). Host costs
  (reward, other) are kept as measured either way."""
  if target.name == run_acc.name or not run_acc.shared_host:
    return cal
  return dataclasses.replace(cal, e_train=DEFAULTS["e_train"], e_flops=DEFAULTS["e_flops"],
                             e_bw=DEFAULTS["e_bw"], t_lat=DEFAULTS["lat_per_layer"] * w.layers,
                             sync_scale=1.0, source="defaults")


def steps_to_target(responses_to_target: float | None, responses: int, batch: float,
                    optimizer_steps: int, bcrit: float = 0.0, smin: float = 0.0):
  """RL steps to the target at `responses` per step: S = S_min (1 + B_crit / B) in optimizer
  steps when B_crit and S_min are given (B: responses per optimizer step), else the run's
  responses to target over the new responses per step. (steps or None, how)."""
  if bcrit and smin:
    return smin * (1 + bcrit / batch) / optimizer_steps, "S = S_min (1 + B_crit / B)"
  if responses_to_target is None:
    return None, "the run did not reach its target"
  return responses_to_target / responses, "the run's responses to target, kept"


def bends(preds: list[Prediction], drop: float = 0.75) -> list[int]:
  """Indices where the log-log slope of speedup vs chips falls below `drop` after being above
  it (or at the first segment when it starts below): where the curve bends away from ideal."""
  out, prev = [], 1.0
  for i in range(1, len(preds)):
    a, b = preds[i - 1], preds[i]
    slope = math.log(a.step / b.step) / math.log(b.chips / a.chips)
    if slope < drop <= prev:
      out.append(i)
    prev = slope
  return out


@dataclasses.dataclass
class Run:
  """What the model reads from a run directory."""
  path: str
  workload: Workload
  measured: Measured
  summary: dict[str, Any]
  batch: float  # responses per optimizer step (the actor's), for S = S_min (1 + B_crit / B)


def _read(path: str, name: str):
  p = os.path.join(path, name)
  if not os.path.exists(p):
    return {} if name.endswith(".json") else []
  with open(p) as f:
    if name.endswith(".json"):
      return json.load(f)
    return [json.loads(line) for line in f if line.strip().startswith("{")]


def workload(config: dict, plan, med: dict[str, float]) -> Workload:
  """The step's sizes from the config (model shape), the batch plan and the measured tokens."""
  import ml_collections
  from rlscale import experiment
  cfg = experiment.model_config(ml_collections.ConfigDict(config))
  r = plan.responses
  rlen = med["response_tokens"] / r
  plen = (med["train_tokens"] - med["response_tokens"]) / r
  act = 2 if "16" in str(cfg.dtype) else 4
  pb = 2 if "16" in str(cfg.param_dtype) else 4
  gen = flops.rollout_flops(cfg, [plen] * r, [rlen] * r)
  gb = config.get("rollout", {}).get("generation_batch", "auto")
  models = list(plan.models.values())
  return Workload(
      responses=r, prompt_len=plen, response_len=rlen,
      decode_steps=int(config["rollout"]["max_new_tokens"]),
      matmul_params=flops.matmul_params(cfg), params=cfg.num_params(), layers=cfg.num_layers,
      param_bytes=pb, kv_bytes_per_token=2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * act,
      attn_flops_per_key=4 * cfg.num_layers * cfg.num_heads * cfg.head_dim,
      train_flops_per_response=max(med["flops/step"] - gen, 0.0) / r,
      trained_models=len(models), optimizer_steps=sum(m.optimizer_steps for m in models),
      minibatch=plan.main.minibatch, generation_batch=gb if isinstance(gb, int) else 0)


def load_run(path: str, skip: int = SKIP_STEPS) -> Run:
  """A run directory's workload and median phase times (mesh.roles and mesh.sampler_devices
  read with defaults, so runs from before the split layout read as colocated)."""
  from rlscale import batch
  config, summary = _read(path, "config.json"), _read(path, "summary.json")
  if not config:
    raise ValueError(f"{path}: no config.json")
  med = medians(_read(path, "metrics.jsonl"), skip)
  plan = batch.plan(config)
  mesh, rollout = config.get("mesh", {}), config.get("rollout", {})
  layout = mesh.get("roles", "colocated")
  m = Measured(generate=med["time/generate"], train=med["train"], reward=med["time/reward"],
               other=med["time/other"], sync=med["time/weight_sync"], step=med["step"],
               chips=int(summary.get("devices") or _devices(mesh)), layout=layout,
               sampler=int(mesh.get("sampler_devices") or 0) if layout == "split" else 0,
               overlap=bool(rollout.get("overlap", False)))
  return Run(path, workload(config, plan, med), m, summary, float(plan.batch))


def _devices(mesh: dict) -> int:
  n = math.prod(int(s) for s in mesh.get("shape", [1]))
  if n <= 0:
    raise ValueError("summary.json has no 'devices' and mesh.shape has a -1: pass the run's "
                     "devices")
  return n

"""A throughput model of one RL step against the number of chips.

Decode, per step of a call with b rows per model replica (m chips each, tensor-parallel):
    t_dec(b) = max(bytes(b) / (m·bw·e_bw), flops(b) / (m·peak·e_f)) + t_lat
    bytes(b) = weights + b·KV(context),  flops(b) = b·(2·matmul_params + attention)
so decode is bandwidth-bound at small b and compute-bound at large b; with t0 = W/(m·bw·e_bw)
+ t_lat and per-row time c = f/(m·peak·e_f) − kv/(m·bw·e_bw), the critical generation batch is
N_gen = t0 / c (t_gen ≈ t0 + N/Θmax, N_gen ≈ t0·Θmax).
Training: FLOPs / (chips·peak·e_train), plus per optimizer step a ring all-reduce of the
gradients, 2(N−1)/N · bytes / link, over inter-node links once N passes one node.
Fixed: reward scoring (per response) and host time, measured on the host and kept as measured.

The efficiencies and latencies come from a run (analysis/throughput/calibration.py). On the `cpu`
row (simulated devices of one host) the host's compute rate is calibrated and shared by all N
devices (N of them add no compute); t_lat stays as calibrated (the devices' programs run
concurrently on the host's thread pool), and collectives are host memory copies at the row's
nominal link bandwidth.
Shared host, per device: every op of a program runs once per device (launches, the collectives'
per-device copies and synchronisation), so on the `cpu` row each phase also takes a + b·N
seconds on N devices, fitted to runs at two or more device counts (zero from one run). It is
the host's, not the model's: on a GPU/TPU target each device has its own compute and it is
dropped.
"""

from __future__ import annotations

import dataclasses
import math
import random

from analysis.throughput.accelerators import Accelerator

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


PHASES = ("generate", "train", "fixed")


@dataclasses.dataclass(frozen=True)
class PerDevice:
  """A shared host's cost of running a phase on N devices, (a, b) per phase: a + b·N seconds on
  top of the rest of the model; b is the cost per device. Zero unless fitted to several runs."""
  generate: tuple[float, float] = (0.0, 0.0)
  train: tuple[float, float] = (0.0, 0.0)
  fixed: tuple[float, float] = (0.0, 0.0)

  def seconds(self, phase: str, devices: int) -> float:
    a, b = getattr(self, phase)
    return a + b * devices

  @property
  def zero(self) -> bool:
    return not any(v for p in PHASES for v in getattr(self, p))


@dataclasses.dataclass(frozen=True)
class Calibration:
  e_train: float
  e_flops: float
  e_bw: float
  t_lat: float  # seconds per decode step beyond the roofline (dispatch, launches)
  reward_per_response: float
  other: float  # host seconds per step
  source: str  # "run", "runs on N1, N2 ... devices" or "defaults"
  sync_scale: float = 1.0  # measured / modelled weight sync of a split run (1: not measured)
  gen_cv: float = 0.0  # step-to-step variation (sd / mean) of the decode time (pipelined)
  per_device: PerDevice = PerDevice()  # the shared host's a + b·N per phase (cpu only)


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase on `chips` chips: seconds, and what bounds it."""
  seconds: float
  chips: int
  rows_per_chip: float = 0.0
  critical: float = 0.0
  allreduce: float = 0.0


def host_cost(acc: Accelerator, cal: Calibration, phase: str, devices: int) -> float:
  """The shared host's per-device cost of a phase on `devices` devices; 0 where each device has
  its own compute (GPU/TPU)."""
  return cal.per_device.seconds(phase, devices) if acc.shared_host else 0.0


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
  t += host_cost(acc, cal, "generate", chips)
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
  host = host_cost(acc, cal, "train", chips)
  return Phase(w.train_flops_per_response * w.responses / rate + ar + host, chips,
               rows_per_chip=w.minibatch / chips, allreduce=ar)


def weight_sync(w: Workload, acc: Accelerator, chips: int) -> float:
  """The trainer's parameters to the sampler's chips over the link between them."""
  return w.params * w.param_bytes / acc.link_bw(chips)


def fixed(w: Workload, cal: Calibration, acc: Accelerator | None = None, chips: int = 0) -> float:
  """Reward scoring and host time, plus the shared host's per-device cost on `chips` devices."""
  host = host_cost(acc, cal, "fixed", chips) if acc is not None else 0.0
  return cal.reward_per_response * w.responses + cal.other + host


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
  g, t = generation(w, acc, cal, chips), training(w, acc, cal, chips)
  f = fixed(w, cal, acc, chips)
  p = Prediction(chips, "colocated", chips, chips, g.seconds, t.seconds, t.allreduce, 0.0, f,
                 g.seconds + t.seconds + f, g.rows_per_chip, g.critical, t.rows_per_chip)
  p.reason = reason(p, acc)
  return p


PIPELINE_STEPS, PIPELINE_WARMUP = 400, 50  # simulated steps, and the first ones left out


def pipelined(generate: float, train: float, staleness: int, cv: float = 0.0,
              steps: int = PIPELINE_STEPS, seed: int = 0) -> float:
  """Mean seconds per RL step of a sampler and a trainer on their own chips, the sampler at
  most `staleness` = k updates ahead (rollout.max_staleness): the decode of step t starts when
  the sampler has finished step t-1's and holds the weights after update t-1-k; update t starts
  when its responses and update t-1 are done and takes `train` (weight push included).
  k = 0: generate + train. k >= 1 with a constant decode time: max(generate, train). With a
  decode time that varies from step to step (lognormal, mean `generate`, coefficient of
  variation `cv`: long-tailed response lengths) a slow decode stalls the trainer unless
  responses are queued ahead of it, so the step falls toward max(generate, train) as k grows;
  simulated over `steps` steps (the first PIPELINE_WARMUP left out), the same draws at every k."""
  if staleness <= 0:
    return generate + train
  if cv <= 0 or generate <= 0:
    return max(generate, train)
  sigma = math.sqrt(math.log1p(cv * cv))
  rng = random.Random(seed)
  gens = [generate * math.exp(rng.gauss(-sigma * sigma / 2, sigma)) for _ in range(steps)]
  done = update_ends(gens, train, staleness)
  w = min(PIPELINE_WARMUP, steps // 4)
  sim = (done[-1] - done[w - 1]) / (steps - w) if w else done[-1] / steps
  return max(sim, generate, train)  # the draws' own mean can fall short of `generate`


def update_ends(gens: list[float], train: float, staleness: int) -> list[float]:
  """When each update ends, step by step (pipelined): decode t (seconds gens[t]) starts at the
  end of decode t-1 or of update t-1-k, whichever is later; update t at the end of decode t or
  of update t-1."""
  done: list[float] = []
  ready = 0.0  # the sampler's last decode end
  for t, g in enumerate(gens):
    weights = done[t - 1 - staleness] if t - 1 - staleness >= 0 else 0.0
    ready = max(ready, weights) + g
    done.append(max(ready, done[-1] if done else 0.0) + train)
  return done


def split(w, acc, cal, chips: int, sampler: int, staleness: int = 0) -> Prediction:
  """The sampler on `sampler` chips and the trainer on the rest; with rollout.max_staleness =
  k >= 1 the two work at once (pipelined, at the calibration's decode-time variation)."""
  trainer = chips - sampler
  g, t = generation(w, acc, cal, sampler), training(w, acc, cal, trainer)
  s, f = weight_sync(w, acc, chips) * cal.sync_scale, fixed(w, cal, acc, chips)
  step = pipelined(g.seconds, t.seconds + s, staleness, cal.gen_cv) + f
  p = Prediction(chips, f"split k={staleness}" if staleness else "split", sampler, trainer,
                 g.seconds, t.seconds, t.allreduce, s, f, step, g.rows_per_chip, g.critical,
                 t.rows_per_chip)
  p.reason = reason(p, acc)
  return p


def best_split(w, acc, cal, chips: int, staleness: int = 0) -> Prediction | None:
  """The sampler:trainer split with the shortest step (None below 2 chips): every split at a
  constant decode time, then the best's neighbours again at the calibrated variation."""
  flat = dataclasses.replace(cal, gen_cv=0.0)
  best = None
  for s in range(1, chips):
    p = split(w, acc, flat, chips, s, staleness)
    if best is None or p.step < best.step:
      best = p
  if best is None or not (staleness and cal.gen_cv > 0):
    return best
  near = range(max(1, best.sampler - 2), min(chips - 1, best.sampler + 2) + 1)
  return min((split(w, acc, cal, chips, s, staleness) for s in near), key=lambda p: p.step)


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


def predict(w: Workload, acc: Accelerator, cal: Calibration, chips: int, layout: str,
            sampler: int = 0, staleness: int = 0) -> Prediction:
  """One step on `chips` chips. Colocated, one set of chips decodes and trains in turn at any
  rollout.max_staleness (the model has no overlap to give it); split, the best sampler:trainer
  split unless `sampler` is given."""
  if layout == "colocated":
    return colocated(w, acc, cal, chips)
  if sampler:
    return split(w, acc, cal, chips, sampler, staleness)
  p = best_split(w, acc, cal, chips, staleness)
  if p is None:
    raise ValueError(f"layout 'split' needs at least 2 chips, got {chips}")
  return p


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

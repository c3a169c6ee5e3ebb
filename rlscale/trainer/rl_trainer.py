"""The RL trainer: prompts -> decode on the mesh -> rewards -> the algorithm's update.

Sampling and training share the mesh (mesh.roles='colocated') or have one each ('split',
rlscale/parallel/roles.py: the weights move to the sampler's mesh after each update, timed as
`time/weight_sync`). The loop (rlscale/trainer/loop.py) dispatches step N+1's decode before it
fetches step N's metrics; with rollout.max_staleness = k, the sampler runs k steps ahead: step
N+k's decode is dispatched before step N's update, with the weights after update N-1, so step
t trains on responses of the weights after update max(0, t-1-k) (`rollout/policy_lag`).
This file says what one step is, for every algorithm behind rlscale/rl/algorithm.py. Every
step records the sample axis (responses and tokens seen), rewards, what the algorithm's models
report (gradient norms, noise scale, effective hyperparameters), per-phase seconds, throughput
and MFU.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import nnx

from rlscale.config import files as config_files
from rlscale.plan import batch
from rlscale.parallel import distributed
from rlscale.resolve import resolved
from rlscale.metrics import busy
from rlscale.metrics import compiles
from rlscale.metrics import flops
from rlscale.metrics import memory_report
from rlscale.parallel import roles
from rlscale.trainer import group_filter
from rlscale.trainer import rollout
from rlscale.parallel import sharding
from rlscale.checkpoints import hf
from rlscale.trainer.evaluation import Evaluator
from rlscale.trainer.loop import Loop, NonFiniteError, Pending  # noqa: F401  (NonFiniteError: API)
from rlscale.metrics.writer import write_json
from rlscale.rl import algorithm
from rlscale.rl import optim
from rlscale.sampling import Sampler, SamplingParams, generate
from rlscale.sampling.decode import Rollout
from rlscale.metrics import summary

EVAL_KEY = 2 * 10**6  # evaluation keys are fold_in(seed key, EVAL_KEY + step)
IN_FLIGHT = "in_flight"  # a checkpoint's decodes in flight (rollout.max_staleness)


@dataclasses.dataclass
class Begun:
  """A step whose decode was dispatched."""
  step: int
  problems: list
  prompt_tokens: np.ndarray
  prompt_mask: np.ndarray
  rollout: Any  # the step's Rollout; dynamic sampling: its first round (refill.Round)
  t_dispatch: float
  version: int  # updates the sampling weights had seen
  stream_first: int = 0  # the stream index of the step's first prompt


class RLTrainer:
  sample_key = "responses_seen"

  def __init__(self, run: resolved.Resolved):
    """`run`: the resolved config, its setup (mesh, rules, task), batch plan and base policy."""
    if run.base is None:
      raise ValueError("RLTrainer needs the base policy's folder: Resolved.with_base(...) "
                       "with run/base_policy.find_or_build's")
    cfg, base = run.cfg, run.base
    self.run, self.cfg, self.workdir = run, cfg, run.workdir
    self.env = env = run.setup
    policy, self.model_cfg = hf.load_policy(base, env.mesh, env.rules, dtype=cfg.model.dtype,
                                            param_dtype=cfg.model.param_dtype)
    self.graphdef, params = nnx.split(policy)
    self.plan = run.plan
    logging.info("batch plan: %s", self.plan.summary_line())
    self.algo = algorithm.build(algorithm.Context(cfg, self.plan, env, self.graphdef, params, base))
    self.actor = self.algo.models["actor"]
    self._compile_buckets(cfg.train.compile_buckets)
    self.samples_per_step = self.plan.responses  # without dynamic sampling: every step's
    # responses_seen counts the responses generated (the sample cost), responses_trained those
    # the update trained on; they differ under dynamic sampling (rlscale/trainer/refill.py).
    self.counters = {"responses_seen": 0, "tokens_seen": 0, "responses_trained": 0}
    self.group_relative = bool(getattr(self.algo, "group_relative", False))
    ro, tok = cfg.rollout, env.task.tokenizer
    self.meshes = env.meshes
    self.staleness = int(ro.max_staleness)
    # A stale sampler keeps its own copy of the weights: the update donates the trainer's.
    self.sync = roles.WeightSync(self.meshes, env.rules, keep_copy=self.staleness > 0)
    self.sampler_params = self.sync(self.actor.params)  # the weights that sample, on its mesh
    self.ahead: dict[int, Begun] = {}  # max_staleness: later steps' decodes, dispatched
    self.busy = busy.Busy()  # the sampler's decodes and the trainer's updates in flight
    self._blank: Rollout | None = None  # an empty IN_FLIGHT slot, made once
    self.sampler = Sampler(self.graphdef, SamplingParams(
        max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_k=ro.top_k,
        top_p=ro.top_p, eos_ids=tok.eos_ids, pad_id=tok.pad_id, decode_chunk=ro.decode_chunk),
        self.meshes.sampler, env.rules)
    self.generation_fit = self._fit_generation_batch(cfg.rollout.generation_batch)
    self.evaluator = Evaluator(env.task, self.graphdef, self.meshes.sampler, env.rules,
                               max_new_tokens=ro.max_new_tokens,
                               generation_batch=cfg.eval.generation_batch,
                               decode_chunk=ro.decode_chunk, sampled=cfg.eval.sampled,
                               greedy=cfg.eval.greedy, reference=cfg.eval.reference,
                               logprob_chunk=cfg.train.logprob_chunk)
    self.prompt_level = any(m.prompt_level for m in self.algo.models.values())
    self.peak = flops.peak(cfg.train.peak_flops, jax.devices()[0].device_kind)
    self.rows = distributed.process_rows(self.plan.num_prompts)
    self.key = jax.random.key(cfg.seed)
    self.refill = None  # rollout.dynamic_sampling: the rounds of a step
    self.next_prompt: int | None = None  # the stream index of the next step's first prompt
    self.prompt_offset = 0  # a branch's stream starts after the prompts its parent drew
    if ro.dynamic_sampling:
      from rlscale.trainer.refill import Refill
      self.refill = Refill(self.sampler, env.task, self.plan.num_prompts, self.plan.group_size,
                           self.plan.generation_batch, ro, env.rules)
      self.refill.on_dispatch = lambda out: self.busy.track("sampler", out.tokens)
      logging.info("dynamic sampling: groups of equal rewards%s are dropped and refilled, "
                   "%d prompts per decode call, at most %d rounds, oversample %s",
                   f" or reward std <= {ro.filter_min_std:g}" if ro.filter_min_std else "",
                   self.refill.call_prompts, self.refill.max_rounds, ro.oversample)

  def _compile_buckets(self, choice: str) -> None:
    """Say in one line what train.compile_buckets chose for the packed updates
    (packing.compile_ahead, which algorithm.trained_model gave each update)."""
    packed = [m.update for m in self.algo.models.values() if m.update.packer is not None]
    if packed:
      logging.info("train.compile_buckets=%s: %s", choice,
                   f"every bucket's update compiled at the first update ({self.plan.num_steps} "
                   f"steps)" if packed[0].compile_ahead
                   else "each bucket's update compiled when first met")

  def _fit_generation_batch(self, value) -> dict[str, Any] | None:
    """generation_batch='auto': the largest decode call whose compiled memory fits the
    sampler's devices (rlscale/sampling/memory_fit.py), recorded in summary.json."""
    if value != batch.AUTO:
      return None
    from rlscale.sampling import memory_fit
    unit = sharding.batch_divisor(self.meshes.sampler, self.env.rules) * jax.process_count()
    candidates = None
    if self.cfg.rollout.dynamic_sampling:  # calls of whole groups per process (refill.py)
      whole = math.lcm(unit, self.plan.group_size * jax.process_count())
      candidates = [d for d in batch.divisors(self.plan.responses) if d % whole == 0]
    fit = memory_fit.fit_generation_batch(self.sampler, self.sampler_params,
                                          self.env.task.max_prompt_len, self.plan.responses,
                                          unit, self.plan.group_size, candidates=candidates)
    self.plan = dataclasses.replace(self.plan, generation_batch=fit.generation_batch)
    logging.info("generation batch: %s", fit.summary_line())
    return fit.describe()

  # --- checkpointed state ---

  def state(self):
    """Every model's state and, with rollout.max_staleness = k, the k decodes in flight after
    the step (IN_FLIGHT slots: a resume trains on the responses the run would have)."""
    out = {n: m.state for n, m in self.algo.models.items()}
    if self._slots():
      out[IN_FLIGHT] = {str(i): b.rollout for i, b in enumerate(self._in_flight())}
      blank = self._blank_rollout()
      for i in range(len(out[IN_FLIGHT]), self._slots()):
        out[IN_FLIGHT][str(i)] = blank
    return out

  def _slots(self) -> int:
    """Decodes in flight a checkpoint keeps: k, except with dynamic sampling (its first round
    is a set of calls: a resume samples it anew, with the restored weights)."""
    return self.staleness if self.refill is None else 0

  def _in_flight(self) -> list[Begun]:
    return [self.ahead[s] for s in sorted(self.ahead)]

  def _blank_rollout(self):
    """An empty slot of IN_FLIGHT (the restore's target of a slot the step did not fill)."""
    if self._blank is None:
      rows = (self.rows.stop - self.rows.start) * self.plan.group_size  # this process's
      n = self.cfg.rollout.max_new_tokens
      put = lambda x: sharding.put_batch(x, self.meshes.sampler, self.env.rules)  # noqa: E731
      self._blank = Rollout(
          put(np.zeros((rows, n), np.int32)), put(np.zeros((rows, n), np.float32)),
          put(np.zeros((rows, n), np.float32)), put(np.zeros((rows, n), bool)),
          put(np.zeros((rows,), np.int32)),
          jax.device_put(np.int32(0), sharding.replicated(self.meshes.sampler)))
    return self._blank

  def load(self, state, meta: dict[str, Any]) -> None:
    for n, m in self.algo.models.items():
      m.state = state[n]
      m.load_noise_state(meta.get("noise", {}).get(n, {}))
    self.sampler_params, self.ahead = self.sync(self.actor.params), {}
    # The decodes in flight at the save, as they were sampled (a run without them, or with
    # dynamic sampling, samples the next steps with the restored weights: lag 0 again).
    for i, (step, version) in enumerate(meta.get(IN_FLIGHT, [])):
      self.ahead[step] = self._begun(step, version, state[IN_FLIGHT][str(i)], time.time())
    self.next_prompt = meta.get("next_prompt")  # None: a run without dynamic sampling
    self.prompt_offset = meta.get("prompt_offset", 0)
    if self.refill is not None:
      self.refill.load(meta.get("refill", {}))

  def branch(self, state, meta: dict[str, Any], parent: str, step: int) -> None:
    """Start from the checkpoint of `step` of the run in `parent` (init.branch_from): its
    weights and PPO-EWMA's proximal weights; with init.branch_optimizer="parent" also its
    optimizer moments (optim.branched: the branch's own hyperparameters and schedule clock),
    with "fresh" the branch's own empty ones; the noise-scale estimates, the counters and
    the filtered fraction start afresh, and the prompt stream after the parent's (`meta`: its
    trainer meta), so that no branch trains on a prompt its parent (or its parent's parent)
    trained on."""
    fresh = self.cfg.init.branch_optimizer == "fresh"
    for n, m in self.algo.models.items():
      mine = m.state
      m.state = mine._replace(params=state[n].params, prox=state[n].prox,
                              opt_state=mine.opt_state if fresh
                              else optim.branched(mine.opt_state, state[n].opt_state))
    self.sampler_params, self.ahead = self.sync(self.actor.params), {}
    parent_p = config_files.run_config(parent)["rl"]["num_prompts"]
    self.prompt_offset = meta.get("next_prompt") or (meta.get("prompt_offset", 0)
                                                     + step * parent_p)

  def meta(self) -> dict[str, Any]:
    out = {"noise": {n: m.noise_state() for n, m in self.algo.models.items()}}
    if self._slots() and self.ahead:  # [step, the weights' version] of each IN_FLIGHT slot
      out[IN_FLIGHT] = [[b.step, b.version] for b in self._in_flight()]
    if self.prompt_offset:
      out["prompt_offset"] = self.prompt_offset
    if self.refill is not None:  # the prompt stream's position and the filtered fraction
      out.update(next_prompt=self.next_prompt, refill=self.refill.state())
    return out

  def fill_counters(self, missing: list[str]) -> None:
    """Counters a checkpoint of an older version lacks: it trained on every response."""
    if "responses_trained" in missing:
      self.counters["responses_trained"] = self.counters["responses_seen"]

  # --- one step ---

  def begin(self, step: int) -> Begun:
    """This process's prompts (problems [(step-1) P, step P) of the stream, G copies each),
    and their decode dispatched (with rollout.max_staleness, by an earlier step already)."""
    if step in self.ahead:
      return self.ahead.pop(step)
    return self._dispatch(step, step - 1)

  def _dispatch_ahead(self, step: int) -> None:
    """rollout.max_staleness = k: before step `step`'s update, the decodes of the steps up to
    step + k not yet dispatched, with the sampler's weights of now (those after update
    step - 1): a step's responses are never more than k updates older than its update."""
    for later in range(step + 1, min(step + self.staleness, self.plan.num_steps) + 1):
      if later not in self.ahead:
        self.ahead[later] = self._dispatch(later, step - 1)

  def _dispatch(self, step: int, version: int) -> Begun:
    """Step `step`'s decode with the sampler's current weights, those after step `version`'s
    update (step - 1 on-policy; earlier when an earlier step dispatched it ahead)."""
    first = self.prompt_offset + (step - 1) * self.plan.num_prompts
    if self.refill is not None:  # round 1; complete() sends the rounds after it
      first = first if self.next_prompt is None else self.next_prompt
      t = time.time()
      calls = self.refill.first_round(self.sampler_params,
                                      jax.random.fold_in(self.step_key(step), 0), first)
      return Begun(step, [], None, None, calls, t, version, first)
    begun = self._begun(step, version, None, 0.0)
    begun.t_dispatch = time.time()
    begun.rollout = generate(self.sampler, self.sampler_params, begun.prompt_tokens,
                             begun.prompt_mask, jax.random.fold_in(self.step_key(step), 0),
                             self.plan.generation_batch,
                             group_size=self.plan.group_size)  # G copies prefill once
    self.busy.track("sampler", begun.rollout.tokens)
    return begun

  def _begun(self, step: int, version: int, out, t: float) -> Begun:
    """Step `step`'s prompts (this process's) around the decode `out`."""
    first = self.prompt_offset + (step - 1) * self.plan.num_prompts
    problems = self.env.task.problems(first + self.rows.start, self.rows.stop - self.rows.start)
    ptoks, pmask = rollout.prompts(self.env.task, problems, self.plan.group_size)
    return Begun(step, problems, ptoks, pmask, out, t, version)

  def step_key(self, step: int) -> jax.Array:
    return jax.random.fold_in(self.key, step)

  def complete(self, step: int, b: Begun, t_start: float) -> Pending:
    """Score the responses, let the algorithm prepare and dispatch its update."""
    if self.refill is not None:
      return self._complete_refilled(step, b, t_start)
    toks, rmask = rollout.host_rollout(b.rollout)
    phases = {"generate": time.time() - max(b.t_dispatch, t_start)}  # stale: the wait only
    self._dispatch_ahead(step)  # the sampler's later steps, before the update
    t = time.time()
    scored = rollout.score_step(self.env.task, b.problems, self.plan.group_size, toks, rmask,
                                b.prompt_mask, self.group_relative)
    phases["reward"] = time.time() - t
    seq = rollout.sequence_batch(b.prompt_tokens, b.prompt_mask, b.rollout, self.env.mesh,
                                 self.env.rules)
    scores = sharding.put_batch(scored.rewards, self.env.mesh, self.env.rules)
    sample_logp, = roles.to_mesh([b.rollout.logprobs], self.env.mesh, self.env.rules)
    t_prep = time.time()  # the trainer's forward passes (old, reference log-probs, values)
    more_phases, host = self.algo.prepare(seq, sample_logp, scores)
    self.busy.add("trainer", t_prep, time.time())
    phases.update(more_phases)
    host.update(scored.metrics)
    lag = (step - 1) - b.version  # updates between sampling and training
    host.update({"rollout/policy_lag": lag, "rollout/policy_lag_mean": float(lag),
                 "rollout/policy_lag_max": lag})
    host.update(self._sample_axis(self.plan.responses, self.plan.responses,
                                  scored.informative * self.plan.group_size,
                                  host["response_tokens"], scored.fractions, rounds=1))
    return self._update(step, b, seq, host, phases, t_start, scored.plen, scored.rlen)

  def _sample_axis(self, generated: int, trained: int, informative: int, tokens: int,
                   fractions: dict[str, float], rounds: int) -> dict[str, Any]:
    """The step's sample-axis metrics, and the counters advanced: responses generated (what
    time to target counts), trained, and the effective batch (informative responses per
    optimizer step: a group-relative algorithm learns nothing from a group of equal
    rewards; a critic-based one learns from every response)."""
    effective = informative if self.group_relative else trained
    for m in self.algo.models.values():
      m.follow_batch(effective if m.name == "actor" else trained)
    return rollout.advance(self.counters, self.plan, generated, trained, effective, tokens,
                           fractions, rounds)

  def _complete_refilled(self, step: int, b: Begun, t_start: float) -> Pending:
    """Dynamic sampling's step: rounds until P informative groups (refill.py), then the
    update on them; the groups without signal left when the rounds ran out carry no loss."""
    t, estimate = time.time(), self.refill.estimate()  # what sized this step's round 1
    failures = rollout.failures_now(self.env.task)
    first, b.rollout = b.rollout, None  # the rounds drop each call once it is written
    f = self.refill.run(self.sampler_params, jax.random.fold_in(self.step_key(step), 0),
                        b.stream_first, first, max(b.t_dispatch, t_start))
    del first
    self.next_prompt = b.stream_first + f.calls * self.refill.call_prompts
    phases = {"generate": f.generate_s, "reward": time.time() - t - f.generate_s}
    self._dispatch_ahead(step)  # the sampler's next step (max_staleness <= 1), before the update
    g = self.plan.group_size
    ptoks, pmask = rollout.prompts(self.env.task, f.problems, g)
    seq = rollout.sequence_batch(ptoks, pmask, rollout.Responses(f.tokens, f.mask),
                                 self.env.mesh, self.env.rules)
    scores = sharding.put_batch(f.rewards, self.env.mesh, self.env.rules)
    sample_logp, = roles.to_mesh([f.logprobs], self.env.mesh, self.env.rules)
    t_prep = time.time()  # the trainer's forward passes (old, reference log-probs, values)
    more_phases, host = self.algo.prepare(seq, sample_logp, scores)
    self.busy.add("trainer", t_prep, time.time())
    phases.update(more_phases)
    gr = f.groups
    host.update(rollout.group_metrics(gr.cat("rewards"), gr.cat("correct"), gr.cat("finished"),
                                      gr.cat("lengths")))
    host.update(rollout.failure_metrics(self.env.task, failures))
    rmask = distributed.host_local(f.mask)
    plen, rlen = pmask.sum(axis=1), rmask.sum(axis=1)
    trained_rows = np.repeat(f.trained[self.rows], g)
    host["train_tokens"] = int(distributed.global_sum((rlen + plen)[trained_rows].sum()))
    # Round 1's calls sent ahead sampled with the weights of b.version; the calls sent in
    # this step's rounds with those of now (lag 0): the trained responses' lags.
    lag, ahead = (step - 1) - b.version, f.ahead
    host.update({"rollout/policy_lag": lag,
                 "rollout/policy_lag_mean": lag * ahead / max(int(f.trained.sum()), 1),
                 "rollout/policy_lag_max": lag if ahead else 0})
    codes = gr.cat("codes")
    trained = int(f.trained.sum()) * g
    host.update(self._sample_axis(len(codes) * g, trained, trained, host["response_tokens"],
                                  group_filter.reason_fractions(codes), f.rounds))
    host.update({"rollout/decode_calls": f.calls, "rollout/capped": int(trained < self.plan.responses),
                 "rollout/dropped_informative": f.dropped_informative,
                 "rollout/filtered_estimate": estimate,
                 "throughput/decode_responses_per_s": len(codes) * g / max(f.generate_s, 1e-9)})
    if trained < self.plan.responses:
      logging.warning("step %d: %d of %d groups carry signal after %d rounds "
                      "(rollout.max_rounds): it trains on those", step, trained // g,
                      self.plan.num_prompts, f.rounds)
    generated = flops.rollout_flops(self.model_cfg, gr.cat("prompt_lengths").reshape(-1),
                                    gr.cat("lengths").reshape(-1))  # every process holds all
    return self._update(step, b, seq, host, phases, t_start, plen[trained_rows],
                        rlen[trained_rows], generated)

  def _update(self, step, b: Begun, seq, host, phases, t_start, plen, rlen,
              generate_flops: float | None = None) -> Pending:
    """Dispatch the algorithm's update of a scored step."""
    by_group = self.prompt_level and step % 2 == 0
    t_update = time.time()
    update_phases, metrics = self.algo.update(seq, jax.random.fold_in(self.step_key(step), 1),
                                              step, by_group)
    self.busy.track("trainer", metrics, start=t_update)  # PPO's critic blocked within
    self.sampler_params = self.sync(self.actor.params)
    if self.meshes.split:
      update_phases["weight_sync"] = self.sync.seconds
    return Pending(step, metrics, host, phases, t_start, t_update, "actor_update",
                   update_phases, info=(by_group, self.step_flops(plen, rlen, generate_flops)))

  def step_flops(self, plen, rlen, generate: float | None = None) -> dict[str, float]:
    """Model FLOPs of the step's phases over this process's trained rows (plen, rlen); the
    generation's are of those rows too unless given (dynamic sampling generates more). Model
    FLOPs of the rows as data, whatever the layout: shared-prompt training computes fewer
    (flops.shared_prompt_train_flops), and a sweep whose points differ in layout keeps one
    compute axis."""
    fwd = flops.train_flops(self.model_cfg, plen + rlen) / 3  # one forward over the batch
    epochs = sum(m.batch.num_epochs for m in self.algo.models.values())
    if generate is None:
      generate = distributed.global_sum(flops.rollout_flops(self.model_cfg, plen, rlen))
    return {"generate": generate,
            "update": distributed.global_sum(3 * fwd * epochs),
            "logprobs": distributed.global_sum(fwd * self.algo.extra_forwards())}

  # --- a finished step's host metrics ---

  def metrics(self, p: Pending, fetched: dict[str, Any]) -> dict[str, Any]:
    by_group, _ = p.info
    out = {}
    for n, m in fetched.items():
      out.update(self.algo.models[n].read(m, by_group))
    out.update(jax.device_get(p.host))  # an algorithm's own metrics may still be on the device
    masked = out.pop("off_policy/masked_effective", None)
    if masked is not None:  # the effective batch net of the responses a correction masked
      n = out["rollout/effective_responses"]
      out["rollout/effective_batch_kept"] = (out["rollout/effective_batch"] * (n - int(masked))
                                             / max(n, 1))
      out["off_policy/masked_effective"] = int(masked)
    return out

  def rates(self, p: Pending, wall: float) -> dict[str, float]:
    _, step_flops = p.info
    update_s = p.phases["actor_update"] + sum(  # every model's
        v for k, v in p.update_phases.items() if k != "weight_sync")
    out = {"throughput/train_tokens_per_s":
               p.host["train_tokens"] * self.plan.main.num_epochs / update_s,
           "throughput/responses_per_s": p.host["rollout/responses_generated"] / wall,
           "flops/step": sum(step_flops.values()),  # model FLOPs: a report's compute axis
           **memory_report.peaks()}  # the run's memory so far (benchmarks give it per phase)
    for role in busy.ROLES:  # the step's wall time with none of the role's work in flight
      out[f"throughput/{role}_idle"] = self.busy.idle(role, p.t_start, p.t_start + wall)
    # A stale step's generate phase is only the wait it caused; so is a refilled step's (its
    # calls decode while the host scores the one before).
    waits = self.staleness > 0 or self.refill is not None
    if not waits:
      out["throughput/gen_tokens_per_s"] = p.host["response_tokens"] / p.phases["generate"]
    if self.peak:
      sampler, trainer = (self.peak * m.size for m in (self.meshes.sampler, self.meshes.trainer))
      if not waits:
        out["mfu/generate"] = step_flops["generate"] / p.phases["generate"] / sampler
      out["mfu/update"] = step_flops["update"] / update_s / trainer
      out["mfu/step"] = sum(step_flops.values()) / wall / (self.peak * jax.device_count())
    return out

  def evaluate(self, step: int, stop=None) -> dict[str, float]:
    t = time.time()
    out = self.evaluator(self.sampler_params, jax.random.fold_in(self.key, EVAL_KEY + step),
                         stop)
    self.busy.add("sampler", t, time.time())  # the sampler's devices evaluate
    return out

  def progress(self, row: dict[str, Any], last_eval: dict[str, float]) -> dict[str, Any]:
    return {"responses": self.counters["responses_seen"], "reward": float(row["reward/mean"]),
            "eval acc": last_eval.get("eval/accuracy_greedy",
                                      last_eval.get("eval/accuracy_sampled"))}

  def finish(self, counters: dict[str, Any], last_eval: dict[str, float]) -> dict[str, Any]:
    """Export the policy and write summary.json."""
    tok = self.env.task.tokenizer  # ids the base checkpoint lacks; its own ones win
    folder = os.path.join(self.workdir, "policy")
    hf.save_policy(nnx.merge(self.graphdef, self.actor.params), folder,
                   bos_id=getattr(tok, "bos_id", None), eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    if self.cfg.model.hf_checkpoint:  # the export chats as its source: its tokenizer beside it
      hf.copy_tokenizer(self.cfg.model.hf_checkpoint, folder)
    out = summary.summarize(self.cfg, self.workdir, counters, last_eval, self.plan)
    if self.generation_fit:
      out["generation_batch_fit"] = self.generation_fit
    if getattr(self.env.task, "data_report", None):  # prompt files: rows read, skipped, used
      out["data"] = self.env.task.data_report
    out["compile"] = compiles.stats()  # this process's: programs, seconds, cache hits
    out["compilations"] = summary.compilations(self.workdir, {
        **{n: m.update.traces for n, m in self.algo.models.items()},
        "sampler": self.sampler.traces,
        **({"refill": self.refill.traces} if self.refill is not None else {})})
    write_json(os.path.join(self.workdir, "summary.json"), out)
    logging.info("done: %s", {k: (round(v, 4) if isinstance(v, float) else v)
                              for k, v in out.items() if not isinstance(v, dict)})
    return out


def run(run: resolved.Resolved) -> dict:
  """Train from `run.base` (found or built before: rlscale/run/base_policy.py)."""
  trainer = RLTrainer(run)
  loop = Loop(trainer, run.cfg, run.workdir, trainer.plan.num_steps, eval_at_start=True,
              written=run.raw)
  return trainer.finish(*loop.run())

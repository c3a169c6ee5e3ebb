"""The RL loop: prompts -> decode on the mesh -> rewards -> advantages -> jitted update.

Sampling and training use the same parameters on the same mesh. Step N's update is dispatched,
then step N+1's prompts are prepared and its decode dispatched before step N's metrics are
fetched, checked for NaN/Inf and written; a step is checkpointed only once its metrics are
known to be finite.

Every step records the sample axis (responses and tokens seen), rewards, gradient norms, the
gradient noise scale, the optimizer's effective hyperparameters, per-phase seconds, throughput
and MFU; evaluation can run at fixed responses_seen marks so that runs with different batch
sizes have points at the same x; the first point where `target.metric` reaches `target.value`
gives responses_to_target and time_to_target.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from rlscale import base_policy, distributed, experiment, flops, rollout
from rlscale.checkpointing import Checkpointer
from rlscale.checkpoints import hf
from rlscale.evaluation import Evaluator
from rlscale.metrics_writer import MetricsWriter, Progress, write_json
from rlscale.sampling import Sampler, SamplingParams, generate


class NonFiniteError(FloatingPointError):
  pass


def num_steps(cfg: ml_collections.ConfigDict) -> int:
  """RL steps of the run: train.total_responses / (P*G) when given, else train.num_steps."""
  per_step = cfg.rl.num_prompts * cfg.rl.group_size
  return cfg.train.total_responses // per_step if cfg.train.total_responses else cfg.train.num_steps


# --- one step's bookkeeping ---

@dataclasses.dataclass
class Pending:
  """A dispatched update whose metrics are not yet on the host.

  Step N lasts from the end of step N-1's bookkeeping to the end of its own; its phases
  (generate, reward, logprobs, critic_update, actor_update, eval, checkpoint) lie inside that
  span and `other` is the remainder.
  """
  step: int
  metrics: dict[str, dict[str, jax.Array]]  # per trained model
  host: dict[str, Any]  # metrics known on the host already
  flops: dict[str, float]  # model FLOPs of the step's phases
  by_group: bool  # the updates shuffled by whole groups (prompt-level noise scale)
  t_start: float
  t_update: float  # when the updates were dispatched
  phases: dict[str, float]


def make_algorithm(cfg, env, graphdef, params, total_responses: int, base: str):
  if cfg.kind == "grpo":
    from rlscale.rl.grpo import GRPO
    return GRPO(cfg, env, graphdef, params, total_responses)
  from rlscale import models
  from rlscale.rl.ppo import PPO
  critic, _ = hf.load_model(cfg.critic.hf_checkpoint or base, models.ValueModel, env.mesh,
                            env.rules, key=jax.random.key(cfg.seed + 1), dtype=cfg.model.dtype,
                            param_dtype=cfg.model.param_dtype)
  return PPO(cfg, env, graphdef, params, total_responses, critic)


def run(cfg: ml_collections.ConfigDict, workdir: str, config_file: str | None = None) -> dict:
  env = experiment.setup(cfg)
  mesh, rules, task = env.mesh, env.rules, env.task
  r, ro = cfg.rl, cfg.rollout
  base = base_policy.resolve(cfg, config_file)
  experiment.prepare_workdir(workdir, cfg)
  policy, model_cfg = hf.load_policy(base, mesh, rules, dtype=cfg.model.dtype,
                                     param_dtype=cfg.model.param_dtype)
  graphdef, params = nnx.split(policy)
  steps = num_steps(cfg)
  B = r.num_prompts * r.group_size  # responses per RL step
  algo = make_algorithm(cfg, env, graphdef, params, steps * B, base)
  actor = algo.models["actor"]

  tok = task.tokenizer
  sampler = Sampler(graphdef, SamplingParams(
      max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_k=ro.top_k,
      top_p=ro.top_p, eos_ids=tok.eos_ids, pad_id=tok.pad_id, decode_chunk=ro.decode_chunk),
      mesh, rules)
  evaluator = Evaluator(task, graphdef, mesh, rules, max_new_tokens=ro.max_new_tokens,
                        generation_batch=cfg.eval.generation_batch, decode_chunk=ro.decode_chunk,
                        sampled=cfg.eval.sampled)
  prompt_level = any(m.prompt_level for m in algo.models.values())
  peak = flops.peak(cfg.train.peak_flops, jax.devices()[0].device_kind)

  key = jax.random.key(cfg.seed)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), cfg.train.keep_checkpoints,
                      cfg.train.async_checkpoint)
  counters: dict[str, Any] = {"step": 0, "responses_seen": 0, "tokens_seen": 0,
                              "data_position": 0, "wall_time": 0.0, "seed": cfg.seed}
  start = ckpt.latest_step() or 0
  if start:
    states, counters = ckpt.restore(start, {n: m.state for n, m in algo.models.items()})
    for n, m in algo.models.items():
      m.state = states[n]
      m.load_noise_state(counters.get("noise", {}).get(n, {}))
    algo.steps_done = start
    logging.info("resumed from the checkpoint of step %d in %s", start, workdir)
  writer = MetricsWriter(workdir, resume_step=start, tensorboard=cfg.train.tensorboard)
  progress = Progress(steps, cfg.train.log_every, start)
  rows = distributed.process_rows(r.num_prompts)
  last_eval: dict[str, float] = {}
  t_run = time.time() - counters["wall_time"]
  tgt = cfg.target

  def due(every: int, step: int) -> bool:
    return step == steps or bool(every and step % every == 0)

  def eval_due(step: int) -> bool:
    if cfg.train.eval_every_responses:  # at fixed sample marks, the x every batch size shares
      e = cfg.train.eval_every_responses
      return step == steps or (step - 1) * B // e < step * B // e
    return due(cfg.train.eval_every, step)

  def check_target(metrics: dict[str, Any]) -> None:
    if tgt.metric in metrics and "responses_to_target" not in counters:
      if float(metrics[tgt.metric]) >= tgt.value:
        counters.update(responses_to_target=counters["responses_seen"],
                        time_to_target=counters["wall_time"], step_to_target=counters["step"])
        logging.info("target %s >= %s reached at %d responses, %.1f s", tgt.metric, tgt.value,
                     counters["responses_seen"], counters["wall_time"])

  def stop_now() -> bool:
    return bool(tgt.stop and "responses_to_target" in counters)

  def finalize(p: Pending) -> None:
    nonlocal last_eval, t_prev_end
    metrics = jax.device_get(p.metrics)
    now = time.time()
    p.phases["actor_update"] = now - p.t_update - p.phases.get("critic_update", 0.0)
    bad = [f"{n}/{k}={v}" for n, m in metrics.items() for k, v in m.items() if not np.isfinite(v)]
    if bad:
      raise NonFiniteError(
          f"step {p.step}: non-finite {', '.join(bad)}; stopping. "
          f"The last checkpoint (step {ckpt.latest_step()}) in {workdir} is intact.")
    counters.update(step=p.step, wall_time=now - t_run)
    out = {}
    for n, m in metrics.items():
      out.update(algo.models[n].read(m, p.by_group))
    counters["noise"] = {n: m.noise_state() for n, m in algo.models.items()}
    out.update(jax.device_get(p.host))  # an algorithm's own metrics may still be on the device
    if eval_due(p.step):
      t = time.time()
      last_eval = evaluator(actor.params, jax.random.fold_in(key, 2 * 10**6 + p.step))
      p.phases["eval"] = time.time() - t
      out.update(last_eval)
      counters["wall_time"] = time.time() - t_run
      check_target(last_eval)
    if due(cfg.train.checkpoint_every, p.step) or stop_now():
      t = time.time()
      ckpt.save(p.step, {n: m.state for n, m in algo.models.items()}, dict(counters))
      p.phases["checkpoint"] = time.time() - t
    t_prev_end = time.time()
    counters["wall_time"] = t_prev_end - t_run
    wall = t_prev_end - p.t_start
    out.update({f"time/{k}": v for k, v in p.phases.items()})
    out["time/other"] = wall - sum(p.phases.values())
    out["time/step"] = wall
    out["throughput/gen_tokens_per_s"] = p.host["response_tokens"] / p.phases["generate"]
    update_s = p.phases["actor_update"] + p.phases.get("critic_update", 0.0)
    out["throughput/train_tokens_per_s"] = p.host["train_tokens"] * r.num_epochs / update_s
    out["throughput/responses_per_s"] = B / wall
    if peak:
      devices = peak * jax.device_count()
      out["mfu/generate"] = p.flops["generate"] / p.phases["generate"] / devices
      out["mfu/update"] = p.flops["update"] / update_s / devices
      out["mfu/step"] = sum(p.flops.values()) / wall / devices
    out.update(responses_seen=counters["responses_seen"], tokens_seen=counters["tokens_seen"],
               wall_time=counters["wall_time"])
    writer.write(p.step, out)
    progress.update(p.step, {"responses": counters["responses_seen"],
                             "reward": float(p.host["reward/mean"]),
                             "eval acc": last_eval.get("eval/accuracy_greedy")})

  if start == 0:  # the base policy's held-out accuracy: the point every curve starts from
    t = time.time()
    last_eval = evaluator(actor.params, jax.random.fold_in(key, 2 * 10**6))
    writer.write(0, {**last_eval, "responses_seen": 0, "tokens_seen": 0, "wall_time": 0.0,
                     "time/eval": time.time() - t})
    logging.info("base policy: %s", {k: round(float(v), 4) for k, v in last_eval.items()})
    t_run = time.time()
  try:
    pending: Pending | None = None
    t_prev_end = time.time()
    for step in range(start + 1, steps + 1):
      if stop_now():
        break
      phases: dict[str, float] = {}
      # This process's prompts: problems [pos + rows.start, pos + rows.stop), G copies each.
      pos = counters["data_position"]
      problems = task.problems(pos + rows.start, rows.stop - rows.start)
      ptoks, pmask = rollout.prompts(task, problems, r.group_size)
      step_key = jax.random.fold_in(key, step)
      t_dispatch = time.time()
      out = generate(sampler, actor.params, ptoks, pmask, jax.random.fold_in(step_key, 0),
                     ro.generation_batch)
      if pending is not None:  # step N's metrics, fetched while step N+1 decodes
        finalize(pending)
        pending = None
      t_start = t_prev_end
      toks, rmask = rollout.host_rollout(out)
      phases["generate"] = time.time() - max(t_dispatch, t_start)
      t = time.time()
      repeated = [p for p in problems for _ in range(r.group_size)]
      rewards, correct, finished = rollout.score(task, repeated, toks, rmask, tok.eos_ids)
      phases["reward"] = time.time() - t
      batch = rollout.sequence_batch(ptoks, pmask, out, mesh, rules)
      more_phases, host = algo.prepare(batch, out, rewards)
      phases.update(more_phases)
      plen, rlen = pmask.sum(axis=1), rmask.sum(axis=1)
      fwd = flops.train_flops(model_cfg, plen + rlen) / 3  # one forward over the batch
      step_flops = {"generate": _global_sum(flops.rollout_flops(model_cfg, plen, rlen)),
                    "update": _global_sum(3 * fwd * sum(m.num_epochs
                                                        for m in algo.models.values())),
                    "logprobs": _global_sum(fwd * algo.recomputed_forwards())}
      counters["responses_seen"] += B
      counters["tokens_seen"] += int(_global_sum(rlen.sum()))
      counters["data_position"] = pos + r.num_prompts
      group_rewards = rewards.reshape(-1, r.group_size)
      host.update({
          "reward/mean": _global_mean(rewards), "reward/std": float(np.std(rewards)),
          "reward/accuracy": _global_mean(correct), "reward/finished": _global_mean(finished),
          "reward/solved_groups": _global_mean(group_rewards.min(axis=1) > 0),
          "reward/unsolved_groups": _global_mean(group_rewards.max(axis=1) == 0),
          "response/length_mean": _global_mean(rlen), "response/length_max": int(rlen.max()),
          "response_tokens": int(_global_sum(rlen.sum())),
          "train_tokens": int(_global_sum(rlen.sum() + plen.sum())),
      })
      by_group = prompt_level and step % 2 == 0
      t_update = time.time()
      update_phases, metrics = algo.update(batch, jax.random.fold_in(step_key, 1), by_group)
      phases.update(update_phases)
      pending = Pending(step, metrics, host, step_flops, by_group, t_start, t_update, phases)
      if eval_due(step) or due(cfg.train.checkpoint_every, step):
        finalize(pending)  # evaluation and checkpoints need this step's parameters now
        pending = None
    if pending is not None:
      finalize(pending)
  finally:
    # An interrupted run (an exception, Ctrl-C, SIGTERM) still completes the saves it began.
    ckpt.close()
    writer.close()
  hf.save_policy(nnx.merge(graphdef, actor.params), os.path.join(workdir, "policy"))
  summary = summarize(cfg, workdir, counters, last_eval, B)
  summary["compilations"] = {**{n: m.update.traces for n, m in algo.models.items()},
                             "sampler": sampler.traces}
  write_json(os.path.join(workdir, "summary.json"), summary)
  logging.info("done: %s", {k: (round(v, 4) if isinstance(v, float) else v)
                            for k, v in summary.items() if k != "noise"})
  return summary


def summarize(cfg, workdir: str, counters: dict, last_eval: dict, per_step: int) -> dict:
  """summary.json: counters, target, final evaluation, mean throughputs and phase times."""
  import json
  rows = []
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f]
  steps = [row for row in rows if row.get("step", 0) > 0]
  def mean(k):
    values = [row[k] for row in steps if isinstance(row.get(k), (int, float))]
    return float(np.mean(values)) if values else None
  out = {"kind": cfg.kind, "num_prompts": cfg.rl.num_prompts, "group_size": cfg.rl.group_size,
         "responses_per_step": per_step, **{k: v for k, v in counters.items() if k != "noise"},
         "target": {"metric": cfg.target.metric, "value": cfg.target.value},
         "responses_to_target": counters.get("responses_to_target"),
         "time_to_target": counters.get("time_to_target"), **last_eval}
  if counters.get("wall_time"):
    out["responses_per_s"] = counters["responses_seen"] / counters["wall_time"]
  for k in ("throughput/gen_tokens_per_s", "throughput/train_tokens_per_s",
            "throughput/responses_per_s", "mfu/step", "time/step", "time/generate",
            "time/reward", "time/logprobs", "time/critic_update", "time/actor_update",
            "time/eval", "time/other", "critic/explained_variance"):
    v = mean(k)
    if v is not None and np.isfinite(v):
      out[f"mean/{k}"] = v
  for k in ("actor/noise_responses/b_simple", "actor/noise_prompts/b_simple",
            "critic/noise_responses/b_simple", "critic/noise_prompts/b_simple",
            "critic/explained_variance"):
    last = [row[k] for row in steps if k in row]
    if last:
      out[f"final/{k}"] = last[-1]
  return out


def _global_sum(x) -> float:
  x = float(np.sum(x))
  if jax.process_count() == 1:
    return x
  from jax.experimental import multihost_utils
  return float(np.sum(multihost_utils.process_allgather(np.array([x]))))


def _global_mean(x) -> float:
  x = np.asarray(x, np.float64)
  return _global_sum(x) / (x.size * jax.process_count())

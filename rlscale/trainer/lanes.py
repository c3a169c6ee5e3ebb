"""Runs side by side: S RL runs of one shape trained in one process (`--seeds`, a sweep's
`--vectorize=seed`), each in its own run directory with the metrics and checkpoints it would
write alone.

The runs may differ in their seed and in the numbers the compiled programs take as arguments
(LANE_FIELDS); everything else, the shapes above all, is one. Their arrays are stacked on a
lane axis (rlscale/parallel/lanes.py) and every step is one decode, one update and one
evaluation of all of them, each lane computing what its run alone would. What is a run's own
stays on the host per lane: its rewards, counters, noise-scale averages, run directory,
metrics and checkpoints. Each lane has a `Loop` (rlscale/trainer/loop.py) as a run alone, and
the loops go step by step together: the first lane to reach a step's decode, update or
evaluation does it for all, the others read theirs.

A lane's checkpoint holds its run's arrays as that run alone saves them: a run of the group
resumes alone, and a run alone resumes in a group. A group resumes from the newest step every
lane has intact.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from rlscale.checkpoints import hf
from rlscale.config.errors import ConfigError
from rlscale.metrics import compiles, flops, memory_report, summary
from rlscale.metrics.writer import write_json
from rlscale.parallel.lanes import Lanes
from rlscale.plan import batch
from rlscale.resolve import resolved
from rlscale.rl import algorithm
from rlscale.sampling import Sampler, SamplingParams, generate
from rlscale.trainer import preemption, rollout
from rlscale.trainer.evaluation import Evaluator
from rlscale.trainer.loop import Loop, Pending
from rlscale.trainer.rl_trainer import EVAL_KEY
from rlscale.rl.update import SequenceBatch

# The fields runs side by side may differ in: the seed, and numbers the compiled programs take
# as arguments. Those in ON_OFF must agree on being 0 (0 removes a term: another program).
LANE_FIELDS = ("seed", "optim.lr", "optim.grad_clip", "rl.clip_eps_low", "rl.clip_eps_high",
               "rl.kl_coef", "rl.entropy_coef", "critic.optim.lr", "critic.optim.grad_clip",
               "critic.value_clip")
ON_OFF = ("optim.grad_clip", "rl.kl_coef", "rl.entropy_coef", "critic.optim.grad_clip",
          "critic.value_clip")


def _get(cfg, path: str):
  node = cfg
  for name in path.split("."):
    if name not in node:
      return None
    node = node[name]
  return node


def errors(cfgs: list, workdirs: list[str]) -> list[str]:
  """Why these configs cannot run side by side ([] when they can), each naming its field."""
  out = []
  first = cfgs[0]
  if len(cfgs) < 1:
    return ["runs side by side need at least one config"]
  if len(set(os.path.abspath(w) for w in workdirs)) != len(workdirs):
    out.append("runs side by side need a run directory each; two share one")
  if first.kind == "sft":
    out.append("kind='sft': runs side by side are RL runs")
  if jax.process_count() > 1:
    out.append(f"runs side by side run in one process ({jax.process_count()} here): on several "
               "hosts run the seeds as separate points")
  checks = [
      ("mesh.roles", lambda v: v == "colocated", "'colocated' (split roles are not stacked)"),
      ("rollout.max_staleness", lambda v: v == 0, "0 (each lane samples and trains in step)"),
      ("rollout.dynamic_sampling", lambda v: v is False, "False"),
      ("rl.off_policy_correction", lambda v: v == "none", "'none'"),
      ("rl.ptx_coef", lambda v: not v, "0 (PPO-ptx's rows are not stacked)"),
      ("init.branch_from", lambda v: not v, "'' (branches are probed one by one)"),
      ("optim.lr_batch", lambda v: v == "nominal", "'nominal'"),
      ("eval.reference", lambda v: not v, "False")]
  for field, ok, allowed in checks:
    value = _get(first, field)
    if value is not None and not ok(value):
      out.append(f"{field}={value!r}: runs side by side need {allowed}")
  base = _without_lane_fields(first)
  for cfg, wd in zip(cfgs[1:], workdirs[1:]):
    mine = _without_lane_fields(cfg)
    differ = sorted(k for k in set(base) | set(mine) if base.get(k) != mine.get(k))
    if differ:
      out.append(f"{wd}: its config differs from {workdirs[0]}'s in {', '.join(differ)}; runs "
                 f"side by side may differ only in {', '.join(LANE_FIELDS)}")
    for field in ON_OFF:
      a, b = _get(first, field), _get(cfg, field)
      if a is not None and bool(a) != bool(b):
        out.append(f"{field}: {a!r} in {workdirs[0]}, {b!r} in {wd}: one is 0, which removes a "
                   f"term (another program); run them in separate groups")
  return out


def _without_lane_fields(cfg) -> dict:
  from rlscale.config import migrate
  flat = migrate.flat(cfg.to_dict())
  return {k: v for k, v in flat.items() if k not in LANE_FIELDS}


@dataclasses.dataclass
class _Step:
  """One step of every lane: what its first lane to arrive computed."""
  step: int
  begun: Any = None
  pendings: list | None = None
  advances: list | None = None  # each lane's counters after the step
  fetched: list | None = None  # each lane's device metrics, on the host
  evaluation: list | None = None


class LaneRuns:
  """The shared work of S runs side by side; `view(k)` is lane k's Trainer for its Loop."""

  sample_key = "responses_seen"

  def __init__(self, runs: list[resolved.Resolved]):
    first = runs[0]
    if first.base is None:
      raise ValueError("LaneRuns needs the base policy's folder (Resolved.with_base)")
    self.runs, self.cfg = runs, first.cfg
    self.lanes = lanes = Lanes(len(runs))
    env = self.env = first.setup
    logging.info("runs side by side: %s (%s)", lanes.describe(),
                 ", ".join(os.path.basename(r.workdir) for r in runs))
    cfg = self.cfg
    policy, self.model_cfg = hf.load_policy(first.base, env.mesh, env.rules,
                                            dtype=cfg.model.dtype,
                                            param_dtype=cfg.model.param_dtype)
    self.graphdef, params = nnx.split(policy)
    self.plan = first.plan
    self.generation_fit = self._fit_generation_batch(params)
    logging.info("batch plan: %s", self.plan.summary_line())
    ctx = algorithm.Context(cfg, self.plan, env, self.graphdef, lanes.broadcast(params),
                            first.base, lanes=lanes, lane_cfgs=tuple(r.cfg for r in runs))
    self.algo = algorithm.build(ctx)
    self.actor = self.algo.models["actor"]
    self.group_relative = bool(getattr(self.algo, "group_relative", False))
    self.prompt_level = any(m.prompt_level for m in self.algo.models.values())
    ro, tok = cfg.rollout, env.task.tokenizer
    self.sampler = Sampler(self.graphdef, SamplingParams(
        max_new_tokens=ro.max_new_tokens, temperature=ro.temperature, top_k=ro.top_k,
        top_p=ro.top_p, eos_ids=tok.eos_ids, pad_id=tok.pad_id, decode_chunk=ro.decode_chunk),
        env.mesh, env.rules, lanes)
    self.evaluator = Evaluator(env.task, self.graphdef, env.mesh, env.rules,
                               max_new_tokens=ro.max_new_tokens,
                               generation_batch=cfg.eval.generation_batch,
                               decode_chunk=ro.decode_chunk, sampled=cfg.eval.sampled,
                               greedy=cfg.eval.greedy, logprob_chunk=cfg.train.logprob_chunk,
                               lanes=lanes)
    self.peak = flops.peak(cfg.train.peak_flops, jax.devices()[0].device_kind)
    self.keys = lanes.stack([jax.random.key_data(jax.random.key(r.cfg.seed)) for r in runs])
    self._fold = lanes.map(lambda k, a, b: jax.random.fold_in(
        jax.random.fold_in(jax.random.wrap_key_data(k), a), b), (True, False, False),
        name="keys")
    self._sequences = lanes.map(_sequence_batch, (False, False, True, True), name="sequences")
    self.counters = [{"responses_seen": 0, "tokens_seen": 0, "responses_trained": 0}
                     for _ in runs]
    self.views = [LaneView(self, k) for k in range(len(runs))]
    self._loaded: dict[int, Any] = {}
    self._steps: dict[int, _Step] = {}  # the steps a lane's loop still reads (two at most)
    self.loops: list = []  # the lanes' loops (_build): their targets decide their evaluations

  def _fit_generation_batch(self, params) -> dict[str, Any] | None:
    """generation_batch='auto': the largest decode call that fits a device's memory shared
    by the lanes on it (rlscale/sampling/memory_fit.py)."""
    if self.plan.generation_batch != batch.AUTO:
      return None
    from rlscale.sampling import memory_fit
    ro = self.cfg.rollout
    solo = Sampler(self.graphdef, SamplingParams(max_new_tokens=ro.max_new_tokens,
                                                 decode_chunk=ro.decode_chunk,
                                                 eos_ids=self.env.task.tokenizer.eos_ids),
                   self.env.mesh, self.env.rules)
    budget, source = memory_fit.device_budget(params)
    fit = memory_fit.fit_generation_batch(solo, params, self.env.task.max_prompt_len,
                                          self.plan.responses, 1, self.plan.group_size,
                                          budget_bytes=budget // self.lanes.per_device)
    self.plan = dataclasses.replace(self.plan, generation_batch=fit.generation_batch)
    logging.info("generation batch: %s (a device's memory over its %d lanes)",
                 fit.summary_line(), self.lanes.per_device)
    return fit.describe()

  def view(self, k: int) -> "LaneView":
    return self.views[k]

  # --- state ---

  def state(self):
    return {n: m.state for n, m in self.algo.models.items()}

  def load_all(self, fresh: set[int] = frozenset()) -> None:
    """Put the lanes' restored states (LaneView.load) into the stacked state; the lanes in
    `fresh` start anew and keep the state they were built with."""
    if not self._loaded:
      return
    if len(self._loaded) + len(fresh - set(self._loaded)) != len(self.lanes):
      raise RuntimeError(f"runs side by side restored {len(self._loaded)} of "
                         f"{len(self.lanes)} lanes")
    current = self.state()
    stacked = self.lanes.stack([self._loaded[k] if k in self._loaded
                                else self.lanes.take(current, k)
                                for k in range(len(self.lanes))])
    for n, m in self.algo.models.items():
      m.state = stacked[n]
    self._loaded.clear()

  # --- one step of every lane ---

  def _at(self, step: int) -> _Step:
    """Step `step`'s shared work; a loop finishes step N while step N + 1 runs, so the
    step before stays too."""
    if step not in self._steps:
      self._steps = {n: s for n, s in self._steps.items() if n >= step - 1}
      self._steps[step] = _Step(step)
    return self._steps[step]

  def keys_for(self, a: int, b: int):
    return self._fold(self.keys, np.uint32(a), np.uint32(b))

  def begin(self, step: int):
    s = self._at(step)
    if s.begun is None:
      first = (step - 1) * self.plan.num_prompts
      problems = self.env.task.problems(first, self.plan.num_prompts)
      ptoks, pmask = rollout.prompts(self.env.task, problems, self.plan.group_size)
      t = time.time()
      out = generate(self.sampler, self.actor.params, ptoks, pmask, self.keys_for(step, 0),
                     self.plan.generation_batch, group_size=self.plan.group_size)
      s.begun = (problems, ptoks, pmask, out, t)
    return s.begun

  def complete(self, step: int, begun, t_start: float) -> None:
    s = self._at(step)
    if s.pendings is not None:
      return
    problems, ptoks, pmask, out, t_dispatch = begun
    toks, rmask = np.asarray(out.tokens), np.asarray(out.mask)  # [lanes, B, N]
    phases = {"generate": time.time() - max(t_dispatch, t_start)}
    t = time.time()
    g = self.plan.group_size
    scored = [rollout.score_step(self.env.task, problems, g, toks[k], rmask[k], pmask,
                                 self.group_relative) for k in range(len(self.lanes))]
    phases["reward"] = time.time() - t
    seq = self._sequences(ptoks, pmask, out.tokens, out.mask)
    scores = self.lanes.stack([sc.rewards for sc in scored])
    more_phases, shared_host = self.algo.prepare(seq, out.logprobs, scores)
    phases.update(more_phases)
    by_group = self.prompt_level and step % 2 == 0
    t_update = time.time()
    update_phases, metrics = self.algo.update(seq, self.keys_for(step, 1), step, by_group)
    s.pendings, s.advances = [], []
    for k, sc in enumerate(scored):
      host = dict(sc.metrics)
      host.update({"rollout/policy_lag": 0, "rollout/policy_lag_mean": 0.0,
                   "rollout/policy_lag_max": 0})
      effective = sc.informative * g if self.group_relative else self.plan.responses
      counters = dict(self.counters[k])
      host.update(rollout.advance(counters, self.plan, self.plan.responses,
                                  self.plan.responses, effective, host["response_tokens"],
                                  sc.fractions, 1))
      s.advances.append(counters)
      s.pendings.append(Pending(step, metrics, host, dict(phases), t_start, t_update,
                                "actor_update", dict(update_phases),
                                info=(by_group, self._step_flops(sc.plen, sc.rlen), k,
                                      shared_host)))

  def _step_flops(self, plen, rlen) -> dict[str, float]:
    fwd = flops.train_flops(self.model_cfg, plen + rlen) / 3
    epochs = sum(m.batch.num_epochs for m in self.algo.models.values())
    return {"generate": float(flops.rollout_flops(self.model_cfg, plen, rlen)),
            "update": float(3 * fwd * epochs),
            "logprobs": float(fwd * self.algo.extra_forwards())}

  def fetched(self, p: Pending) -> dict[str, Any]:
    """Lane p.info[2]'s device values of step p.step, fetched once for every lane (by the
    first lane's loop to finish the step, before step p.step + 1 updates): {"metrics": the
    update's, per model; "host": the algorithm's own; "hyper": the optimizers' in effect}."""
    s = self._at(p.step)
    if s.fetched is None:
      host = jax.device_get({"metrics": p.device, "host": p.info[3],
                             "hyper": {n: m.hyperparams() for n, m in self.algo.models.items()}})
      s.fetched = [{"metrics": {n: {k: _lane(v, lane) for k, v in m.items()}
                                for n, m in host["metrics"].items()},
                    "host": {k: _lane(v, lane) for k, v in host["host"].items()},
                    "hyper": {n: {k: _lane(v, lane) for k, v in h.items()}
                              for n, h in host["hyper"].items()}}
                   for lane in range(len(self.lanes))]
    return s.fetched[p.info[2]]

  def evaluate(self, step: int, stop) -> list[dict[str, float]]:
    s = self._at(step)
    if s.evaluation is None:
      if stop is not None:  # each lane's own: the first stage alone once it reached its target
        stop = dataclasses.replace(stop, first_only=tuple(
            "responses_to_target" in loop.counters for loop in self.loops))
      s.evaluation = self.evaluator(self.actor.params, self._eval_keys(step), stop)
      if self.cfg.eval.adaptive:
        for e in s.evaluation:
          e.setdefault("eval/rows", self.evaluator.num)
    return s.evaluation

  def _eval_keys(self, step: int):
    if not hasattr(self, "_eval_fold"):
      self._eval_fold = self.lanes.map(lambda k, a: jax.random.fold_in(
          jax.random.wrap_key_data(k), a), (True, False), name="eval_keys")
    return self._eval_fold(self.keys, np.uint32(EVAL_KEY + step))


def _lane(value, lane: int):
  """A lane's value of a fetched metric: [lanes] arrays per lane, a scalar every lane's."""
  value = np.asarray(value)
  return value if value.ndim == 0 else value[lane]


def _sequence_batch(prompt_tokens, prompt_mask, tokens, mask) -> SequenceBatch:
  """A lane's sequence batch: the prompts every lane shares, then its responses."""
  return SequenceBatch(jnp.concatenate([prompt_tokens, tokens], axis=1),
                       jnp.concatenate([prompt_mask.astype(bool), mask], axis=1), mask, {})


class LaneView:
  """Lane k of runs side by side, as its Loop sees a trainer (trainer/loop.Trainer)."""

  sample_key = "responses_seen"

  def __init__(self, shared: LaneRuns, k: int):
    self.shared, self.k = shared, k
    self.samples_per_step = shared.plan.responses

  @property
  def counters(self) -> dict[str, Any]:
    return self.shared.counters[self.k]

  def state(self):
    return self.shared.lanes.take(self.shared.state(), self.k)

  def load(self, state, meta: dict[str, Any]) -> None:
    self.shared._loaded[self.k] = state
    for n, m in self.shared.algo.models.items():
      m.load_noise_state(meta.get("noise", {}).get(n, {}), self.k)

  def meta(self) -> dict[str, Any]:
    return {"noise": {n: m.noise_state(self.k) for n, m in self.shared.algo.models.items()}}

  def fill_counters(self, missing: list[str]) -> None:
    if "responses_trained" in missing:
      self.counters["responses_trained"] = self.counters["responses_seen"]

  def branch(self, *args) -> None:
    raise ConfigError("init.branch_from: runs side by side are not branched")

  def begin(self, step: int):
    return self.shared.begin(step)

  def complete(self, step: int, begun, t_start: float) -> Pending:
    self.shared.complete(step, begun, t_start)
    s = self.shared._at(step)
    self.shared.counters[self.k].update(s.advances[self.k])
    return s.pendings[self.k]

  def fetch(self, p: Pending):
    """The step's update metrics, {model: {name: value}}, as the loop checks them."""
    return self.shared.fetched(p)["metrics"]

  def metrics(self, p: Pending, fetched) -> dict[str, Any]:
    by_group, extra = p.info[0], self.shared.fetched(p)
    out = {}
    for n, m in fetched.items():
      model = self.shared.algo.models[n]
      out.update(model.read(m, by_group, lane=self.k, hyperparams=extra["hyper"][n]))
    out.update(extra["host"])
    out.update(p.host)
    return out

  def rates(self, p: Pending, wall: float) -> dict[str, float]:
    step_flops = p.info[1]
    update_s = p.phases["actor_update"] + sum(p.update_phases.values())
    out = {"throughput/train_tokens_per_s":
               p.host["train_tokens"] * self.shared.plan.main.num_epochs / update_s,
           "throughput/responses_per_s": p.host["rollout/responses_generated"] / wall,
           "flops/step": sum(step_flops.values()), **memory_report.peaks()}
    out["throughput/gen_tokens_per_s"] = p.host["response_tokens"] / p.phases["generate"]
    if self.shared.peak:  # a lane's share: its own device
      out["mfu/generate"] = step_flops["generate"] / p.phases["generate"] / self.shared.peak
      out["mfu/update"] = step_flops["update"] / update_s / self.shared.peak
      out["mfu/step"] = sum(step_flops.values()) / wall / self.shared.peak
    return out

  def evaluate(self, step: int, stop=None) -> dict[str, float]:
    return self.shared.evaluate(step, stop)[self.k]

  def progress(self, row: dict[str, Any], last_eval: dict[str, float]) -> dict[str, Any]:
    return {"lane": self.k, "responses": self.counters["responses_seen"],
            "reward": float(row["reward/mean"]),
            "eval acc": last_eval.get("eval/accuracy_greedy",
                                      last_eval.get("eval/accuracy_sampled"))}

  def finish(self, counters: dict[str, Any], last_eval: dict[str, float]) -> dict[str, Any]:
    shared, run = self.shared, self.shared.runs[self.k]
    tok = shared.env.task.tokenizer
    folder = os.path.join(run.workdir, "policy")
    params = shared.lanes.take(shared.actor.params, self.k)
    hf.save_policy(nnx.merge(shared.graphdef, params), folder,
                   bos_id=getattr(tok, "bos_id", None), eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    out = summary.summarize(run.cfg, run.workdir, counters, last_eval, shared.plan)
    if shared.generation_fit:
      out["generation_batch_fit"] = shared.generation_fit
    out["lanes"] = {"lane": self.k, "count": len(shared.lanes),
                    "devices": len(shared.lanes.devices),
                    "runs": [r.workdir for r in shared.runs]}
    out["compile"] = compiles.stats()  # the process's, shared by the lanes
    out["compilations"] = {**{n: m.update.traces for n, m in shared.algo.models.items()},
                           "sampler": shared.sampler.traces}
    write_json(os.path.join(run.workdir, "summary.json"), out)
    return out


# A group of at least REGROUP_MIN lanes whose running lanes fall to half of it or fewer (runs
# ending at their targets) re-forms with the running ones alone: the stacked computation
# stops carrying the stopped lanes. Each re-forming costs a save and a compile; a lane's
# numbers after it are its run's within the lanes' tolerance (the program is compiled for
# another lane count), and the same on every resume (`_members` replays the re-formings).
REGROUP_MIN = 4


def _regroups(group: int, running: int) -> bool:
  return group >= REGROUP_MIN and 0 < running <= group // 2


def _members(stops: list[int | None], restored: int, last_step: int) -> list[int]:
  """The lanes (positions in `stops`) of the group that runs the steps after `restored`: the
  re-formings replayed from each stopped lane's stop step (None: still running), as `run`
  made them."""
  members, running = list(range(len(stops))), set(range(len(stops)))
  for step in sorted({s for s in stops if s is not None and s <= restored}):
    running -= {k for k, s in enumerate(stops) if s == step}
    if step < last_step and _regroups(len(members), len(running)):
      members = sorted(running)
  return members


def run(runs: list[resolved.Resolved]) -> list[dict]:
  """Train the runs side by side, each in its run directory; their summaries. A lane whose
  run ends at its target (target.stop) writes its summary and policy there and is no longer
  stepped; the stacked computation carries it until the group re-forms (REGROUP_MIN); the
  group ends with its last lane."""
  preemption.loop_started()
  summaries: list[dict | None] = [None] * len(runs)
  members = list(range(len(runs)))
  while members:
    members = _run_group(runs, members, summaries)
  return summaries


def _run_group(runs: list[resolved.Resolved], members: list[int],
               summaries: list[dict | None]) -> list[int]:
  """Run the lanes `members` of `runs` as one group, writing each finished lane's summary in
  `summaries`; the members of the group to form next ([] when every lane has ended)."""
  group = [runs[i] for i in members]
  shared, loops = _build(group)
  start, starts, done, stale = _restore(loops)
  if stale:  # a running lane saved, another never did: the running lanes anew, from step 0
    for loop in loops:
      loop.ckpt.close()
    shared, loops = _build(group)
    starts = [loop.restore() if d else 0 for loop, d in zip(loops, done)]
  shared.load_all(fresh={k for k, s in enumerate(starts) if not s})
  ended: list[dict | None] = [None] * len(loops)
  closed: set[int] = set()
  last = shared.plan.num_steps

  def end_stopped(pendings):  # a lane at its stop: its summary and policy of this step
    for k, loop in enumerate(loops):
      if ended[k] is None and k not in closed and loop.stopped():
        loop.flush(pendings[k])
        closed.add(k)
        loop.close()
        ended[k] = loop.trainer.finish(*loop.result())

  try:
    for loop, s in zip(loops, starts):
      loop.open(s)
    pendings: list[Pending | None] = [None] * len(loops)
    end_stopped(pendings)  # restored at its stop
    keep = _members([starts[k] if done[k] else None for k in range(len(loops))], start, last)
    if len(keep) < len(loops):  # a resume after the group had re-formed: as it was
      return _handed(members, keep, ended, summaries)
    for step in range(start + 1, last + 1):
      live = [k for k, s in enumerate(ended) if s is None]
      if not live:
        break
      if preemption.requested():
        saved = [loops[k].save_in_flight(pendings[k]) for k in live]
        raise preemption.Preempted(min(saved))
      for k in live:
        pendings[k] = loops[k].step(step, pendings[k])
      end_stopped(pendings)
      live = [k for k, s in enumerate(ended) if s is None]
      if step < last and _regroups(len(loops), len(live)):
        for k in live:
          loops[k].save_in_flight(pendings[k], why=f"{len(live)} of {len(loops)} lanes running: "
                                  "the group re-forms with them")
        return _handed(members, live, ended, summaries)
    for k, s in enumerate(ended):
      if s is None:
        loops[k].flush(pendings[k])
  finally:
    for k, loop in enumerate(loops):
      if k not in closed:
        loop.close()
  for k, loop in enumerate(loops):
    summaries[members[k]] = ended[k] if ended[k] is not None else loop.trainer.finish(
        *loop.result())
  return []


def _handed(members: list[int], keep: list[int], ended: list[dict | None],
            summaries: list[dict | None]) -> list[int]:
  """The ended lanes' summaries into `summaries`; the members kept for the next group."""
  for k, s in enumerate(ended):
    if s is not None:
      summaries[members[k]] = s
  return [members[k] for k in keep]


def _build(runs: list[resolved.Resolved]) -> tuple[LaneRuns, list[Loop]]:
  shared = LaneRuns(runs)
  shared.loops = [Loop(shared.view(k), r.cfg, r.workdir, shared.plan.num_steps,
                       eval_at_start=True, written=r.raw) for k, r in enumerate(runs)]
  return shared, shared.loops


def _restore(loops: list[Loop]) -> tuple[int, list[int], list[bool], bool]:
  """Restore every lane: a lane that had stopped at its target (target.stop) keeps its own
  step; the others resume from the newest step all of them have intact, and the steps a lane
  saved after it are set aside (it saves them again). Returns (that step, 0 for none; each
  lane's step; which lanes are stopped; whether a lane still running had restored a later step
  than the common one, whose state is then stale)."""
  steps = [loop.restore() for loop in loops]
  done = [loop.stopped() for loop in loops]
  live = [k for k, d in enumerate(done) if not d]
  stale = False
  while live and len({steps[k] for k in live}) > 1:
    limit = min(steps[k] for k in live)
    logging.info("runs side by side: lanes restored steps %s; the running ones resume from "
                 "step %d", steps, limit)
    stale = True
    for k in live:
      steps[k] = loops[k].restore(at_most=limit)
  start = steps[live[0]] if live else 0
  for k in live:
    later = loops[k].ckpt.set_aside_after(start)
    if later:
      logging.warning("%s: steps %s set aside in checkpoints/superseded/: the runs side by side "
                      "resume from step %d, which every one of them holds", loops[k].workdir,
                      later, start)
  return start, steps, done, stale and start == 0

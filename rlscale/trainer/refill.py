"""Dynamic sampling's rounds: decode calls until the step holds P informative groups.

A step's prompts are a stream from the step's first prompt on. A *call* decodes the next
`generation_batch / G` prompts (G responses each) with the compiled decode of the
memory-fitted generation batch, so rounds never compile anything new; a call's prompts are
split over the processes in order, so call c holds the same stream rows on one process or on
many, and a row's sample depends only on the step's key and its row in the stream. A *round*
is the calls planned on one decision: the first sized by the filtered fraction of past steps
(over-sampling), later ones by the informative groups still missing and this step's
fraction, at most `rollout.max_rounds` rounds. A round's calls are sent one ahead of the
host's scoring and stop once no informative group is missing. Calls are scored as they
finish; every process
gathers every group's rewards (a few numbers per group), so all agree on the slots
(group_filter.Slots); each call's kept rows are written into the step's batch on the devices
by one compiled scatter (rows move device to device, never through one host).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlscale.config.errors import ConfigError
from rlscale.parallel import distributed
from rlscale.parallel import sharding
from rlscale.sampling import decode
from rlscale.trainer import group_filter as gf
from rlscale.trainer import rollout


@dataclasses.dataclass
class Call:
  first: int  # the step-level index of its first group
  problems: list  # this process's problems, one per group
  rollout: Any  # decode.Rollout, global rows of the call
  round: int
  prompt_lengths: np.ndarray  # this process's rows'


@dataclasses.dataclass
class Round:
  """A round's plan: its number, the calls planned, those dispatched so far."""
  number: int
  planned: int
  sent: int
  calls: list = dataclasses.field(default_factory=list)


# Decode calls dispatched and not yet scored, at most: the device decodes one while the host
# scores the other, and a step holds at most two calls' rows besides its batch (the batch
# plan's rollout memory counts them; a call is dropped once its rows are written).
IN_FLIGHT = 2


@dataclasses.dataclass
class Groups:
  """Every generated group of a step, gathered from every process, in stream order."""
  rewards: list = dataclasses.field(default_factory=list)  # [cp, G] per call
  correct: list = dataclasses.field(default_factory=list)
  finished: list = dataclasses.field(default_factory=list)
  lengths: list = dataclasses.field(default_factory=list)
  prompt_lengths: list = dataclasses.field(default_factory=list)
  codes: list = dataclasses.field(default_factory=list)  # [cp]

  def cat(self, name: str) -> np.ndarray:
    return np.concatenate(getattr(self, name))


@dataclasses.dataclass
class Filled:
  """A finished step of rounds: the batch's arrays and what the step did."""
  tokens: jax.Array  # [PG, N] on the sampler's mesh
  mask: jax.Array  # [PG, N] response mask, the trained groups' rows only
  logprobs: jax.Array  # [PG, N] the sampler's log-probs
  problems: list  # this process's rows' problems, one per group
  rewards: np.ndarray  # this process's rows' rewards [rows]
  trained: np.ndarray  # [P] bool: the slot's group carries signal (all slots, every process)
  groups: Groups
  rounds: int
  calls: int
  dropped_informative: int
  generate_s: float
  ahead: int = 0  # trained groups of the calls dispatched before run() (an earlier step's)


def _gather(local: np.ndarray) -> np.ndarray:
  """Every process's rows of `local` (leading axis: groups), in process order."""
  if jax.process_count() == 1:
    return local
  from jax.experimental import multihost_utils
  out = np.asarray(multihost_utils.process_allgather(local))
  return out.reshape((-1,) + local.shape[1:])


def put_replicated(x: np.ndarray, mesh) -> jax.Array:
  """The same host array on every device of `mesh` (each process passes the same values)."""
  rep = sharding.replicated(mesh)
  if jax.process_count() == 1:
    return jax.device_put(x, rep)
  return jax.make_array_from_process_local_data(rep, x, x.shape)


class Refill:
  """The rounds of one run: its sampler, task, sizes and the filtered fraction so far."""

  def __init__(self, sampler, task, num_prompts: int, group_size: int, generation_batch: int,
               ro, rules):
    procs, shards = jax.process_count(), sharding.batch_divisor(sampler.mesh, rules)
    g = group_size
    if generation_batch % (g * procs) or generation_batch % shards:
      raise ConfigError(f"rollout.dynamic_sampling=True decodes whole groups per call: "
                        f"rollout.generation_batch={generation_batch} must be a multiple of "
                        f"rl.group_size x processes ({g} x {procs}) and of the sampler's "
                        f"{shards} batch shards")
    if (num_prompts * g) % shards:
      raise ConfigError(f"rollout.dynamic_sampling=True assembles the step on the sampler's "
                        f"devices: rl.num_prompts x rl.group_size = {num_prompts * g} must "
                        f"split over its {shards} batch shards")
    self.sampler, self.task, self.rules = sampler, task, rules
    self.P, self.G, self.gb = num_prompts, g, generation_batch
    self.call_prompts = generation_batch // g  # prompts per call, over all processes
    self.local_prompts = self.call_prompts // procs
    self.min_std, self.max_rounds, self.oversample = (float(ro.filter_min_std),
                                                      int(ro.max_rounds), ro.oversample)
    self.group = decode.shared_prefill(g, self.local_prompts * g, generation_batch, shards)
    self.filtered = 0.0  # EMA of the filtered fraction (checkpointed)
    self.filtered_count = 0
    self.traces = 0
    self._place = None
    self.on_dispatch = None  # called with each call's decode output once dispatched

  # --- state a checkpoint keeps ---

  def state(self) -> dict[str, Any]:
    return {"filtered": self.filtered, "filtered_count": self.filtered_count}

  def load(self, state: dict[str, Any]) -> None:
    self.filtered = float(state.get("filtered", 0.0))
    self.filtered_count = int(state.get("filtered_count", 0))

  def estimate(self) -> float:
    """The bias-corrected EMA of past steps' filtered fractions (0 before the first step)."""
    if not self.filtered_count:
      return 0.0
    return self.filtered / (1.0 - gf.FILTERED_DECAY ** self.filtered_count)

  # --- calls ---

  def calls_for(self, missing: int, filtered: float) -> int:
    return math.ceil(gf.prompts_to_send(missing, filtered, self.oversample) / self.call_prompts)

  def dispatch(self, params, key, stream_first: int, first_group: int, round_: int) -> Call:
    """Decode the call whose first group is step-level `first_group` (stream prompt
    stream_first + first_group)."""
    mine = first_group + jax.process_index() * self.local_prompts
    problems = self.task.problems(stream_first + mine, self.local_prompts)
    ptoks, pmask = rollout.prompts(self.task, problems, self.G)
    ids = np.arange(mine * self.G, (mine + self.local_prompts) * self.G, dtype=np.int32)
    out = self.sampler(params, ptoks, pmask, key, ids, self.group)
    if self.on_dispatch is not None:
      self.on_dispatch(out)
    return Call(first_group, problems, out, round_, pmask.sum(axis=1))

  def first_round(self, params, key, stream_first: int) -> "Round":
    """Round 1: P prompts over (1 - the filtered fraction so far), in calls of which the
    first IN_FLIGHT are dispatched now."""
    r = Round(1, self.calls_for(self.P, self.estimate()), 0)
    r.calls = [self.dispatch(params, key, stream_first, c * self.call_prompts, 1)
               for c in range(min(IN_FLIGHT, r.planned))]
    r.sent = len(r.calls)
    return r

  # --- a step ---

  def run(self, params, key, stream_first: int, first: "Round", t_dispatch: float) -> Filled:
    """Score round 1's calls, send the rest of its calls and later rounds while informative
    groups are missing (a round stops early once none is), and assemble the batch; `params`
    sample the calls dispatched here."""
    slots, groups = gf.Slots(self.P), Groups()
    mesh = self.sampler.mesh
    buffers = None
    pending = collections.deque(first.calls)
    first.calls = []  # a scored call's rows are dropped as soon as they are written
    round_, left, sent = 1, first.planned - first.sent, first.sent  # left: planned, not sent
    ahead_calls = first.sent
    t_gen = 0.0
    while True:
      while slots.missing and left and len(pending) < IN_FLIGHT and (
          not pending or self._expected(pending, groups) < slots.missing):
        pending.append(self.dispatch(params, key, stream_first, sent * self.call_prompts,
                                     round_))
        sent, left = sent + 1, left - 1
      if not pending:
        if not slots.missing or round_ >= self.max_rounds:
          break
        filtered = float(np.mean(groups.cat("codes") != gf.INFORMATIVE))
        round_, left = round_ + 1, self.calls_for(slots.missing, filtered)
        continue
      call = pending.popleft()
      t = time.time()
      jax.block_until_ready(call.rollout.tokens)
      t_gen += time.time() - max(t, t_dispatch)
      t_dispatch = 0.0
      codes = self._score(call, groups)
      buffers = self._write(buffers, call, slots.offer(codes), mesh)
      del call
      if not slots.missing:
        left = 0  # the round has found them: its calls not yet sent are not
    codes = groups.cat("codes")
    step_filtered = float(np.mean(codes != gf.INFORMATIVE))
    self.filtered = gf.FILTERED_DECAY * self.filtered + (1 - gf.FILTERED_DECAY) * step_filtered
    self.filtered_count += 1
    filled = self._assemble(buffers, slots, groups, stream_first, round_, sent, t_gen)
    filled.ahead = int(np.sum(slots.informative
                              & (slots.owner // self.call_prompts < ahead_calls)))
    return filled

  def _expected(self, pending, groups: Groups) -> float:
    """Informative groups the calls in flight should bring: at this step's filtered fraction
    so far (past steps' before any call is scored). A call is sent ahead only when they
    should not be enough."""
    f = (float(np.mean(groups.cat("codes") != gf.INFORMATIVE)) if groups.codes
         else self.estimate())
    return len(pending) * self.call_prompts * (1.0 - f)

  def _score(self, call: Call, groups: Groups) -> np.ndarray:
    """Score this process's rows of `call`, gather every process's, and classify the groups."""
    toks, rmask = rollout.host_rollout(call.rollout)
    repeated = [p for p in call.problems for _ in range(self.G)]
    rewards, correct, finished = rollout.score(self.task, repeated, toks, rmask,
                                               self.task.tokenizer.eos_ids)
    local = np.stack([rewards, correct, finished, rmask.sum(axis=1),
                      call.prompt_lengths]).astype(np.float32)
    local = local.reshape(5, self.local_prompts, self.G).transpose(1, 0, 2)
    every = _gather(local)  # [cp, 5, G]
    r, c, f, n, pl = (every[:, i] for i in range(5))
    codes = gf.group_signal(r, c > 0, self.min_std)
    groups.rewards.append(r)
    groups.correct.append(c > 0)
    groups.finished.append(f > 0)
    groups.lengths.append(n.astype(np.int64))
    groups.prompt_lengths.append(pl.astype(np.int64))
    groups.codes.append(codes)
    return codes

  def _write(self, buffers, call: Call, writes: dict[int, int], mesh):
    """The step's buffers with `call`'s rows written into the slots they took."""
    g = self.G
    dest = np.full(self.gb, self.P * g, np.int32)  # out of range: dropped
    for slot, group in writes.items():
      j = group - call.first
      dest[j * g:(j + 1) * g] = slot * g + np.arange(g)
    out = call.rollout
    if buffers is None:
      n = out.tokens.shape[1]
      b2 = sharding.batch_sharding(mesh, 2, self.rules)
      buffers = tuple(jax.device_put(jnp.zeros((self.P * g, n), dt), b2) for dt in
                      (out.tokens.dtype, out.mask.dtype, out.logprobs.dtype))
    if not writes:
      return buffers
    return self._placer()(buffers, (out.tokens, out.mask, out.logprobs),
                          put_replicated(dest, mesh))

  def _placer(self):
    if self._place is None:
      def place(buffers, part, dest):
        self.traces += 1
        return tuple(b.at[dest].set(p, mode="drop") for b, p in zip(buffers, part))
      self._place = jax.jit(place, donate_argnums=0)
    return self._place

  def _assemble(self, buffers, slots: gf.Slots, groups: Groups, stream_first: int, rounds: int,
                calls: int, t_gen: float) -> Filled:
    """The batch of the slots' groups; only the informative groups' responses carry loss."""
    mine = distributed.process_rows(self.P)
    owners = slots.owner[mine]
    problems = [self.task.problems(stream_first + int(o), 1)[0] for o in owners]
    rewards = groups.cat("rewards")[owners].reshape(-1)
    trained_rows = np.repeat(slots.informative[mine], self.G)
    tokens, mask, logprobs = buffers
    keep = sharding.put_batch(trained_rows, self.sampler.mesh, self.rules)
    mask = _mask_rows(mask, keep)
    return Filled(tokens, mask, logprobs, problems, rewards, slots.informative.copy(), groups,
                  rounds, calls, slots.dropped_informative, t_gen)


@jax.jit
def _mask_rows(mask_BxN, keep_B):
  return mask_BxN & keep_B[:, None]


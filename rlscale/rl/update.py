"""One jitted update over a batch of sequences: epochs x mini-batches x micro-batches.

The batch is shuffled per epoch and cut into `num_minibatches` mini-batches, one optimizer step
each. A mini-batch is processed in micro-batches of `microbatch` rows whose gradients are summed;
token weights come from the whole mini-batch (see losses.token_weights), so the micro-batch
size never changes the gradient. The algorithm supplies only a per-token loss.

Each optimizer step also yields the two squared gradient norms of the noise-scale estimator
(rl/noise_scale.py): the mean over micro-batches of each one's mean gradient, and the
mini-batch gradient. Shuffling is by responses, or, when `by_group` is set for a step, by whole
groups of `group_size` rows, which makes every micro-batch a set of whole groups (the
prompt-level estimate). With `shared_prompt` = G every shuffle is by whole groups and each
micro-batch's groups run their prompt once (models/shared_prompt.py).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rlscale.parallel import sharding
from rlscale.models import memory
from rlscale.models.packed_rows import Packing
from rlscale.rl import packing
from rlscale.rl.losses import microbatch_shares, token_weights


class TrainState(NamedTuple):
  params: nnx.State
  opt_state: Any
  step: jax.Array  # optimizer steps taken
  prox: Any = None  # an EWMA of `params` (batch-size-invariant PPO's proximal policy), or None


class SequenceBatch(NamedTuple):
  """Prompt (left-padded) followed by response (right-padded): tokens [B, P + N]."""
  tokens: jax.Array  # [B, T] int32
  mask: jax.Array  # [B, T] bool, real tokens
  resp_mask: jax.Array  # [B, N] bool, the response tokens that carry loss
  extras: dict[str, jax.Array]  # per-token inputs of the loss, [B, N] (or [B] per sequence)


class TokenInputs(NamedTuple):
  """What a per-token policy loss sees for one micro-batch."""
  logp: jax.Array  # [b, N] log pi(token) under the parameters being trained
  entropy: jax.Array  # [b, N] float32, of the full softmax at each position
  mask: jax.Array  # [b, N] bool
  extras: dict[str, jax.Array]
  prox_logp: jax.Array | None = None  # [b, N] under the proximal policy, when there is one


class ValueInputs(NamedTuple):
  """What a per-token value loss sees for one micro-batch."""
  values: jax.Array  # [b, N] V(s_t) of the state before each response token
  mask: jax.Array  # [b, N] bool
  extras: dict[str, jax.Array]


def policy_forward(graphdef: nnx.GraphDef, chunk: int = 0, remat: str = "none"):
  """forward(params, batch, prox, group=1) -> TokenInputs for a CausalLM.

  `chunk` (train.logprob_chunk): vocabulary columns per chunk of the float32 log-softmax, 0
  the whole vocabulary at once; `remat` (train.remat): each decoder block's rematerialization
  in the backward pass (rlscale/models/memory.py). The defaults are the old behaviour.
  `group` > 1: the rows are whole groups of that many sharing their prompt, run once.
  """
  memory.remat_policy(remat)  # an unknown value fails here, naming the field
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
    raise ValueError(f"train.logprob_chunk={chunk!r} must be an integer >= 0")

  def logp_and_entropy(params, mb: SequenceBatch, group: int, packing):
    n = mb.resp_mask.shape[1]
    return nnx.merge(graphdef, params).response_logprobs(mb.tokens, mb.mask, n, chunk, remat,
                                                         group, packing)

  def forward(params, mb: SequenceBatch, prox=None, group: int = 1,
              packing: Packing | None = None) -> TokenInputs:
    logp, entropy = logp_and_entropy(params, mb, group, packing)
    prox_logp = None
    if prox is not None:
      prox_logp = jax.lax.stop_gradient(logp_and_entropy(prox, mb, group, packing)[0])
    return TokenInputs(logp, entropy, mb.resp_mask, mb.extras, prox_logp)

  return forward


def value_forward(graphdef: nnx.GraphDef, remat: str = "none"):
  """forward(params, batch, prox, group=1) -> ValueInputs for a ValueModel; `remat` and
  `group` as policy_forward's."""
  memory.remat_policy(remat)

  def forward(params, mb: SequenceBatch, prox=None, group: int = 1,
              packing: Packing | None = None) -> ValueInputs:
    values = nnx.merge(graphdef, params).response_values(mb.tokens, mb.mask,
                                                         mb.resp_mask.shape[1], remat, group,
                                                         packing)
    return ValueInputs(values, mb.resp_mask, mb.extras)
  return forward


def run_forward(forward, params, mb: SequenceBatch, prox, group: int,
                packing: Packing | None = None):
  """forward(params, mb, prox), with `group` only when rows share prompts (and `packing` when
  their responses are packed, rl/packing.py): a forward written for rows alone (three
  arguments, as an algorithm's own may be) still serves group 1."""
  if group == 1:
    return forward(params, mb, prox)
  return forward(params, mb, prox, group) if packing is None else forward(params, mb, prox,
                                                                          group, packing)


def response_fn(forward, field: str, mesh: Mesh, rules: sharding.Rules, group: int = 1,
                pack: bool = False, lanes=None):
  """A jitted `fn(params, batch) -> forward(params, batch).<field>`, e.g. the old or reference
  log-probs (`policy_forward`, "logp") or the critic's values (`value_forward`, "values");
  `group` > 1: the batch's rows are whole groups on every batch shard, each prompt run once;
  `pack` as well: the batch's responses packed when that saves rows (rl/packing.py), 0 after
  each row's last loss token (nothing is computed there). With `lanes`: runs side by side,
  `params` and the batch carrying the lane axis."""
  def raw(params, tokens, mask, resp_mask, pk=None):
    with sharding.activation_sharding(mesh, rules):
      if pk is not None:
        pk = jax.tree.map(lambda x: sharding.constrain(x, ("batch",) + (None,) * (x.ndim - 1)), pk)
      return getattr(run_forward(forward, params, SequenceBatch(tokens, mask, resp_mask, {}),
                                 None, group, pk), field)

  fn = (jax.jit(raw) if lanes is None
        else lanes.map(raw, (True, True, True, True, True), name=f"response_{field}"))
  plan = _WholeBatchPlan(mesh, rules, group, lanes) if pack and group > 1 else None

  def call(params, batch):
    pk = None if plan is None else plan(batch.resp_mask)
    return fn(params, batch.tokens, batch.mask, batch.resp_mask, pk)

  # The jitted call lowered for a batch, for its memory analysis (rlscale/metrics/memory_report.py).
  call.lower = lambda params, batch: fn.lower(params, batch.tokens, batch.mask, batch.resp_mask)
  return call


class _HostPlan:
  """What planning a packing on the host takes: the rows' lengths, fetched replicated (one
  small jit, so every process plans alike), and the plan placed back on the mesh with each
  batch shard's part on its own devices only (`sharding.put_global` on the plan's shard axis)."""

  def __init__(self, mesh: Mesh, rules: sharding.Rules, lanes=None):
    self.mesh, self.rules, self.lanes = mesh, rules, lanes
    if lanes is None:
      self._lengths = jax.jit(packing.input_lengths, out_shardings=sharding.replicated(mesh))
    else:  # runs side by side: [lanes, B]
      self._lengths = lanes.map(packing.input_lengths, (True,), name="input_lengths")

  def lengths(self, resp_mask) -> np.ndarray:
    return np.asarray(self._lengths(resp_mask))

  def place(self, plan: Packing, shard_axis: int) -> Packing:
    return jax.tree.map(lambda x: sharding.put_global(x, self.mesh, shard_axis, self.rules), plan)

  def plan(self, packer: packing.Packer, resp_mask, perms) -> Packing | None:
    """The step's packing placed for the update (its batch-shard axis 3), or None. Runs side
    by side: one plan per lane, all in the bucket of the fullest lane (one program)."""
    width = resp_mask.shape[-1] - 1
    lengths, perms = self.lengths(resp_mask), np.asarray(perms)
    if self.lanes is None:
      p = packer.plan(lengths, perms, width)
      return None if p is None else self.place(p, 3)
    need = max(packer.need(l, o, width) for l, o in zip(lengths, perms))
    plans = [packer.plan(l, o, width, at_least=need) for l, o in zip(lengths, perms)]
    return None if plans[0] is None else self.lanes.stack(plans)


class _WholeBatchPlan:
  """The packing of a whole batch taken as one micro-batch (response_fn's `pack`), or None
  when no bucket saves rows."""

  def __init__(self, mesh: Mesh, rules: sharding.Rules, group: int, lanes=None):
    self.host = _HostPlan(mesh, rules, lanes)
    self.shards, self.group, self.lanes = sharding.batch_divisor(mesh, rules), group, lanes

  def __call__(self, resp_mask) -> Packing | None:
    rows, n = resp_mask.shape[-2:]
    packer = packing.Packer(num_epochs=1, num_minibatches=1, microbatch=rows,
                            shards=self.shards, group=self.group)
    order = np.arange(rows)[None]
    first = lambda p: jax.tree.map(lambda x: x[0, 0, 0], p)
    if self.lanes is None:
      p = packer.plan(self.host.lengths(resp_mask), order, n - 1)
      return None if p is None else self.host.place(first(p), 0)
    lengths = self.host.lengths(resp_mask)
    need = max(packer.need(l, order, n - 1) for l in lengths)
    plans = [packer.plan(l, order, n - 1, at_least=need) for l in lengths]
    return None if plans[0] is None else self.lanes.stack([first(p) for p in plans])


# loss(inputs) -> (per-token loss [b, N], {metric name: per-token value [b, N]})
TokenLoss = Callable[[Any], tuple[jax.Array, dict[str, jax.Array]]]


def sq_norm(tree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


def accumulate(grad_fn, params, micro, shares, measure: bool = True):
  """Sum a micro-batched gradient and measure the micro-batches' own mean gradients.

  `grad_fn(params, x) -> ((value, aux), grads)` for one micro-batch `x` (leading axis of
  `micro` indexes micro-batches); `shares[i]` is micro-batch i's share of the mini-batch's loss
  (losses.microbatch_shares), so grads_i / shares[i] is the gradient it would have on its own.
  Returns (summed grads, stacked values, stacked aux, mean over i of |grads_i / shares[i]|^2),
  the mean taken over the micro-batches with a positive share: one without tokens has no
  gradient of its own, and counting it as 0 would pull the small-batch norm down.
  """
  def body(carry, xs):
    grads, small_sq = carry
    x, share = xs
    (value, aux), g = grad_fn(params, x)
    if measure:
      small_sq = small_sq + sq_norm(g) / jnp.maximum(jnp.square(share), 1e-30)
    return (jax.tree.map(jnp.add, grads, g), small_sq), (value, aux)

  zeros = jax.tree.map(jnp.zeros_like, params)
  (grads, small_sq), (values, aux) = jax.lax.scan(body, (zeros, jnp.zeros((), jnp.float32)),
                                                   (micro, shares))
  return grads, values, aux, small_sq / jnp.maximum(jnp.sum(shares > 0), 1)


def permutation(key, rows: int, group_size: int, by_group) -> jax.Array:
  """A shuffle of the rows, by single rows or (when `by_group`) by whole groups."""
  k1, k2 = jax.random.split(key)
  by_row = jax.random.permutation(k1, rows)
  groups = jax.random.permutation(k2, rows // group_size)
  by_grp = (groups[:, None] * group_size + jnp.arange(group_size)[None]).reshape(-1)
  return jnp.where(by_group, by_grp, by_row)


def micro_grad_fn(forward, loss: TokenLoss, group: int = 1, pack: bool = False):
  """value_and_grad of one micro-batch's share of the mini-batch loss, sum(w * loss), with its
  metrics as token sums (weights mw); `group` > 1: rows of whole groups sharing a prompt; xs
  = (mb, w, mw, packing or None); `pack`: the loss's inputs are neutral (packing.neutral)
  where a packed forward computes nothing, whether this micro-batch's ran packed or not."""
  def micro_loss(params, xs, prox):
    mb, w, mw, pk = xs
    mb, w, mw, pk = jax.tree.map(
        lambda x: sharding.constrain(x, ("batch",) + (None,) * (x.ndim - 1)), (mb, w, mw, pk))
    inputs = run_forward(forward, params, mb, prox, group, pk)
    if pack:
      inputs = packing.neutral(inputs, packing.computed(mb.resp_mask))
    per_token, metrics = loss(inputs)
    return jnp.sum(w * per_token), {k: jnp.sum(mw * v) for k, v in metrics.items()}

  return jax.value_and_grad(micro_loss, has_aux=True)


def apply_gradients(optimizer, state: TrainState, grads, prox_decay: float | None,
                    lr_scale=None) -> TrainState:
  """One optimizer step; the proximal parameters (if any) follow as an EWMA. `lr_scale`
  multiplies the step's update, as it would the learning rate (optim.lr_batch='effective')."""
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  if lr_scale is not None:
    updates = jax.tree.map(lambda u: (u * lr_scale).astype(u.dtype), updates)
  params = optax.apply_updates(state.params, updates)
  prox = state.prox
  if prox_decay is not None:
    prox = jax.tree.map(lambda a, b: prox_decay * a + (1.0 - prox_decay) * b, prox, params)
  return TrainState(params, opt_state, state.step + 1, prox)


@dataclasses.dataclass(frozen=True)
class UpdateOptions:
  """How an update consumes a step's rows (make_update); the batch plan's numbers."""
  microbatch: int  # rows per micro-batch (gradients summed over a mini-batch's micro-batches)
  max_len: int  # response tokens per row: the token weights' normaliser
  num_minibatches: int = 1  # optimizer steps per epoch
  num_epochs: int = 1  # passes over the step's rows
  aggregation: str = "token-mean"  # losses.token_weights: token-mean | seq-mean-token-mean | ...
  shuffle: bool = True  # each epoch's row order drawn (False: the rows' own)
  group_size: int = 1  # rows per group (by_group shuffles and shared_prompt)
  measure_noise: bool = True  # the noise scale's two squared gradient norms
  prox_decay: float | None = None  # PPO-EWMA: the proximal parameters' EWMA decay per step
  ptx: tuple[float, TokenLoss] | None = None  # PPO-ptx: (coef, the demonstrations' loss)
  count_rows: bool = False  # rows may carry no loss (dynamic sampling)
  shared_prompt: int = 1  # G: each group's prompt runs once (models/shared_prompt.py)
  pack: bool = False  # shared_prompt's responses packed into fewer rows (rl/packing.py)
  compile_ahead: bool = False  # pack: every bucket's program compiled at the first update

  def __post_init__(self):
    if self.shared_prompt > 1 and (self.shared_prompt != self.group_size
                                   or self.microbatch % self.group_size):
      raise ValueError(f"shared_prompt={self.shared_prompt} needs micro-batches of whole groups "
                       f"of {self.group_size} (microbatch {self.microbatch})")
    if self.pack and self.shared_prompt == 1:
      raise ValueError("pack needs shared_prompt: packed rows hold responses of one group")


def make_update(forward, optimizer, loss: TokenLoss, options: UpdateOptions, *, mesh: Mesh,
                rules: sharding.Rules, lanes=None):
  """An `Update`: `update(state, batch, key, by_group=False) -> (state, metrics)`.

  `forward(params, micro_batch, prox_params)` gives the loss its inputs (policy_forward,
  value_forward). `optimizer` is an optax transformation, or `optimizer(hyper)` makes one from
  the update's `hyper` argument (rl/optim.make's `values`); a `loss` with a `hyper` attribute
  is called `loss(inputs, hyper)` when the update is given one. `hyper` is a dict of scalars the
  update takes as arguments, not constants: runs that differ only in them (the learning rate,
  the clip, the loss coefficients) share one compiled program. Metrics: the loss's per-token
  metrics as token means over each mini-batch,
  averaged over the optimizer steps; `grad_norm` (before clipping) mean and max over the
  optimizer steps; `noise/grad_sq_small`, `noise/grad_sq_big` (means over the optimizer steps)
  with the batch sizes they belong to (micro-batch and mini-batch rows). With a single
  micro-batch per mini-batch there is no small batch, and the noise metrics are absent, as they
  are with `measure_noise=False`. With `prox_decay` the state's `prox` parameters follow the
  trained ones as an EWMA, updated after every optimizer step. With `ptx` = (coef, loss)
  every optimizer step adds coef x the token mean of `loss` over its block of the `demos` rows
  (rl/ptx.py: PPO-ptx); the noise metrics and `grad_norm_rl` measure the policy loss alone.
  With `count_rows` (dynamic sampling, whose batch may hold rows without loss) the noise
  metrics also give the rows with loss tokens they were measured on: `noise/rows_big` (per
  mini-batch), `noise/inv_rows_small` (the mean of 1/rows over the micro-batches with tokens:
  E|G_small|^2 = |G|^2 + tr(Sigma) mean(1/b_i)) and `noise/micro_used_min`; and a mini-batch
  without any loss token takes no optimizer step (Adam's momentum would move it). With
  `shared_prompt` = G (group_size; micro-batches of whole groups on every batch shard) every
  shuffle is by whole groups, whatever `by_group`, and each group's prompt runs once; with
  `pack` as well, each micro-batch's responses are packed into fewer rows when they fit
  (rl/packing.py: no compute after a response's last loss token). With `lanes`
  (rlscale/parallel/lanes.py) it updates runs side by side, each lane as its run alone.
  """
  o = options
  num_minibatches, num_epochs, microbatch, group_size = (o.num_minibatches, o.num_epochs,
                                                         o.microbatch, o.group_size)
  aggregation, max_len, measure_noise, ptx = o.aggregation, o.max_len, o.measure_noise, o.ptx
  shared_prompt, pack, prox_decay, count_rows = o.shared_prompt, o.pack, o.prox_decay, o.count_rows
  packer = (packing.Packer(num_epochs=num_epochs, num_minibatches=num_minibatches,
                           microbatch=microbatch, shards=sharding.batch_divisor(mesh, rules),
                           group=group_size) if pack else None)
  by_group_always = shared_prompt > 1
  make_optimizer = optimizer if callable(optimizer) else (lambda hyper: optimizer)

  def perms(key, by_group):
    """[E, B]: each epoch's row order (shared-prompt training: always by whole groups)."""
    def one(epoch, rows):
      if not o.shuffle:
        return jnp.arange(rows)
      return permutation(jax.random.fold_in(key, epoch), rows, group_size,
                         True if by_group_always else by_group)
    return lambda rows: jnp.stack([one(e, rows) for e in range(num_epochs)])
  ptx_grad = None if ptx is None else micro_grad_fn(forward, ptx[1])

  def add_ptx(params, grads, demo: SequenceBatch, metrics):
    """grads + coef x the demonstrations' gradient, with the ptx metrics."""
    w = token_weights(demo.resp_mask, "token-mean", 1)
    (_, aux), g = ptx_grad(params, (demo, w, w, None), None)
    metrics.update(aux, ptx_grad_norm=jnp.sqrt(sq_norm(g)),
                   grad_norm_rl=jnp.sqrt(sq_norm(grads)))
    return jax.tree.map(lambda a, b: a + ptx[0] * b, grads, g)

  def minibatch_step(grad_fn, opt, lr_scale):
    """One optimizer step over a mini-batch, for lax.scan; `grad_fn`, `opt` and `lr_scale` are
    those of the update being traced (they may hold its traced arguments)."""
    def step(state: TrainState, xs):
      mb, demo, pk = xs  # pk: this mini-batch's packing [micro-batches, S, ...], or None
      rows = mb.tokens.shape[0]
      w = token_weights(mb.resp_mask, aggregation, max_len)
      mw = token_weights(mb.resp_mask, "token-mean", max_len)  # metrics: token means
      n_micro = rows // microbatch
      split = lambda x: x.reshape((n_micro, microbatch) + x.shape[1:])
      micro = jax.tree.map(split, (mb, w, mw)) + (pk,)
      shares = microbatch_shares(micro[0].resp_mask, micro[1], aggregation, max_len)
      grads, values, metrics, small_sq = accumulate(
          lambda p, x: grad_fn(p, x, state.prox), state.params, micro, shares,
          measure_noise and n_micro > 1)
      big_sq = sq_norm(grads)
      metrics = {k: jnp.sum(v) for k, v in metrics.items()}
      if demo is not None:
        grads = add_ptx(state.params, grads, demo, metrics)
      metrics.update(loss=jnp.sum(values),
                     grad_norm=jnp.sqrt(big_sq if demo is None else sq_norm(grads)))
      if n_micro > 1 and measure_noise:
        metrics.update({"noise/grad_sq_small": small_sq, "noise/grad_sq_big": big_sq})
        if count_rows:
          metrics.update(_row_counts(micro[0].resp_mask, shares))
      new = apply_gradients(opt, state, grads, prox_decay, lr_scale)
      if count_rows:  # a mini-batch of rows without loss: no step at all
        live = jnp.any(mb.resp_mask)
        new = jax.tree.map(lambda a, b: jnp.where(live, a, b), new, state)
      return new, metrics
    return step

  def update(state: TrainState, batch: SequenceBatch, perms, demos=None, packs=None,
             scale=None, hyper=None):
    """perms [E, B]: each epoch's row order (Update.perms); packs: the step's packing
    [E, M, m, S, ...] (rl/packing.py) or None; hyper: the scalars the optimizer and the loss
    take as arguments, or None."""
    with sharding.activation_sharding(mesh, rules):
      rows = batch.tokens.shape[0]
      mb_rows = rows // num_minibatches
      if demos is not None:  # one block of rows per optimizer step, in order
        per = (num_epochs, num_minibatches, demos.tokens.shape[0] // num_epochs // num_minibatches)
        demos = jax.tree.map(lambda x: x.reshape(per + x.shape[1:]), demos)
      takes_hyper = hyper is not None and hasattr(loss, "hyper")  # a user's loss(inputs) works
      loss_fn = functools.partial(loss, hyper=hyper) if takes_hyper else loss
      step = minibatch_step(micro_grad_fn(forward, loss_fn, shared_prompt, pack),
                            make_optimizer(hyper), scale)
      step_metrics = []
      for epoch in range(num_epochs):
        shuffled = jax.tree.map(lambda x: jnp.take(x, perms[epoch], axis=0), batch)
        mbs = jax.tree.map(lambda x: x.reshape((num_minibatches, mb_rows) + x.shape[1:]), shuffled)
        epoch_demos = None if demos is None else jax.tree.map(lambda x: x[epoch], demos)
        epoch_packs = None if packs is None else jax.tree.map(lambda x: x[epoch], packs)
        state, metrics = jax.lax.scan(step, state, (mbs, epoch_demos, epoch_packs))
        step_metrics.append(metrics)
      metrics = jax.tree.map(lambda *xs: jnp.concatenate(xs), *step_metrics)
      out = {k: jnp.mean(v) for k, v in metrics.items()}
      out["grad_norm_max"] = jnp.max(metrics["grad_norm"])
      if "noise/micro_used" in metrics:
        out["noise/micro_used_min"] = jnp.min(metrics["noise/micro_used"])
      return state, out

  return Update(update, mesh, rules, perms, packer, lanes, compile_ahead=o.compile_ahead)


def _row_counts(mask_MxbxN, shares) -> dict[str, jax.Array]:
  """The rows with loss tokens the noise scale's two gradients were measured on."""
  rows = jnp.sum(jnp.any(mask_MxbxN, axis=-1), axis=-1).astype(jnp.float32)  # [M]
  used = shares > 0
  n_used = jnp.sum(used)
  inv = jnp.sum(jnp.where(used, 1.0 / jnp.maximum(rows, 1.0), 0.0)) / jnp.maximum(n_used, 1)
  return {"noise/rows_big": jnp.sum(rows), "noise/inv_rows_small": inv,
          "noise/micro_used": n_used.astype(jnp.float32)}


class Update:
  """`update` jitted with explicit shardings on its first call; the state is donated.

  State shardings are read off the first state it sees (parameters as created, optimizer
  moments alongside them); the batch is sharded over the batch axes; metrics are replicated.
  `traces` counts compilations: 1 for the whole run, or with packing (rl/packing.py) one per
  bucket of packed rows the run met (at most packing.BUCKETS), none after those.
  """

  def __init__(self, fn, mesh: Mesh, rules: sharding.Rules, perms=None,
               packer: packing.Packer | None = None, lanes=None, compile_ahead: bool = False):
    """`lanes` (rlscale/parallel/lanes.py): runs side by side; the state, the batch, the key
    and `hyper` carry the lane axis, and each lane's device runs `fn` as its run alone would."""
    self._fn, self.mesh, self.rules = fn, mesh, rules
    self._perms, self.packer, self.lanes = perms, packer, lanes
    self._jitted = None
    self._orders: dict[int, Any] = {}  # rows -> the jitted row orders
    self._host = _HostPlan(mesh, rules, lanes)
    self.traces = 0
    self.packed_rows: int | None = None  # the last update's packed rows per shard, None unpacked
    # train.compile_buckets (packing.compile_ahead): every bucket's program, and the unpacked
    # one, compiled at the first update instead of when each is first met.
    self.compile_ahead = compile_ahead

  def state_shardings(self, state: TrainState):
    rep = sharding.replicated(self.mesh)
    return jax.tree.map(
        lambda x: x.sharding if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
        else rep, state)

  def place(self, state: TrainState) -> TrainState:
    """Put a freshly built or restored state on the shardings the update expects."""
    return jax.device_put(state, self.state_shardings(state))

  def _plan(self, batch: SequenceBatch, key, by_group: bool):
    """(each epoch's row order [E, B], replicated; the step's packing or None, each batch
    shard's part on its own devices)."""
    rep = sharding.replicated(self.mesh)
    lanes = self.lanes
    rows = batch.tokens.shape[0 if lanes is None else 1]
    if rows not in self._orders:
      orders = lambda k, g: self._perms(k, g)(rows)
      self._orders[rows] = (jax.jit(orders, in_shardings=(rep, rep), out_shardings=rep)
                            if lanes is None else lanes.map(orders, (True, False), name="perms"))
    perms = self._orders[rows](key, jnp.asarray(by_group))
    if self.packer is None:
      return perms, None
    packs = self._host.plan(self.packer, batch.resp_mask, perms)
    self.packed_rows = None if packs is None else packs.src.shape[-2]
    return perms, packs

  def __call__(self, state: TrainState, batch: SequenceBatch, key, by_group: bool = False,
               demos: SequenceBatch | None = None, lr_scale: float | None = None,
               hyper: dict[str, Any] | None = None):
    """One update; `demos` are the PPO-ptx rows of its optimizer steps (make_update's `ptx`);
    `lr_scale` multiplies its updates (given on every call of a run, or on none); `hyper`: the
    scalars make_update's optimizer and loss take as arguments (on every call, or on none)."""
    if self.lanes is not None:
      return self._lanes_call(state, batch, key, by_group, demos, lr_scale, hyper)
    shard = lambda tree: jax.tree.map(
        lambda x: sharding.batch_sharding(self.mesh, x.ndim, self.rules), tree)
    batch_sh, demos_sh = shard(batch), shard(demos)
    batch = jax.device_put(batch, batch_sh)  # a no-op for rows already on the batch axes
    perms, packs = self._plan(batch, key, by_group)
    scale = None if lr_scale is None else jnp.asarray(lr_scale, jnp.float32)
    if hyper is not None:
      hyper = {k: np.asarray(v, np.float32) for k, v in hyper.items()}
    if self._jitted is None:
      state_sh = self.state_shardings(state)
      rep = sharding.replicated(self.mesh)

      def counted(*args):
        self.traces += 1
        return self._fn(*args)

      rules = self.rules or dict(sharding.DEFAULT_RULES)
      # The plan's arrays [E, M, m, S, ...]: axis S over the batch axes (a prefix of each).
      packs_sh = NamedSharding(self.mesh, sharding.logical_to_spec(
          (None, None, None, "batch"), None, self.mesh, rules))
      self._jitted = jax.jit(counted, donate_argnums=0,
                             in_shardings=(state_sh, batch_sh, rep, demos_sh, packs_sh, rep, rep),
                             out_shardings=(state_sh, rep))
      if self.compile_ahead and self.packer is not None:
        self._compile_buckets(state, batch, perms, demos, scale, hyper)
    return self._jitted(state, batch, perms, demos, packs, scale, hyper)

  def _compile_buckets(self, state, batch, perms, demos, scale, hyper) -> None:
    """Compile the update of every bucket of packed rows and the unpacked one, before the
    first update runs: a call of those shapes then runs what jit kept (nothing traced)."""
    t = time.time()
    width = batch.resp_mask.shape[-1] - 1
    shapes = [None] + ([] if width < 1 else
                       [self._host.place(self.packer.blank(perms.shape, width, r), 3)
                        for r in self.packer.buckets()])
    for packs in shapes:
      self._jitted.lower(state, batch, perms, demos, packs, scale, hyper).compile()
    logging.info("compiled the update of %d buckets of packed rows and the unpacked one ahead "
                 "(train.compile_buckets) in %.1f s", len(shapes) - 1, time.time() - t)

  def _lanes_call(self, state, batch, key, by_group, demos, lr_scale, hyper):
    """One update of every lane (runs side by side): `state`, `batch`, `key` and `hyper`
    carry the lane axis."""
    if demos is not None or lr_scale is not None:
      raise ValueError("runs side by side take neither PPO-ptx rows nor a per-step lr scale")
    perms, packs = self._plan(batch, key, by_group)
    if self._jitted is None:
      def counted(*args):
        self.traces += 1
        return self._fn(*args)
      self._jitted = self.lanes.map(counted, (True, True, True, True, True, False, True),
                                    donate=(0,), name="update")
    return self._jitted(state, batch, perms, None, packs, None, hyper)  # hyper: [lanes] each

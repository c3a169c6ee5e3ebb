"""Sampling responses on the mesh: jitted prefill of left-padded prompts, then a KV-cache loop.

`Sampler` compiles one call for one (batch, prompt length) shape; `generate` runs a larger
batch in calls of `generation_batch` rows. The loop stops when every row has produced an EOS
or the token budget is spent.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from rlscale.parallel import distributed
from rlscale.parallel import sharding
from rlscale.models.layers import c, rms_norm
from rlscale.sampling import kv_cache
from rlscale.sampling.sample import SamplingParams, is_eos, row_keys, row_uniforms, sample


class Rollout(NamedTuple):
  tokens: jax.Array  # [B, N] int32, pad_id after a row's end
  logprobs: jax.Array  # [B, N] float32, log p under the policy at temperature 1; 0 off the mask
  sample_logprobs: jax.Array  # [B, N] float32, log p under the sampling distribution
  mask: jax.Array  # [B, N] bool, the generated tokens (EOS included)
  lengths: jax.Array  # [B] int32
  steps: jax.Array  # [] int32, tokens the loop sampled per row: < N when every row ended early


class Cache(NamedTuple):
  """Every layer's prompt segment and generation chunks (see kv_cache)."""
  prompt: list[kv_cache.Segment]
  chunks: list[list[kv_cache.Segment]]


class Sampler:
  """Compiled sampling for one policy graph and one set of sampling settings.

  The KV cache is an argument of the compiled call, donated and handed back, so repeated
  calls of one shape reuse the same buffers instead of allocating and faulting in new ones.
  `release()` frees them (e.g. before a memory-hungry update).
  """

  def __init__(self, graphdef: nnx.GraphDef, params: SamplingParams, mesh: Mesh,
               rules: sharding.Rules | None = None, lanes=None):
    """`lanes` (rlscale/parallel/lanes.py): runs side by side, each lane on a device of its
    own (`mesh` then describes one lane's); the state, the key and every output carry the
    lane axis, the prompts are the lanes' common ones."""
    self.graphdef = graphdef
    self.params = params
    self.mesh = mesh
    self.rules = rules or sharding.rules_from_config(None)
    self.lanes = lanes
    self.traces = 0  # how many times the call was traced (a retrace guard for tests)
    self._caches: dict[tuple[int, int], Cache] = {}
    b1, b2 = sharding.batch_sharding(mesh, 1, self.rules), sharding.batch_sharding(mesh, 2, self.rules)
    self._rollout_shardings = Rollout(b2, b2, b2, b2, b1, sharding.replicated(mesh))
    self._calls: dict[tuple[tuple[int, int], int], Any] = {}  # by (shape, group_size)

  def __call__(self, state: nnx.State, tokens_BxP, mask_BxP, key: jax.Array,
               row_ids=None, group_size: int = 1, active=None) -> Rollout:
    """Sample for every row; row r's randomness is `key` folded with row_ids[r].

    Tokens, mask and row_ids are this process's rows (all rows when there is one process);
    row_ids default to the rows' global indices. With `group_size` g > 1 the rows come in runs
    of g copies of one prompt, and the prefill runs once per run (see `generate`, which checks
    that they do): 1/g of its work, the same samples. `active` (lanes only, [lanes] bool):
    the lanes that decode; an inactive lane's device computes nothing and its rows are padding
    (a lane's evaluation that settled before the others').
    """
    local = np.shape(tokens_BxP)[0]
    shards = sharding.batch_divisor(self.mesh, self.rules)
    if (local * jax.process_count()) % shards:
      raise ValueError(f"{local * jax.process_count()} rows do not split over the mesh's {shards} "
                       "batch shards; generate() pads them")
    if row_ids is None:
      row_ids = np.arange(local, dtype=np.int32) + jax.process_index() * local
    if self.lanes is not None:  # every lane decodes the same prompts
      tokens_BxP, mask_BxP, row_ids = self.lanes.replicate(
          (np.asarray(tokens_BxP), np.asarray(mask_BxP), np.asarray(row_ids, np.int32)))
    else:
      tokens_BxP = sharding.put_batch(tokens_BxP, self.mesh, self.rules)
      mask_BxP = sharding.put_batch(mask_BxP, self.mesh, self.rules)
      row_ids = sharding.put_batch(np.asarray(row_ids, np.int32), self.mesh, self.rules)
    shape = tuple(tokens_BxP.shape)  # global
    call, new_cache = self.call_for(state, shape, group_size)
    if shape not in self._caches:
      self._caches[shape] = new_cache()
    lane_args = () if self.lanes is None else (
        np.ones(self.lanes.n, bool) if active is None else np.asarray(active, bool),)
    rollout, self._caches[shape] = call(state, self._caches.pop(shape), tokens_BxP, mask_BxP,
                                        key, row_ids, *lane_args)
    return rollout

  def call_for(self, state: nnx.State, shape: tuple[int, int], group_size: int = 1):
    """The jitted call for `shape` (global rows, prompt tokens) and its cache's maker, made
    once per (shape, group_size); `state` (arrays or ShapeDtypeStructs) gives the model's
    config. memory_fit lowers the call abstractly to size it; a later call of that shape
    reuses what it compiled."""
    if (shape, group_size) not in self._calls:
      cfg = nnx.merge(self.graphdef, state).cfg
      logging.info("sampler: compiling for %d rows x %d prompt tokens%s", *shape,
                   f", each run of {group_size} copies of a prompt prefilled once"
                   if group_size > 1 else "")
      shards = sharding.batch_divisor(self.mesh, self.rules)
      if self.lanes is not None:
        self._calls[shape, group_size] = self._lane_call(cfg, shape, group_size)
        return self._calls[shape, group_size]
      cache_shardings = self._cache_shardings(_cache_shapes(cfg, self.params, *shape, shards))
      run = functools.partial(self._run, group=group_size)
      # keep_unused: _decode reads only the cache's shapes, and jit drops an argument it never
      # reads, donation included; kept, XLA writes the new cache into the donated one.
      self._calls[shape, group_size] = (
          jax.jit(run, donate_argnums=1, keep_unused=True,
                  out_shardings=(self._rollout_shardings, cache_shardings)),
          jax.jit(lambda: _empty_cache(cfg, self.params, *shape, shards),
                  out_shardings=cache_shardings))
    return self._calls[shape, group_size]

  def _lane_call(self, cfg, shape: tuple[int, int], group: int):
    """The call mapped over the lanes (each lane's decode as it runs alone, on its device),
    and the maker of the lanes' caches."""
    lanes = self.lanes

    def run(state, cache, tokens_BxP, mask_BxP, key, row_ids, active):
      self.traces += 1

      def go():
        return _decode(nnx.merge(self.graphdef, state), self.params, cache, tokens_BxP,
                       mask_BxP.astype(bool), key, row_ids, group)

      def skip():  # shapes only: the cache as it was, rows of padding
        rollout = jax.eval_shape(go)[0]
        return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), rollout), cache

      return jax.lax.cond(active, go, skip)

    def caches():
      one = _empty_cache(cfg, self.params, *shape)
      return jax.tree.map(lambda x: jnp.broadcast_to(x, (lanes.n,) + x.shape), one)

    return (lanes.map(run, (True, True, False, False, True, False, True), donate=(1,),
                      name="decode"),
            jax.jit(caches, out_shardings=lanes.sharding))

  def abstract_args(self, state: nnx.State, shape: tuple[int, int]) -> tuple:
    """The arguments of `call_for(state, shape)[0]` as ShapeDtypeStructs with the shardings
    the call is given (`state` as passed, e.g. already abstract): lowering with them compiles
    the call that a real one of `shape` runs, and allocates nothing (memory_fit)."""
    shapes = _cache_shapes(nnx.merge(self.graphdef, state).cfg, self.params, *shape,
                           sharding.batch_divisor(self.mesh, self.rules))
    cache = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                         shapes, self._cache_shardings(shapes))
    b1, b2 = (sharding.batch_sharding(self.mesh, n, self.rules) for n in (1, 2))
    return (state, cache, jax.ShapeDtypeStruct(shape, np.int32, sharding=b2),
            jax.ShapeDtypeStruct(shape, np.bool_, sharding=b2),
            jax.eval_shape(lambda: jax.random.key(0)),
            jax.ShapeDtypeStruct(shape[:1], np.int32, sharding=b1))

  def release(self) -> None:
    """Free the KV caches; the next call allocates them again (it does not recompile)."""
    self._caches.clear()

  def _cache_shardings(self, shapes: "Cache"):
    return jax.tree.map(
        lambda s: sharding.named_sharding(("batch", "act_kv_heads", None, None), s.shape,
                                          self.mesh, self.rules), shapes)

  def _run(self, state, cache, tokens_BxP, mask_BxP, key, row_ids, group: int = 1):
    self.traces += 1
    with sharding.activation_sharding(self.mesh, self.rules):
      return _decode(nnx.merge(self.graphdef, state), self.params, cache, tokens_BxP,
                     mask_BxP.astype(bool), key, row_ids, group)


def _cache_shapes(cfg, p: SamplingParams, batch: int, prompt_len: int, shards: int = 1) -> Cache:
  return jax.eval_shape(lambda: _empty_cache(cfg, p, batch, prompt_len, shards))


def _empty_cache(cfg, p: SamplingParams, batch: int, prompt_len: int, shards: int = 1) -> Cache:
  """The KV cache of a call of `batch` rows over `shards` batch shards (the chunk's slots
  follow the rows per device under decode_chunk='auto')."""
  slots = p.max_new_tokens - 1
  chunk = kv_cache.chunk_size(slots, p.decode_chunk, batch // max(shards, 1))
  n = kv_cache.num_chunks(slots, chunk) if slots else 0
  kvh, d, dt = cfg.num_kv_heads, cfg.head_dim, cfg.compute_dtype
  return Cache([kv_cache.empty_chunk(batch, kvh, d, prompt_len, dt) for _ in range(cfg.num_layers)],
               [[kv_cache.empty_chunk(batch, kvh, d, chunk, dt) for _ in range(n)]
                for _ in range(cfg.num_layers)])


def _pick(logits, u_BxN, step, done, p: SamplingParams):
  """Row r's token of step `step` from its uniform u[r, step]; padding once a row is done."""
  u = jax.lax.dynamic_index_in_dim(u_BxN, step, axis=1, keepdims=False)
  tok, lp, slp = sample(logits, u, p)
  tok = jnp.where(done, p.pad_id, tok)
  return tok, jnp.where(done, 0.0, lp), jnp.where(done, 0.0, slp)


def _record(out, step, tok, lp, slp, done):
  """Write step `step`'s column of (tokens, log-probs, sampler log-probs, live)."""
  toks, lps, slps, live = out
  at = (jnp.zeros((), jnp.int32), step)
  toks = jax.lax.dynamic_update_slice(toks, tok[:, None], at)
  lps = jax.lax.dynamic_update_slice(lps, lp[:, None], at)
  slps = jax.lax.dynamic_update_slice(slps, slp[:, None], at)
  live = jax.lax.dynamic_update_slice(live, (~done)[:, None], at)
  return toks, lps, slps, live


def _chunk_step(policy, p: SamplingParams, prompt, mask_BxP, start_pos, tables, u_BxN,
                chunk: int, j: int):
  """The while_loop body of chunk j: step i feeds token i-1 into slot i-1, samples token i."""
  cfg, decoder = policy.cfg, policy.model
  cos_table, sin_table = tables
  slot_ids = jnp.arange(chunk, dtype=jnp.int32)

  def body(carry):
    i, tok, done, out, chunks = carry
    slot = i - 1
    offset = slot - j * chunk
    pos = start_pos + slot
    cos, sin = cos_table[pos], sin_table[pos]
    valid = [mask_BxP] + [jnp.ones((1, chunk), bool)] * j + [(slot_ids <= offset)[None]]
    x = decoder.embed_tokens(tok)
    new_chunks = []
    for layer, pseg, segs in zip(decoder.layers, prompt, chunks):
      q, k, v = layer.project_qkv(rms_norm(x, layer.attn_norm[...], cfg.rms_eps), cos, sin)
      segs = segs[:-1] + [kv_cache.write(segs[-1], offset, k, v)]
      x = x + layer.attn_out(kv_cache.attend(q, [pseg] + segs, valid))
      x = x + layer.mlp(rms_norm(x, layer.mlp_norm[...], cfg.rms_eps))
      new_chunks.append(segs)
    tok, lp, slp = _pick(policy.logits(decoder.final(x)), u_BxN, i, done, p)
    out = _record(out, i, tok, lp, slp, done)
    return i + 1, tok, done | is_eos(tok, p.eos_ids), out, new_chunks

  return body


def _prefill(decoder, tokens_BxP, mask_BxP, group: int):
  """The prefill's last hidden state and every layer's keys and values; with `group` g > 1,
  computed for the first row of each run of g (identical) rows and repeated."""
  if group == 1:
    return decoder.prefill(tokens_BxP, mask_BxP)
  first = lambda x: x.reshape((-1, group) + x.shape[1:])[:, 0]
  repeat = lambda x: c(jnp.repeat(x, group, axis=0))
  hidden, kvs = decoder.prefill(first(tokens_BxP), first(mask_BxP))
  return repeat(hidden), [(repeat(k), repeat(v)) for k, v in kvs]


def _decode(policy, p: SamplingParams, cache: Cache, tokens_BxP, mask_BxP, key, row_ids,
            group: int = 1):
  cfg = policy.cfg
  decoder = policy.model
  b, plen = tokens_BxP.shape
  n = p.max_new_tokens
  u_BxN = row_uniforms(row_keys(key, row_ids), n)  # row r samples step i with u[r, i]

  hidden, kvs = _prefill(decoder, tokens_BxP, mask_BxP, group)
  prompt = [kv_cache.prompt_segment(k, v) for k, v in kvs]
  # Rotary tables for every position a generated token can take.
  tables = decoder.rope(jnp.arange(plen + n, dtype=jnp.int32))
  start_pos = jnp.sum(mask_BxP, axis=-1, dtype=jnp.int32)

  out = (jnp.full((b, n), p.pad_id, jnp.int32), jnp.zeros((b, n), jnp.float32),
         jnp.zeros((b, n), jnp.float32), jnp.zeros((b, n), bool))
  no = jnp.zeros((b,), bool)
  tok, lp, slp = _pick(policy.logits(hidden), u_BxN, jnp.zeros((), jnp.int32), no, p)
  out = _record(out, 0, tok, lp, slp, no)
  done = is_eos(tok, p.eos_ids)
  steps = jnp.where(jnp.all(done), 1, n).astype(jnp.int32)  # tokens sampled per row until all end

  # Generated tokens go into chunks of KV-cache slots, one while_loop each; attention reads
  # only the chunks written so far.
  slots = n - 1
  all_chunks = [[kv_cache.clear(s) for s in layer] for layer in cache.chunks]
  chunk = all_chunks[0][0].v_BxKxTxD.shape[2] if slots else 1
  live_chunks: list[list[kv_cache.Segment]] = [[] for _ in range(cfg.num_layers)]
  for j in range(len(all_chunks[0])):
    for layer, mine in zip(live_chunks, all_chunks):
      layer.append(mine[j])
    end = min((j + 1) * chunk, slots) + 1
    body = _chunk_step(policy, p, prompt, mask_BxP, start_pos, tables, u_BxN, chunk, j)

    def cond(carry, end=end):
      return (carry[0] < end) & ~jnp.all(carry[2])

    start = jnp.asarray(j * chunk + 1, jnp.int32)
    i, tok, done, out, live_chunks = jax.lax.while_loop(cond, body,
                                                        (start, tok, done, out, live_chunks))
    steps = jnp.where(jnp.all(done) & (steps == n), i, steps)

  toks, lps, slps, live = out
  rollout = Rollout(toks, lps, slps, live, jnp.sum(live, axis=-1, dtype=jnp.int32), steps)
  return rollout, Cache(prompt, live_chunks)


def generate(sampler: Sampler, state: nnx.State, tokens_BxP: np.ndarray, mask_BxP: np.ndarray,
             key: jax.Array, generation_batch: int | None = None,
             group_size: int = 1, row_ids: np.ndarray | None = None, active=None) -> Rollout:
  """Sample for all rows, `generation_batch` rows per compiled call.

  Every call has the same number of rows, a multiple of the mesh's batch shards: a short last
  call, or a generation batch the shards do not divide, is padded with copies of the call's
  first row, dropped after. On several processes the arguments are this process's rows and
  `generation_batch` counts rows over all processes; a row's sample depends only on `key` and
  its global index, not on the generation batch, the mesh or the number of processes.

  `group_size` G says that the rows come in runs of G copies of one prompt (an RL step's
  groups); a call then prefills each prompt once, where its rows hold whole groups and each
  batch shard holds whole groups (`shared_prefill`). Rows of a run that differ are an error.
  `row_ids`: this process's rows' global indices, when they are not its contiguous share of
  the batch (an evaluation in stages: rlscale/trainer/evaluation.py); `active`: the lanes that
  decode (Sampler.__call__).
  """
  tokens_BxP, mask_BxP = np.asarray(tokens_BxP, np.int32), np.asarray(mask_BxP, bool)
  local = tokens_BxP.shape[0]
  procs = jax.process_count()
  gb = min(generation_batch or local * procs, local * procs)  # never pad past the batch
  if gb % procs:
    raise ValueError(f"generation_batch={gb} does not split over {procs} processes")
  take = gb // procs  # this process's rows per call
  shards = sharding.batch_divisor(sampler.mesh, sampler.rules)
  unit = math.lcm(shards, procs)
  per_call = -(-gb // unit) * unit // procs  # the same, padded to split over the batch shards
  first = jax.process_index() * local
  group = shared_prefill(group_size, take, per_call * procs, shards)
  axis = 0 if sampler.lanes is None else 1  # the rows' axis (runs side by side: lanes first)
  cut = lambda x, n: x[:n] if axis == 0 else x[:, :n]
  parts = []
  for start in range(0, local, take):
    toks, mask = tokens_BxP[start:start + take], mask_BxP[start:start + take]
    ids = (np.arange(first + start, first + start + toks.shape[0], dtype=np.int32)
           if row_ids is None else np.asarray(row_ids[start:start + take], np.int32))
    rows = toks.shape[0]
    if rows < per_call:  # copies of a row sample what it samples, and end when it ends
      pad = per_call - rows
      toks = np.concatenate([toks, np.repeat(toks[:1], pad, 0)])
      mask = np.concatenate([mask, np.repeat(mask[:1], pad, 0)])
      ids = np.concatenate([ids, np.repeat(ids[:1], pad)])
    g = group if rows == per_call else 1  # a padded call does not hold whole groups
    if g > 1:
      _check_groups(toks, mask, g)
    out = sampler(state, toks, mask, key, ids, g, active)
    parts.append(out if rows == per_call
                 else out._replace(**{f: cut(getattr(out, f), rows) for f in _ROWS}))
  if len(parts) == 1:
    return parts[0]
  return Rollout(*(_concat_rows([getattr(p, f) for p in parts], sampler, axis) for f in _ROWS),
                 steps=jnp.max(jnp.stack([p.steps for p in parts]), axis=0))


def shared_prefill(group_size: int, rows: int, call_rows: int, shards: int) -> int:
  """The run length a call of `call_rows` rows (this process's `rows` of them) prefills once:
  `group_size` when the process's rows and every batch shard's rows of the call hold whole
  groups (so that repeating the prefill's output stays within the shard), else 1."""
  if group_size > 1 and rows % group_size == 0 and (call_rows // shards) % group_size == 0:
    return group_size
  return 1


def _check_groups(tokens_BxP: np.ndarray, mask_BxP: np.ndarray, g: int) -> None:
  for name, x in (("tokens", tokens_BxP), ("mask", mask_BxP)):
    runs = x.reshape((-1, g) + x.shape[1:])
    if not np.array_equal(runs, np.repeat(runs[:, :1], g, axis=1)):
      raise ValueError(f"generate(group_size={g}): the prompt {name} of a run of {g} rows differ")


def _concat_rows(arrays: list[jax.Array], sampler: Sampler, axis: int = 0) -> jax.Array:
  """Concatenate batch-sharded arrays so that each process's rows stay its own (lanes: along
  the rows' axis 1, one process)."""
  if jax.process_count() == 1:
    return jnp.concatenate(arrays, axis=axis)
  local = np.concatenate([distributed.host_local(a) for a in arrays])
  return sharding.put_batch(local, sampler.mesh, sampler.rules)


_ROWS = ("tokens", "logprobs", "sample_logprobs", "mask", "lengths")

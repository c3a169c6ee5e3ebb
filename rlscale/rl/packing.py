"""No compute on padding: each micro-batch's responses packed into fewer rows of the same length.

Shared-prompt training (models/shared_prompt.py) runs a micro-batch as a prompt stream, one row
per group, and a response stream of the response inputs, [b, n - 1], padded after each
response's end. Here the response stream is packed instead: on each batch shard, each group's
responses are laid into rows of `n - 1` slots (first-fit decreasing within the group), a
packed row holding responses of one group only (its queries see that group's prompt keys); a
response never crosses rows, and attention stays within its own response (a segment mask).
A response needs its inputs up to the one that predicts its last loss token (`input_lengths`):
what comes after carries no loss and is not computed. The loss sees the per-row layout as
before ([b, N], unpacked), so every loss aggregation gives the numbers of the padded update.

The rows are shuffled as before (the permutation is drawn first, then packed: micro-batches
keep their random composition, and the noise-scale estimates stay unbiased). The packed row
count per shard is rounded up to one of `BUCKETS` eighths of the unpacked rows, the largest
micro-batch of the step deciding; a step whose bucket would be all eight runs unpacked. At most
eight compiled updates per model, whatever the lengths (`Update.traces` says how many).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rlscale.models.packed_rows import Packing

BUCKETS = 8  # packed rows per shard: k/8 of the unpacked rows, k = 1 .. 7 (8: unpacked)
# train.compile_buckets='auto' compiles every bucket's update at the first update from this many
# steps on: a long run's host memory is then set in its first step, not raised by each bucket
# the run first meets later (one compiled program each, tens of MB of host memory on a CPU).
AHEAD_FROM_STEPS = 1000


def compile_ahead(choice: str, num_steps: int) -> bool:
  """train.compile_buckets resolved: whether every bucket's update compiles at the first one."""
  return choice == "ahead" or (choice == "auto" and num_steps >= AHEAD_FROM_STEPS)


def input_lengths(resp_mask_BxN: jax.Array) -> jax.Array:
  """The response inputs each row needs: the index of its last loss token (input j predicts
  token j + 1; token 0 is predicted by the prompt's last position), 0 without one."""
  n = resp_mask_BxN.shape[-1]
  return jnp.max(jnp.where(resp_mask_BxN, jnp.arange(n), 0), axis=-1).astype(jnp.int32)


def computed(resp_mask_bxN: jax.Array) -> jax.Array:
  """[b, N] bool: the response positions a packed forward computes (token 0 and every token up
  to the row's last loss token); 0 elsewhere, in whichever forward packed: an update may run
  padded in a step whose old or reference log-probs were packed, or the other way round."""
  n = resp_mask_bxN.shape[-1]
  return jnp.arange(n)[None] <= input_lengths(resp_mask_bxN)[:, None]


def neutral(inputs, done_bxN: jax.Array):
  """A loss's inputs (TokenInputs, ValueInputs) with every float per-token array 0 where
  nothing was computed: those positions carry no loss weight, and 0 keeps them finite (a
  log-ratio of 0 instead of 0 minus an old log-prob of a padding token)."""
  def fix(x):
    if (isinstance(x, jax.Array) and x.shape == done_bxN.shape
        and jnp.issubdtype(x.dtype, jnp.floating)):
      return jnp.where(done_bxN, x, jnp.zeros((), x.dtype))
    return x
  return jax.tree.map(fix, inputs)


class Packer:
  """Plans each update's packing on the host from the rows' lengths and the update's
  shuffles (the same for every process: both come replicated)."""

  def __init__(self, *, num_epochs: int, num_minibatches: int, microbatch: int, shards: int,
               group: int):
    if microbatch % (group * shards):
      raise ValueError(f"packing needs micro-batches of whole groups of {group} on each of "
                       f"{shards} batch shards (microbatch {microbatch})")
    self.epochs, self.minibatches, self.micro = num_epochs, num_minibatches, microbatch
    self.shards, self.group = shards, group
    self.rows = microbatch // shards  # unpacked rows per shard

  def buckets(self) -> list[int]:
    """The packed rows per shard a step may take (each a compiled shape)."""
    return sorted({max(1, math.ceil(self.rows * k / BUCKETS)) for k in range(1, BUCKETS)}
                  - {self.rows})

  def blank(self, perms_shape: tuple[int, int], width: int, rows: int) -> Packing:
    """A packing into `rows` packed rows per shard with every slot empty, of the shapes `plan`
    gives for perms of `perms_shape` [E, B]: what compiling that bucket's update needs."""
    e, b = perms_shape
    lead = (e, self.minibatches, b // self.minibatches // self.micro, self.shards)
    empty = lambda shape: np.full(shape, -1, np.int32)
    return Packing(empty(lead + (rows, width)), empty(lead + (self.rows, width)),
                   np.zeros(lead + (rows,), np.int32))

  def _slots(self, lengths: np.ndarray, perms: np.ndarray, width: int):
    e, b = perms.shape
    lens = np.minimum(np.asarray(lengths)[np.asarray(perms)], width)
    shape = (e, self.minibatches, b // self.minibatches // self.micro, self.shards,
             self.rows // self.group, self.group)
    lens = lens.reshape(shape)
    return shape, [_first_fit(cell, width) for cell in lens.reshape((-1,) + shape[-2:])]

  def need(self, lengths: np.ndarray, perms: np.ndarray, width: int) -> int:
    """The packed rows per shard the fullest micro-batch of the step takes (`plan`'s
    arguments); the unpacked rows when nothing is packed (responses of one token)."""
    if width < 1:
      return self.rows
    return max(len(rows) for _, rows in self._slots(lengths, perms, width)[1])

  def plan(self, lengths: np.ndarray, perms: np.ndarray, width: int,
           at_least: int = 0) -> Packing | None:
    """The step's packing, arrays [E, M, m, S, ...] (epochs, mini-batches, micro-batches),
    or None when no bucket holds the fullest micro-batch (the update runs unpacked).
    `lengths` [B] from input_lengths, `perms` [E, B] the epochs' row orders, `width` n - 1;
    `at_least`: the smallest bucket to use (runs side by side share one: the largest `need`
    of their steps)."""
    if width < 1:  # responses of one token: no response position is an input
      return None
    shape, slots = self._slots(lengths, perms, width)
    need = max([len(rows) for _, rows in slots] + [at_least])
    fits = [r for r in self.buckets() if r >= need]
    if not fits:
      return None
    r = fits[0]
    flat = len(slots)
    src = np.full((flat, r, width), -1, np.int32)
    back = np.full((flat, self.rows, width), -1, np.int32)
    row_group = np.zeros((flat, r), np.int32)
    for i, (placed, rows) in enumerate(slots):
      row_group[i, :len(rows)] = rows
      for row, (k, start, n) in enumerate(placed):
        src[i, k, start:start + n] = row * width + np.arange(n)
        back[i, row, :n] = k * width + start + np.arange(n)
    lead = shape[:4]
    return Packing(src.reshape(lead + (r, width)), back.reshape(lead + (self.rows, width)),
                   row_group.reshape(lead + (r,)))


def _first_fit(lens_gxG: np.ndarray, width: int):
  """One shard's micro-batch: for each row (group-major) its (packed row, start, length), and
  each packed row's group. Each group is packed on rows of its own, first-fit decreasing: its
  responses longest first, each on the first of the group's rows with room, else on a new
  one; one without inputs takes no slot."""
  placed, rows = [None] * lens_gxG.size, []
  for g, lens in enumerate(lens_gxG):
    first, fill = len(rows), []
    for i in np.argsort(-lens, kind="stable"):
      n = int(lens[i])
      k = next((k for k, f in enumerate(fill) if f + n <= width), None) if n else 0
      if n and k is None:
        k = len(fill)
        fill.append(0)
        rows.append(g)
      placed[g * len(lens) + i] = (first + k, fill[k] if n else 0, n)
      if n:
        fill[k] += n
  return placed, rows

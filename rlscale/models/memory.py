"""Memory of the training forward: log-probs over vocabulary chunks, block rematerialization.

With Qwen's 151,936-token vocabulary the float32 logits of one micro-batch, [b, N, V], are the
largest tensor of a training pass (4.9 GB for 8 rows of 1024 tokens), and the backward pass
keeps them and their gradient. `logprobs_and_entropy` with a chunk computes log p(target) and
the entropy of the full softmax by an online log-sum-exp over chunks of the vocabulary: a scan
over chunks whose body is rematerialized, so that neither pass holds more than one chunk's
[b, N, chunk] logits. `train.logprob_chunk` = 0 keeps the whole-vocabulary computation.

`train.remat` rematerializes each decoder block of the training forward (REMAT_POLICIES):
  none  keep every activation the backward pass reads (fastest, most memory);
  full  keep only each block's input and recompute the block in the backward pass (one extra
        forward; activations of one block at a time);
  dots  keep the outputs of the matmuls without batch dimensions
        (jax.checkpoint_policies.dots_with_no_batch_dims_saveable): the projections q/k/v, o,
        gate, up and down, which are 2-D matmuls here (layers.dense), are kept, while the
        attention einsums, whose batch dimensions (rows, KV heads) exclude them, and every
        elementwise op are recomputed. Attention's float32 scores are the only activations
        that grow with the sequence length squared, and recomputing them costs two einsums;
        the projections are most of the FLOPs, so keeping them saves most of the extra forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rlscale.models.layers import c, dense
from rlscale.parallel.sharding import constrain

NEG_INF = float(np.finfo(np.float32).min)

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat_policy(name: str):
  """The jax.checkpoint policy of `train.remat`; ValueError naming the field if unknown."""
  if name not in REMAT_POLICIES:
    raise ValueError(f"train.remat={name!r}; known: {', '.join(REMAT_POLICIES)}")
  return REMAT_POLICIES[name]


def remat(fn, policy):
  """`fn` rematerialized under `policy`: jax.checkpoint's residuals are all the backward pass
  keeps, and the recomputation runs in the backward pass.

  jax.checkpoint alone does not do that on XLA's CPU pipeline: it drops the optimization
  barriers that keep the recomputation apart, and a later CSE merges the recomputed ops with
  the forward's, which then stay live (measured: the same temporary bytes and the same number
  of dots as without remat). Here the residuals enter the backward computation through a data
  dependency on the cotangent (each floating residual + 0 x ct[0]), which no CSE can merge and
  which schedules the recomputation after the cotangent exists; elsewhere it costs one
  elementwise add per residual.
  """
  ckpt = jax.checkpoint(fn, policy=policy)

  @jax.custom_vjp
  def run(*args):
    return fn(*args)

  def fwd(*args):
    return jax.vjp(ckpt, *args)  # (output, the pullback: a pytree of the residuals)

  def bwd(pullback, ct):
    zero = jnp.ravel(jax.tree.leaves(ct)[0])[0] * 0
    leaves, tree = jax.tree.flatten(pullback)
    leaves = [x + zero.astype(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x
              for x in leaves]
    return jax.tree.unflatten(tree, leaves)(ct)

  run.defvjp(fwd, bwd)
  return run


def logprobs_and_entropy(hidden_BxNxE: jax.Array, head: jax.Array, targets_BxN: jax.Array,
                         chunk: int = 0, vocab_first: bool = False):
  """float32 log p(target) and entropy of softmax(hidden @ head), [B, N] each.

  `head` is [E, V], or [V, E] with `vocab_first` (a tied embedding), in the compute dtype;
  the logits are float32 whatever the activations' dtype. `chunk` > 0: columns per chunk of
  the online log-sum-exp (no [B, N, V] tensor in either pass); 0, or a chunk that holds the
  whole vocabulary: the whole vocabulary at once (one chunk would hold as much, more slowly).
  """
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
    raise ValueError(f"train.logprob_chunk={chunk!r} must be an integer >= 0")
  if chunk == 0 or chunk >= head.shape[0 if vocab_first else 1]:
    return _whole(hidden_BxNxE, head.T if vocab_first else head, targets_BxN)
  return _chunked(hidden_BxNxE, head, targets_BxN, chunk, vocab_first)


def _whole(hidden_BxNxE, head_ExV, targets_BxN):
  logits_BxNxV = c(dense(hidden_BxNxE, head_ExV, preferred_element_type=jnp.float32),
                   "act_vocab")
  logp_BxNxV = jax.nn.log_softmax(logits_BxNxV, axis=-1)
  logp = jnp.take_along_axis(logp_BxNxV, targets_BxN[..., None], axis=-1)[..., 0]
  p = jnp.exp(logp_BxNxV)
  entropy = -jnp.sum(jnp.where(p > 0, p * logp_BxNxV, 0.0), axis=-1)
  return logp, entropy


def chunk_columns(v: int, chunk: int) -> int:
  """Columns per chunk: the largest divisor of V within [chunk / 2, chunk] when there is one
  (no padding: V=151,936 and chunk 8192 give 32 chunks of 4748), else `chunk`, V padded up to
  a multiple of it with masked columns."""
  for cols in range(min(chunk, v), max(chunk // 2, 1) - 1, -1):
    if v % cols == 0:
      return cols
  return chunk


def strided_chunks(head: jax.Array, chunk: int, vocab_first: bool):
  """The head padded to n x C columns and viewed as [E, C, n] ([C, n, E] when vocab_first),
  chunk i being [:, :, i]: columns i, i + n, i + 2n, ... Returns (view, n).

  Every n-th column rather than a contiguous block: a vocabulary axis sharded in contiguous
  blocks over `tensor` splits C where it split V, so every chunk has an equal share on each
  shard and each step of the scan keeps every tensor shard busy. The view is a reshape, not
  a copy (a padded V is one, with its gradient: 2 x 0.5 GiB for Qwen's float32 head, which
  `chunk_columns` avoids), and the chunk a strided slice of it.
  """
  v = head.shape[0 if vocab_first else 1]
  cols = chunk_columns(v, chunk)
  n = -(-v // cols)
  pad = [(0, n * cols - v), (0, 0)] if vocab_first else [(0, 0), (0, n * cols - v)]
  head = jnp.pad(head, pad)
  if vocab_first:
    return constrain(head.reshape(cols, n, -1), ("vocab", None, "embed")), n
  return constrain(head.reshape(-1, cols, n), ("embed", "vocab", None)), n


def _chunked(hidden_BxNxE, head, targets_BxN, chunk, vocab_first):
  """Online log-sum-exp: per row a running max m, s = sum exp(l - m), t = sum exp(l - m) l and
  the target's logit; lse = m + log s, entropy = lse - t / s. m is held out of the gradient
  (lse does not depend on it), so the gradient is exact."""
  v = head.shape[0 if vocab_first else 1]
  view, n = strided_chunks(head, chunk, vocab_first)
  cols = view.shape[0 if vocab_first else 1]
  offsets_C = jnp.arange(cols) * n
  e = hidden_BxNxE.shape[-1]
  flat_MxE = hidden_BxNxE.reshape(-1, e)  # one 2-D matmul per chunk (see layers.dense)

  def body(carry, i):
    m, s, t, target = carry
    w = jax.lax.dynamic_index_in_dim(view, i, axis=1 if vocab_first else 2, keepdims=False)
    w = constrain(w, ("vocab", None) if vocab_first else (None, "vocab"))
    dims = (((1,), (1,) if vocab_first else (0,)), ((), ()))
    logits = jax.lax.dot_general(flat_MxE, w, dims, preferred_element_type=jnp.float32)
    logits = c(logits.reshape(targets_BxN.shape + (cols,)), "act_vocab")
    col_C = offsets_C + i
    valid_C = col_C < v
    logits = jnp.where(valid_C, logits, NEG_INF)
    m_new = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(logits, axis=-1)))
    rescale = jnp.exp(m - m_new)
    p = jnp.where(valid_C, jnp.exp(logits - m_new[..., None]), 0.0)
    s = s * rescale + jnp.sum(p, axis=-1)
    t = t * rescale + jnp.sum(jnp.where(valid_C, p * logits, 0.0), axis=-1)
    hit = col_C == targets_BxN[..., None]
    target = target + jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
    return (m_new, s, t, target), None

  zeros = jnp.zeros(targets_BxN.shape, jnp.float32)
  init = (jnp.full(targets_BxN.shape, NEG_INF, jnp.float32), zeros, zeros, zeros)
  (m, s, t, target), _ = jax.lax.scan(jax.checkpoint(body), init, jnp.arange(n))
  lse = m + jnp.log(s)
  return target - lse, lse - t / s


def activation_bytes_per_token(cfg, seq_len: int, remat: str, chunk: int,
                               head: bool = True) -> int:
  """An estimate of what one token of a training pass holds for the backward pass, in bytes.

  With s the compute dtype's bytes, E d_model, F mlp_dim, L layers, H query heads, Q = H x
  head_dim, K = kv_heads x head_dim and T the sequence length (keys per query):
    a block, remat=none: s (6E + 3Q + 3K + 4F) + H T (8 + s)
      (norm inputs and outputs, q/k/v before and after rope, attention output, o, the
      residuals, gate, up, silu(gate) and their product; float32 scores and probabilities and
      the probabilities in s per head and key);
    kept per block: none, the whole block; dots, s (3E + Q + 2K + 2F) (the block's input and
      the 2-D matmuls' outputs: q/k/v, o, gate, up, down); full, s E (the block's input);
    total: L x kept, plus one block's whole activations while it is recomputed (dots, full);
    the head (`head`, not the critic's): 16 bytes per vocabulary column (float32 logits, log-
      softmax, probabilities and the logits' gradient) over V columns (chunk 0) or one chunk.
  An upper estimate: XLA fuses some of these away; embeddings and gradient buffers of the
  residual stream are left out.
  """
  s = cfg.compute_dtype.itemsize
  e, f, h, t = cfg.d_model, cfg.mlp_dim, cfg.num_heads, max(seq_len, 1)
  q, k = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  block = s * (6 * e + 3 * q + 3 * k + 4 * f) + h * t * (8 + s)
  remat_policy(remat)
  kept = {"none": block, "dots": s * (3 * e + q + 2 * k + 2 * f), "full": s * e}[remat]
  total = cfg.num_layers * kept + (0 if remat == "none" else block)
  if head:
    total += 16 * (min(chunk, cfg.vocab_size) if chunk else cfg.vocab_size)
  return total


def state_bytes(num_params: int, param_dtype: str, state_dtype: str = "",
                trained: bool = True) -> int:
  """Bytes of a trained model's resident state: parameters, two gradient trees (the
  micro-batch sum and one micro-batch's; rl/update.py `accumulate`) and Adam's two moments
  (in `state_dtype`, or the parameters' dtype when empty); the parameters alone for a frozen
  copy (`trained=False`)."""
  p = jnp.dtype(param_dtype).itemsize
  m = jnp.dtype(state_dtype or param_dtype).itemsize
  return num_params * (3 * p + 2 * m) if trained else num_params * p

"""The training forward of whole groups: each group's prompt runs once, its G responses attend
to that one prompt's keys and values.

A group's G rows share their (left-padded) prompt: the prompt's activations are the same in
every row, and in the backward pass its G contributions add up. Here the prompt stream holds
one row per group, [g, Tp], and the response stream every row, [g*G, N - 1] (the last
response token predicts nothing, so no position needs it as a query or a key). A response
query scores the prompt's keys of its group and the causal keys of its own row; one softmax
runs over the two, in the order [prompt keys, response keys] of the per-row path, so the
numbers are the per-row path's to float rounding (tests/unit/models/test_shared_prompt.py
states the tolerance). The backward pass through the broadcast of the prompt's k and v sums
the G rows' cotangents: each prompt is trained once.

Rows must come group-major (rows g*G .. g*G + G - 1 are one group, as every RL batch here
is) and each batch shard must hold whole groups (rl/update.py and the batch plan see to it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from rlscale.models import memory, packed_rows
from rlscale.models.layers import NEG_INF, attention as row_attention, c, positions_from_mask, rms_norm


def split(tokens_BxT: jax.Array, mask_BxT: jax.Array, n: int, group: int):
  """(prompt tokens and mask [g, Tp] (each group's first row), response inputs and mask
  [B, n - 1], response positions [B, n - 1])."""
  b, t = tokens_BxT.shape
  tp = t - n
  first = lambda x: x.reshape((b // group, group) + x.shape[1:])[:, 0]
  positions = positions_from_mask(mask_BxT)
  return (first(tokens_BxT[:, :tp]), first(mask_BxT[:, :tp]), tokens_BxT[:, tp:t - 1],
          mask_BxT[:, tp:t - 1], positions[:, tp:t - 1])


def prompt_mask(mask_gxT: jax.Array) -> jax.Array:
  t = mask_gxT.shape[-1]
  return jnp.tril(jnp.ones((t, t), bool))[None] & mask_gxT[:, None, :].astype(bool)


def attention(q_BxSxKxQxD, k_BxSxKxD, v_BxSxKxD, kp_gxTxKxD, vp_gxTxKxD, pmask_gxT,
              rmask_BxSxS, group: int) -> jax.Array:
  """Response queries over [their group's prompt keys, their own row's keys]; float32 scores
  and softmax, as layers.attention."""
  b, s = q_BxSxKxQxD.shape[:2]
  g, tp = pmask_gxT.shape
  scale = 1.0 / math.sqrt(q_BxSxKxQxD.shape[-1])
  qg = q_BxSxKxQxD.reshape((g, group) + q_BxSxKxQxD.shape[1:])
  s_p = jnp.einsum("hiskqd,htkd->hikqst", qg, kp_gxTxKxD, preferred_element_type=jnp.float32)
  s_p = jnp.where(pmask_gxT[:, None, None, None, None, :].astype(bool), s_p * scale, NEG_INF)
  s_r = jnp.einsum("bskqd,btkd->bkqst", q_BxSxKxQxD, k_BxSxKxD, preferred_element_type=jnp.float32)
  s_r = jnp.where(rmask_BxSxS[:, None, None], s_r * scale, NEG_INF)
  s_r = s_r.reshape((g, group) + s_r.shape[1:])
  p = jax.nn.softmax(jnp.concatenate([s_p, s_r], axis=-1), axis=-1).astype(v_BxSxKxD.dtype)
  p_p, p_r = p[..., :tp], p[..., tp:].reshape((b,) + s_r.shape[2:])
  # Both halves accumulate in float32 and are added before the cast, as the per-row path's one
  # einsum over all keys would round once.
  out = jnp.einsum("hikqst,htkd->hiskqd", p_p, vp_gxTxKxD,
                   preferred_element_type=jnp.float32).reshape(q_BxSxKxQxD.shape)
  out = out + jnp.einsum("bkqst,btkd->bskqd", p_r, v_BxSxKxD, preferred_element_type=jnp.float32)
  return out.astype(v_BxSxKxD.dtype)


def packed_attention(q_RxCxKxQxD, k_RxCxKxD, v_RxCxKxD, kp_gxTxKxD, vp_gxTxKxD, pmask_gxT,
                     rmask_RxCxC, row_group_SxR) -> jax.Array:
  """attention's, for a packed response stream: each packed row's queries over its group's
  prompt keys and the keys of their own response (rmask: causal within a segment)."""
  kp, vp, pm = (packed_rows.groups(x, row_group_SxR) for x in (kp_gxTxKxD, vp_gxTxKxD, pmask_gxT))
  tp = pm.shape[-1]
  scale = 1.0 / math.sqrt(q_RxCxKxQxD.shape[-1])
  s_p = jnp.einsum("rskqd,rtkd->rkqst", q_RxCxKxQxD, kp, preferred_element_type=jnp.float32)
  s_p = jnp.where(pm[:, None, None, None, :].astype(bool), s_p * scale, NEG_INF)
  s_r = jnp.einsum("rskqd,rtkd->rkqst", q_RxCxKxQxD, k_RxCxKxD, preferred_element_type=jnp.float32)
  s_r = jnp.where(rmask_RxCxC[:, None, None], s_r * scale, NEG_INF)
  p = jax.nn.softmax(jnp.concatenate([s_p, s_r], axis=-1), axis=-1).astype(v_RxCxKxD.dtype)
  out = jnp.einsum("rkqst,rtkd->rskqd", p[..., :tp], vp, preferred_element_type=jnp.float32)
  out = out + jnp.einsum("rkqst,rtkd->rskqd", p[..., tp:], v_RxCxKxD,
                         preferred_element_type=jnp.float32)
  return out.astype(v_RxCxKxD.dtype)


def block(layer, xp, xr, rope_p, rope_r, pmask_gxTxT, attend, masks):
  """One decoder layer (layers.Block) over the prompt stream xp [g, Tp, E] and the response
  stream xr (rows or packed rows); `attend(q, k, v, kp, vp, *masks)` is the response stream's
  attention (`attention` or `packed_attention`)."""
  eps = layer.cfg.rms_eps
  qp, kp, vp = layer.project_qkv(rms_norm(xp, layer.attn_norm[...], eps), *rope_p)
  qr, kr, vr = layer.project_qkv(rms_norm(xr, layer.attn_norm[...], eps), *rope_r)
  xp = c(xp + layer.attn_out(row_attention(qp, kp, vp, pmask_gxTxT)), "act_embed")
  xr = c(xr + layer.attn_out(attend(qr, kr, vr, kp, vp, *masks)), "act_embed")
  xp = c(xp + layer.mlp(rms_norm(xp, layer.mlp_norm[...], eps)), "act_embed")
  xr = c(xr + layer.mlp(rms_norm(xr, layer.mlp_norm[...], eps)), "act_embed")
  return xp, xr


def _layers(decoder, tok_p, mask_p, tok_r, pos_r, attend, masks, remat_policy):
  """Every layer over the two streams: the final-normed hidden states of the prompt stream's
  last position [g, E] and of the response stream."""
  rope_p = decoder.rope(positions_from_mask(mask_p))
  rope_r = decoder.rope(pos_r)
  pmask = prompt_mask(mask_p)
  xp, xr = decoder.embed_tokens(tok_p), decoder.embed_tokens(tok_r)
  for layer in decoder.layers:
    if remat_policy is None:
      xp, xr = block(layer, xp, xr, rope_p, rope_r, pmask, attend, masks)
      continue
    graphdef, state = nnx.split(layer)

    def run(state, xp, xr, rope_p, rope_r, pmask, masks, graphdef=graphdef):
      return block(nnx.merge(graphdef, state), xp, xr, rope_p, rope_r, pmask, attend, masks)

    xp, xr = memory.remat(run, remat_policy)(state, xp, xr, rope_p, rope_r, pmask, masks)
  return decoder.final(xp[:, -1]), decoder.final(xr)


def hidden(decoder, tokens_BxT, mask_BxT, n: int, group: int, remat_policy=None):
  """Final-normed hidden states [B, n, E] at the positions that predict the last n tokens
  (Decoder(tokens, mask)[:, -n - 1:-1] of the per-row path), each prompt run once."""
  b = tokens_BxT.shape[0]
  tok_p, mask_p, tok_r, mask_r, pos_r = split(tokens_BxT, mask_BxT, n, group)
  s = tok_r.shape[1]
  rmask = jnp.tril(jnp.ones((s, s), bool))[None] & mask_r[:, None, :].astype(bool)
  attend = lambda q, k, v, kp, vp, mask_p, rmask: attention(q, k, v, kp, vp, mask_p, rmask, group)
  last, xr = _layers(decoder, tok_p, mask_p, tok_r, pos_r, attend, (mask_p, rmask), remat_policy)
  last = jnp.broadcast_to(last[:, None], (last.shape[0], group, last.shape[-1]))
  return c(jnp.concatenate([last.reshape(b, 1, -1), xr], axis=1))


def packed_hidden(decoder, tokens_BxT, mask_BxT, n: int, group: int, packing, remat_policy=None):
  """hidden's, with the response stream packed (models/packed_rows.py, rl/packing.py): the
  final-normed hidden states that predict each row's first response token [B, E] and those of
  the packed response inputs [S * R, C, E] (input j of a response predicts its token j + 1)."""
  tok_p, mask_p, tok_r, mask_r, pos_r = split(tokens_BxT, mask_BxT, n, group)
  s, r, width = packing.src.shape
  tok_k, pos_k, real_k = (packed_rows.pack(x, packing.src) for x in (tok_r, pos_r, mask_r))
  seg = jnp.where(packing.src >= 0, packing.src // (n - 1) + 1, 0).reshape(s * r, width)
  rmask = (jnp.tril(jnp.ones((width, width), bool))[None] & (seg[:, :, None] == seg[:, None, :])
           & real_k[:, None, :].astype(bool))
  attend = lambda q, k, v, kp, vp, *m: packed_attention(q, k, v, kp, vp, *m)
  last, xk = _layers(decoder, tok_p, mask_p, tok_k, pos_k, attend,
                     (mask_p, rmask, packing.row_group), remat_policy)
  return c(jnp.repeat(last, group, axis=0)), c(xk)

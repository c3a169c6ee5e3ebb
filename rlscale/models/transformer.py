"""The decoder backbone, the policy (`CausalLM`) and the critic (`ValueModel`) built on it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rlscale.models import memory, packed_rows, shared_prompt
from rlscale.models.config import ModelConfig
from rlscale.parallel.sharding import constrain
from rlscale.models.layers import (Block, _param, c, dense, positions_from_mask, rms_norm,
                                   rope_cos_sin, rope_inv_freq)


def causal_mask(mask_BxT: jax.Array) -> jax.Array:
  """[B, S, T]: query s sees key t when t <= s and t is a real token."""
  t = mask_BxT.shape[-1]
  return jnp.tril(jnp.ones((t, t), bool))[None] & mask_BxT[:, None, :].astype(bool)


def unpacked(first_B, packed_RxC, packing: packed_rows.Packing) -> jax.Array:
  """[B, n]: a per-token output of the first response position and of the packed inputs, in
  the per-row layout (0 where nothing was computed)."""
  return jnp.concatenate([first_B[:, None], packed_rows.unpack(packed_RxC, packing.unpack)],
                         axis=1)


class Decoder(nnx.Module):
  """Token embedding, `num_layers` blocks and the final norm."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _param(rngs, (cfg.vocab_size, cfg.d_model), cfg.weight_dtype, ("vocab", "embed"),
                        cfg.init_std)
    self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = _param(rngs, (cfg.d_model,), cfg.weight_dtype, ("norm",), None)

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    # Gather the table whole (as FSDP gathers any weight) so that the lookup is local to each
    # batch shard; looking up in a vocab-sharded table makes XLA replicate it less cleanly.
    table = constrain(self.embed[...], (None, None))
    x = jnp.take(table, tokens, axis=0).astype(self.cfg.compute_dtype)
    return c(x, "act_embed")

  def rope(self, positions: jax.Array):
    return rope_cos_sin(positions, rope_inv_freq(self.cfg))

  def final(self, x: jax.Array) -> jax.Array:
    return rms_norm(x, self.final_norm[...], self.cfg.rms_eps)

  def __call__(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, return_kv: bool = False,
               remat: str = "none"):
    """Final-normed hidden states [B, T, E] of left-padded rows (and every layer's k, v).

    `remat` (train.remat, models/memory.py) rematerializes each block in the backward pass;
    for training only: its blocks return no k, v.
    """
    if remat != "none":
      if return_kv:
        raise ValueError("Decoder: return_kv needs remat='none' (a training forward keeps no k, v)")
      return self._run_remat(tokens_BxT, mask_BxT, memory.remat_policy(remat))
    x, kvs = self._run(tokens_BxT, mask_BxT, last_only=False)
    return (x, kvs) if return_kv else x

  def response_hidden(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, n: int,
                      remat: str = "none", group: int = 1) -> jax.Array:
    """Final-normed hidden states [B, n, E] at the positions that predict the last n tokens;
    with `group` > 1 each group's shared prompt runs once (models/shared_prompt.py)."""
    if group > 1 and n >= 2:
      policy = None if remat == "none" else memory.remat_policy(remat)
      return shared_prompt.hidden(self, tokens_BxT, mask_BxT, n, group, policy)
    return self(tokens_BxT, mask_BxT, remat=remat)[:, -n - 1:-1]

  def packed_response_hidden(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, n: int,
                             remat: str, group: int, packing: packed_rows.Packing):
    """response_hidden's with the response stream packed (shared_prompt.packed_hidden): the
    states predicting each row's first response token [B, E] and the packed ones [S*R, C, E]."""
    policy = None if remat == "none" else memory.remat_policy(remat)
    return shared_prompt.packed_hidden(self, tokens_BxT, mask_BxT, n, group, packing, policy)


  def prefill(self, tokens_BxT: jax.Array, mask_BxT: jax.Array):
    """(final-normed hidden state of the last position [B, E], every layer's k and v).

    The last layer's attention output and MLP run for the last position only: no other
    position's output is used when decoding starts.
    """
    x, kvs = self._run(tokens_BxT, mask_BxT, last_only=True)
    return x[:, -1], kvs

  def _run(self, tokens_BxT, mask_BxT, last_only: bool):
    cos, sin = self.rope(positions_from_mask(mask_BxT))
    attn_mask = causal_mask(mask_BxT)
    x = self.embed_tokens(tokens_BxT)
    kvs = []
    for i, layer in enumerate(self.layers):
      x, kv = layer(x, cos, sin, attn_mask, last_only=last_only and i == len(self.layers) - 1)
      kvs.append(kv)
    return self.final(x), kvs

  def _run_remat(self, tokens_BxT, mask_BxT, policy):
    """The training forward with each block rematerialized under `policy` (memory.remat): the
    block's parameters enter the rematerialized function as arguments (an nnx split), so the
    backward pass recomputes from them and the block's input what the policy did not save."""
    cos, sin = self.rope(positions_from_mask(mask_BxT))
    attn_mask = causal_mask(mask_BxT)
    x = self.embed_tokens(tokens_BxT)
    for layer in self.layers:
      graphdef, state = nnx.split(layer)

      def block(state, x, cos, sin, attn_mask, graphdef=graphdef):
        return nnx.merge(graphdef, state)(x, cos, sin, attn_mask)[0]

      x = memory.remat(block, policy)(state, x, cos, sin, attn_mask)
    return self.final(x)


class CausalLM(nnx.Module):
  """The policy: the backbone and a language-model head (tied to the embedding or not)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.model = Decoder(cfg, rngs=rngs)
    self.lm_head = (None if cfg.tie_embeddings else
                    _param(rngs, (cfg.d_model, cfg.vocab_size), cfg.weight_dtype, ("embed", "vocab"),
                           cfg.init_std))

  def head(self) -> tuple[jax.Array, bool]:
    """The output head in the compute dtype and whether it is [V, E] (the tied embedding)
    rather than [E, V]."""
    dt = self.cfg.compute_dtype
    if self.lm_head is None:
      return self.model.embed[...].astype(dt), True
    return self.lm_head[...].astype(dt), False

  def logits(self, hidden: jax.Array) -> jax.Array:
    """float32 logits [..., V] of final-normed hidden states [..., E]."""
    head, vocab_first = self.head()
    out = dense(hidden, head.T if vocab_first else head, preferred_element_type=jnp.float32)
    return c(out, "act_vocab")

  def __call__(self, tokens_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
    return self.logits(self.model(tokens_BxT, mask_BxT))

  def response_logits(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, n: int) -> jax.Array:
    """float32 logits [B, n, V] at the positions that predict the last n tokens.

    Only those positions go through the head.
    """
    return self.logits(self.model(tokens_BxT, mask_BxT)[:, -n - 1:-1])

  def response_logprobs(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, n: int,
                        chunk: int = 0, remat: str = "none",
                        group: int = 1, packing: packed_rows.Packing | None = None
                        ) -> tuple[jax.Array, jax.Array]:
    """float32 log p of the last n tokens and the entropy of the softmax that predicts each,
    [B, n] each, without [B, n, V] logits when `chunk` > 0 (models/memory.py); `remat`
    rematerializes the blocks for the backward pass. `group` > 1: rows are whole groups of
    that many sharing their prompt, which runs once (models/shared_prompt.py); `packing`: their
    responses packed (rl/packing.py), 0 at the positions it does not compute."""
    head, vocab_first = self.head()
    if packing is not None:
      first, packed = self.model.packed_response_hidden(tokens_BxT, mask_BxT, n, remat, group,
                                                        packing)
      targets = packed_rows.pack(tokens_BxT[:, -n + 1:], packing.src)
      lp_k, ent_k = memory.logprobs_and_entropy(packed, head, targets, chunk, vocab_first)
      lp_1, ent_1 = memory.logprobs_and_entropy(first[:, None], head, tokens_BxT[:, -n:-n + 1],
                                                chunk, vocab_first)
      return unpacked(lp_1[:, 0], lp_k, packing), unpacked(ent_1[:, 0], ent_k, packing)
    hidden = self.model.response_hidden(tokens_BxT, mask_BxT, n, remat, group)
    return memory.logprobs_and_entropy(hidden, head, tokens_BxT[:, -n:], chunk, vocab_first)

  def token_logprobs(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, start: int,
                     chunk: int = 0) -> jax.Array:
    """log p(tokens[:, t] | tokens[:, :t]) for t >= start, float32 [B, T - start]."""
    n = tokens_BxT.shape[1] - start
    return self.response_logprobs(tokens_BxT, mask_BxT, n, chunk)[0]


class ValueModel(nnx.Module):
  """The critic: the same backbone with a scalar value head."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.model = Decoder(cfg, rngs=rngs)
    self.value_head = _param(rngs, (cfg.d_model,), cfg.weight_dtype, ("embed",), cfg.init_std)
    self.value_bias = _param(rngs, (), cfg.weight_dtype, (), 0.0)

  def __call__(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, remat: str = "none") -> jax.Array:
    """float32 values [B, T], one per position."""
    hidden = self.model(tokens_BxT, mask_BxT, remat=remat)
    v = dense(hidden, self.value_head[...].astype(hidden.dtype), preferred_element_type=jnp.float32)
    return v + self.value_bias[...].astype(jnp.float32)

  def response_values(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, n: int,
                      remat: str = "none", group: int = 1,
                      packing: packed_rows.Packing | None = None) -> jax.Array:
    """float32 [B, n]: V of the state before each of the last n tokens (`group`, `packing` as
    CausalLM.response_logprobs')."""
    if packing is not None:
      first, packed = self.model.packed_response_hidden(tokens_BxT, mask_BxT, n, remat, group,
                                                        packing)
      return unpacked(self._value(first), self._value(packed), packing)
    return self._value(self.model.response_hidden(tokens_BxT, mask_BxT, n, remat, group))

  def _value(self, hidden: jax.Array) -> jax.Array:
    v = dense(hidden, self.value_head[...].astype(hidden.dtype), preferred_element_type=jnp.float32)
    return v + self.value_bias[...].astype(jnp.float32)

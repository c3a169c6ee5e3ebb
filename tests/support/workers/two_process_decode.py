"""One of two processes decoding on a mesh that spans both; run by test_distributed.py.

Usage: python two_process_decode.py OUT_FILE  (with JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID set and 4 CPU devices per process).
"""

import sys

import jax
import numpy as np
from flax import nnx

from rlscale import models
from rlscale.parallel import distributed
from rlscale.parallel import sharding
from rlscale.sampling import Sampler, SamplingParams, generate


def prompts():
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 128, (8, 10)).astype(np.int32)
  mask = np.ones_like(tokens, bool)
  for r in range(8):
    mask[r, :r] = False
  return tokens, mask


def run(mesh_shape, generation_batch=None):
  cfg = models.ModelConfig(family="qwen2", vocab_size=128, d_model=64, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=16, mlp_dim=128, qkv_bias=True)
  mesh = sharding.make_mesh(mesh_shape)
  rules = sharding.rules_from_config(None)
  policy = models.create_sharded(models.CausalLM, cfg, mesh, rules, jax.random.key(0))
  graphdef, state = nnx.split(policy)
  sampler = Sampler(graphdef, SamplingParams(max_new_tokens=12, decode_chunk=4), mesh, rules)
  tokens, mask = prompts()
  rows = distributed.process_rows(tokens.shape[0])  # this process loads only its rows
  out = generate(sampler, state, tokens[rows], mask[rows], jax.random.key(5), generation_batch)
  return rows, distributed.host_local(out.tokens), distributed.host_local(out.logprobs)


if __name__ == "__main__":
  distributed.initialize()
  assert jax.process_count() == 2 and jax.device_count() == 8, (jax.process_count(), jax.device_count())
  rows, toks, logp = run((2, 2, 2))
  _, toks4, _ = run((2, 2, 2), generation_batch=4)  # two calls of 2 rows per process
  np.savez(sys.argv[1], start=rows.start, tokens=toks, logprobs=logp, tokens4=toks4)

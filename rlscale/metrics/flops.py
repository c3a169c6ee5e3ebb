"""Model FLOPs and MFU.

Forward FLOPs of one token = 2 x (matmul parameters, the output head included) + 4 x layers x
heads x head_dim x (keys it attends to): the QK^T and PV products. A training token costs 3x its
forward (forward, and a backward twice as costly). MFU = model FLOPs per second / (devices x
peak FLOP/s per device). The peak comes from `train.peak_flops` or, for known accelerators, the
table below (dense bf16); on CPU it must be given, else MFU is not logged.
"""

from __future__ import annotations

import numpy as np

from rlscale.models.config import ModelConfig

# Dense bf16 peak FLOP/s per device by jax `device_kind` (vendor datasheets).
PEAKS = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "NVIDIA A100-SXM4-40GB": 312e12, "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H200": 989e12,
}
# Memory bandwidth in bytes/s per device by jax `device_kind` (the same datasheets).
HBM_BW = {
    "TPU v5 lite": 819e9, "TPU v5e": 819e9, "TPU v5p": 2.765e12,
    "TPU v6 lite": 1.64e12, "TPU v6e": 1.64e12,
    "NVIDIA A100-SXM4-80GB": 2.039e12,
    "NVIDIA H100 80GB HBM3": 3.35e12, "NVIDIA H200": 4.8e12,
}


def matmul_params(m: ModelConfig) -> int:
  e, f, d = m.d_model, m.mlp_dim, m.head_dim
  per_layer = e * (m.num_heads + 2 * m.num_kv_heads) * d + m.num_heads * d * e + 3 * e * f
  return m.num_layers * per_layer + e * m.vocab_size


def forward_flops(m: ModelConfig, tokens: float, attended: float) -> float:
  """FLOPs of `tokens` forward tokens that attend to `attended` keys in total."""
  attn = 4 * m.num_layers * m.num_heads * m.head_dim
  return 2.0 * matmul_params(m) * tokens + attn * attended


def causal_pairs(lengths) -> float:
  """Keys attended by every token of causal sequences of the given real lengths."""
  n = np.asarray(lengths, np.float64)
  return float(np.sum(n * (n + 1) / 2))


def rollout_flops(cfg: ModelConfig, prompt_lengths, response_lengths) -> float:
  """Prefill of the prompts plus one forward per generated token over its growing context."""
  p, r = np.asarray(prompt_lengths, np.float64), np.asarray(response_lengths, np.float64)
  decode_pairs = np.sum(r * p + r * (r + 1) / 2)
  return forward_flops(cfg, p.sum() + r.sum(), causal_pairs(p) + decode_pairs)


def train_flops(cfg: ModelConfig, sequence_lengths) -> float:
  n = np.asarray(sequence_lengths, np.float64)
  return 3.0 * forward_flops(cfg, n.sum(), causal_pairs(n))


def shared_prompt_train_flops(cfg: ModelConfig, prompt_lengths, response_lengths,
                              group: int) -> float:
  """train_flops of rows trained in groups of `group` whose shared prompt runs once
  (rlscale/models/shared_prompt.py): each group's prompt (its first row's length) once, each
  response's tokens but its last (no position needs the last one's output) attending to the
  prompt and to its own earlier tokens."""
  p = np.asarray(prompt_lengths, np.float64).reshape(-1, group)[:, 0]
  r = np.maximum(np.asarray(response_lengths, np.float64) - 1, 0)
  rows_prompt = np.repeat(p, group)
  attended = causal_pairs(p) + float(np.sum(r * rows_prompt + r * (r + 1) / 2))
  return 3.0 * forward_flops(cfg, p.sum() + r.sum(), attended)


def peak(configured: float, device_kind: str) -> float | None:
  if configured:
    return float(configured)
  return PEAKS.get(device_kind)

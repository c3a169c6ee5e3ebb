"""FLOP counts by hand for a small shape."""

import pytest

from rlscale.metrics import flops
from rlscale.models import ModelConfig

CFG = ModelConfig(family="llama", vocab_size=10, d_model=4, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=2, mlp_dim=8)


def test_counts_by_hand():
  # Per layer: qkv 4 x (2 + 2) x 2 = 32, o 2 x 2 x 4 = 16, MLP 3 x 4 x 8 = 96 -> 144; head 40.
  assert flops.matmul_params(CFG) == 2 * 144 + 40
  # 3 tokens attending to 6 keys in all: 2 x 328 x 3 + (4 x 2 layers x 2 heads x 2 dims) x 6.
  assert flops.forward_flops(CFG, 3, 6) == 2 * 328 * 3 + 32 * 6
  assert flops.causal_pairs([3, 1]) == 6 + 1
  assert flops.train_flops(CFG, [3]) == 3 * flops.forward_flops(CFG, 3, 6)
  # Prompt of 2, 2 generated tokens: 4 forward tokens; keys 1 + 2 (prefill) + 3 + 4 (decode).
  assert flops.rollout_flops(CFG, [2], [2]) == flops.forward_flops(CFG, 4, 10)
  # Shared prompt: one group of 2 rows, prompt 2, responses of 3 and 1 tokens. The prompt runs
  # once (keys 1 + 2); row 1's first 2 response tokens attend to the prompt and themselves
  # (2 x 2 + 1 + 2), row 2's none (its only token is no position's input): 4 tokens, 10 keys.
  assert flops.shared_prompt_train_flops(CFG, [2, 2], [3, 1], 2) == 3 * flops.forward_flops(
      CFG, 4, 10)


def test_peak_lookup():
  assert flops.peak(5e9, "cpu") == 5e9
  assert flops.peak(0, "cpu") is None
  assert flops.peak(0, "TPU v5p") == pytest.approx(459e12)

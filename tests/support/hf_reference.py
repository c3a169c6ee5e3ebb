"""Tiny random transformers models and their logits: the reference our decoder must match.

Run as a script (needs torch and transformers) to rewrite the committed golden fixtures:
    python -m tests.support.hf_reference
Each fixture folder holds a Hugging Face checkpoint (config.json + safetensors) and
`reference.npz` with a left-padded batch and transformers' float32 logits for it. One per family,
and a few-KB Qwen3 whose config.json has rope fields as hand-edited long-context configs do.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf")
FAMILIES = ("llama", "qwen2", "qwen3")
# A Qwen3 config as a long-context guide leaves it: transformers 5 wrote `rope_parameters` (default
# rope, theta 1e6), then a legacy `rope_scaling` asking for YaRN was pasted in. transformers lets
# the pasted dict replace `rope_parameters` whole, theta included.
LEGACY_YARN = "qwen3_legacy_yarn"
LEGACY_YARN_SCALING = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
FIXTURE_NAMES = FAMILIES + (LEGACY_YARN,)


def tiny_config(family: str, **overrides):
  import transformers
  common = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                rms_norm_eps=1e-6)
  if family == "llama":
    common.update(tie_word_embeddings=False, rope_theta=500_000.0, head_dim=16,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    common.update(overrides)
    return transformers.LlamaConfig(**common)
  if family == "qwen2":
    common.update(tie_word_embeddings=True, rope_theta=1_000_000.0)
    common.update(overrides)
    return transformers.Qwen2Config(**common)
  if family == "qwen3":
    common.update(tie_word_embeddings=True, rope_theta=1_000_000.0, head_dim=24)
    common.update(overrides)
    return transformers.Qwen3Config(**common)
  raise ValueError(family)


def build_model(family: str, seed: int = 0, **overrides):
  """A transformers model with every parameter random (norm weights near 1, biases non-zero)."""
  import torch
  import transformers
  torch.manual_seed(seed)
  cfg = tiny_config(family, **overrides)
  model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
      else:
        p.copy_(0.05 * torch.randn_like(p))
  return model.eval()


def reference_batch(vocab: int = 256, seed: int = 1, length: int = 12):
  """Left-padded token ids [3, length] and their mask (0, 3 and 7 pads)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, size=(3, length)).astype(np.int32)
  mask = np.ones_like(ids, dtype=bool)
  for row, pads in enumerate((0, 3, 7)):
    mask[row, :pads] = False
    ids[row, :pads] = 0
  return ids, mask


def reference_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """transformers' float32 logits [B, T, V] with positions counted from each row's first token."""
  import torch
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                position_ids=torch.tensor(positions, dtype=torch.long))
  return out.logits.float().numpy()


def write_legacy_yarn_fixture(folder: str) -> None:
  """A few-KB Qwen3 whose rows run past the original context, so YaRN's ramp matters."""
  import torch
  import transformers
  model = build_model("qwen3", seed=7, vocab_size=32, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=64)
  model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)  # half the bytes
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    cfg = json.load(f)
  assert cfg["rope_parameters"]["rope_type"] == "default" and "rope_theta" not in cfg
  cfg["rope_scaling"] = dict(LEGACY_YARN_SCALING)
  with open(path, "w") as f:
    json.dump(cfg, f, indent=2, sort_keys=True)
  # The reference is what transformers makes of the edited folder, weights upcast to float32.
  ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  assert ref.config.rope_parameters["rope_type"] == "yarn"
  ids, mask = reference_batch(vocab=32, length=24)
  np.savez(os.path.join(folder, "reference.npz"), input_ids=ids, attention_mask=mask,
           logits=reference_logits(ref, ids, mask))


def write_fixture(family: str, folder: str) -> None:
  if family == LEGACY_YARN:
    return write_legacy_yarn_fixture(folder)
  model = build_model(family, seed=FAMILIES.index(family))
  # The llama fixture is split into several files with an index, as large checkpoints are.
  shard = "200KB" if family == "llama" else "50MB"
  model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
  ids, mask = reference_batch()
  np.savez(os.path.join(folder, "reference.npz"), input_ids=ids, attention_mask=mask,
           logits=reference_logits(model, ids, mask))


def main(argv):
  for family in argv[1:] or FIXTURE_NAMES:
    folder = os.path.join(FIXTURES, family)
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(folder):
      os.remove(os.path.join(folder, name))
    write_fixture(family, folder)
    print("wrote", folder, sorted(os.listdir(folder)))


if __name__ == "__main__":
  main(sys.argv)

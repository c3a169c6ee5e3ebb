"""configs/grpo_math.py end to end on the committed GSM8K-style prompts with a checkpoint the
test writes: train, evaluate, checkpoint, export (weights and tokenizer), resume-safe config."""

import json
import os

import pytest

from tests.support import REPO
from rlscale.config import files as config_files
from rlscale.run import train
from rlscale.checkpoints.hf import config_from_folder
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.checkpoints.checkpointer import Checkpointer
from tests.support.policy_folder import write_policy_folder

SMALL = dict(num_layers=2, d_model=64, num_heads=2, num_kv_heads=1, head_dim=32, mlp_dim=128)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return write_policy_folder(str(tmp_path_factory.mktemp("qwen_small")), **SMALL)


@pytest.mark.slow(seconds=30)
def test_grpo_math_trains_evaluates_checkpoints_and_exports(tmp_path, checkpoint):
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo_math.py:tiny"))
  cfg.model.hf_checkpoint = checkpoint
  run = tmp_path / "run"
  summary = train.main(cfg, str(run))
  rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [0, 1, 2]
  for r in rows[1:]:
    assert r["responses_seen"] == r["step"] * 16 and 0 <= r["reward/mean"] <= 1
    assert r["memory/host_peak_gb"] > 0.1  # the run's memory so far, every step
  assert "eval/accuracy_greedy" in rows[0] and "eval/accuracy_sampled" in rows[2]
  assert Checkpointer(str(run / "checkpoints")).latest_step() == 2
  # The data report: the committed set's 64 training and 24 held-out rows (num_eval caps 8).
  assert summary["data"]["train"]["rows"] == 64 and summary["data"]["train"]["used"] == 64
  assert summary["data"]["eval"]["used"] == 8
  # The export loads as its source did: same shape, same tokenizer and chat template.
  policy = run / "policy"
  for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json"):
    assert (policy / name).exists(), name
  src, out = config_from_folder(checkpoint), config_from_folder(str(policy))
  assert (out.vocab_size, out.num_layers, out.d_model, out.eos_ids) == (
      src.vocab_size, src.num_layers, src.d_model, src.eos_ids)
  a, b = HFTokenizer(checkpoint), HFTokenizer(str(policy))
  msgs = [{"role": "user", "content": "What is 2 + 2?"}]
  assert a.encode(a.apply_chat_template(msgs)) == b.encode(b.apply_chat_template(msgs))

"""Hugging Face checkpoints: parity with transformers, config mapping, export, tokenizers.

The golden tests read committed fixtures (tests/hf_reference.py wrote them with transformers);
the `hf` tests run transformers itself when torch and transformers are installed (.ci/run).
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlscale import sharding
from rlscale.checkpoints import hf
from rlscale.checkpoints.safetensors_io import CheckpointError, SafetensorsFolder
from rlscale.checkpoints.tokenizer import HFTokenizer

import hf_reference
from tiny_tokenizer import make_tokenizer_folder

PARITY_ATOL = 1e-4  # float32, max abs difference of logits at real (non-pad) positions


def _logits(model, ids, mask):
  return np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))


def _fixture(family):
  return os.path.join(hf_reference.FIXTURES, family)


@pytest.mark.parametrize("family", hf_reference.FAMILIES)
def test_golden_parity_with_transformers(family, mesh1, rules):
  ref = np.load(os.path.join(_fixture(family), "reference.npz"))
  model, cfg = hf.load_policy(_fixture(family), mesh1, rules)
  assert cfg.family == family
  mask = ref["attention_mask"]
  diff = np.abs(_logits(model, ref["input_ids"], mask) - ref["logits"])[mask]
  assert diff.max() <= PARITY_ATOL, diff.max()


@pytest.mark.parametrize("family", hf_reference.FAMILIES)
def test_import_onto_a_mesh_shards_every_large_tensor(family, rules):
  mesh = sharding.make_mesh((2, 2, 2))
  model, _ = hf.load_policy(_fixture(family), mesh, rules)
  state = nnx.state(model)
  embed = state["model"]["embed"][...]
  assert embed.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  for shard in embed.addressable_shards:  # each device holds a quarter of the table
    assert shard.data.size == embed.size // 4
  ref = np.load(os.path.join(_fixture(family), "reference.npz"))
  mask = ref["attention_mask"]
  diff = np.abs(_logits(model, ref["input_ids"], mask) - ref["logits"])[mask]
  assert diff.max() <= PARITY_ATOL


def test_sharded_index_fixture_is_read_across_files():
  folder = SafetensorsFolder(_fixture("llama"))
  files = {n for n in os.listdir(_fixture("llama")) if n.endswith(".safetensors")}
  assert len(files) > 1 and "lm_head.weight" in folder


def _write_config(tmp_path, **changes):
  cfg = json.load(open(os.path.join(_fixture("qwen2"), "config.json")))
  cfg.update(changes)
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  return str(tmp_path)


@pytest.mark.parametrize("changes, match", [
    (dict(model_type="mistral", architectures=["MistralForCausalLM"]), "model_type='mistral'"),
    (dict(model_type="qwen3_moe"), "qwen3_moe"),
    (dict(use_sliding_window=True), "use_sliding_window"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), "yarn"),
])
def test_unsupported_architectures_are_refused(tmp_path, changes, match, mesh1, rules):
  folder = _write_config(tmp_path, **changes)
  with pytest.raises(CheckpointError, match=match):
    hf.load_policy(folder, mesh1, rules)


def test_llama_attention_bias_is_refused():
  cfg = json.load(open(os.path.join(_fixture("llama"), "config.json")))
  with pytest.raises(CheckpointError, match="attention_bias"):
    hf.config_from_hf({**cfg, "attention_bias": True})


def test_missing_config_and_mismatched_shapes(tmp_path, mesh1, rules):
  with pytest.raises(CheckpointError, match="no config.json"):
    hf.load_policy(str(tmp_path), mesh1, rules)
  for name in os.listdir(_fixture("qwen2")):
    shutil.copy(os.path.join(_fixture("qwen2"), name), tmp_path)
  _write_config(tmp_path, intermediate_size=96)
  with pytest.raises(CheckpointError, match="shape"):
    hf.load_policy(str(tmp_path), mesh1, rules)


@pytest.mark.parametrize("family", hf_reference.FAMILIES)
def test_export_then_import_is_exact(family, tmp_path, mesh1, rules):
  model, cfg = hf.load_policy(_fixture(family), mesh1, rules)
  hf.save_policy(model, str(tmp_path), max_shard_bytes=64 << 10)  # several files and an index
  assert os.path.exists(tmp_path / "model.safetensors.index.json")
  again, cfg2 = hf.load_policy(str(tmp_path), mesh1, rules)
  assert cfg2 == cfg
  for (p, a), (q, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(again))):
    assert p == q
    np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]))
  ours = set(SafetensorsFolder(str(tmp_path)).keys())
  theirs = set(SafetensorsFolder(_fixture(family)).keys())
  if cfg.tie_embeddings:
    theirs.discard("lm_head.weight")
  assert ours == theirs


def test_export_from_a_sharded_model(tmp_path, rules, mesh1):
  mesh = sharding.make_mesh((1, 2, 4))
  model, _ = hf.load_policy(_fixture("qwen3"), mesh, rules)
  hf.save_policy(model, str(tmp_path), dtype="bfloat16")
  again, cfg = hf.load_policy(str(tmp_path), mesh1, rules)
  ref = np.load(os.path.join(_fixture("qwen3"), "reference.npz"))
  mask = ref["attention_mask"]
  diff = np.abs(_logits(again, ref["input_ids"], mask) - ref["logits"])[mask]
  assert diff.max() < 0.05  # bf16-rounded weights


def test_tokenizer_json_chat_template_and_special_ids(tmp_path):
  tok = HFTokenizer(make_tokenizer_folder(str(tmp_path)))
  text = "What is 12 + 30?"
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.eos_ids == (2, 0) and tok.pad_id == 0
  prompt = tok.apply_chat_template([{"role": "user", "content": text}])
  assert prompt == "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n"
  ids = tok.encode(prompt)
  assert ids[0] == 1 and 2 in ids  # special tokens are single ids
  assert tok.decode(ids) == "user\nWhat is 12 + 30?\nassistant\n"


def test_malformed_tokenizer_json(tmp_path):
  (tmp_path / "tokenizer.json").write_text("{\"version\": ")
  with pytest.raises(CheckpointError, match="tokenizer.json"):
    HFTokenizer(str(tmp_path))


# --- against transformers itself (torch + transformers installed) ---

hf_mark = pytest.mark.hf


def _need_transformers():
  pytest.importorskip("torch")
  pytest.importorskip("transformers")


LIVE_CASES = [
    ("llama", {}),
    ("llama", dict(rope_scaling=None, tie_word_embeddings=True, num_key_value_heads=4)),
    ("qwen2", dict(tie_word_embeddings=False)),
    ("qwen3", {}),
    ("qwen3", dict(num_key_value_heads=1, head_dim=32)),
]


@hf_mark
@pytest.mark.parametrize("family, overrides", LIVE_CASES)
def test_live_parity_with_transformers(family, overrides, tmp_path, mesh1, rules):
  _need_transformers()
  import transformers
  seed = 10 + LIVE_CASES.index((family, overrides))
  ref_model = hf_reference.build_model(family, seed=seed, **overrides)
  ref_model.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
  ids, mask = hf_reference.reference_batch(seed=seed)
  want = hf_reference.reference_logits(ref_model, ids, mask)
  model, _ = hf.load_policy(str(tmp_path / "hf"), mesh1, rules)
  diff = np.abs(_logits(model, ids, mask) - want)[mask]
  assert diff.max() <= PARITY_ATOL, diff.max()
  # And back: our export loads in transformers and gives the same logits.
  hf.save_policy(model, str(tmp_path / "ours"))
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ours")).float().eval()
  diff = np.abs(hf_reference.reference_logits(back, ids, mask) - want)[mask]
  assert diff.max() <= PARITY_ATOL, diff.max()


@hf_mark
def test_live_tokenizer_matches_transformers(tmp_path):
  _need_transformers()
  import transformers
  folder = make_tokenizer_folder(str(tmp_path))
  ref = transformers.AutoTokenizer.from_pretrained(folder)
  tok = HFTokenizer(folder)
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
  text = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert tok.apply_chat_template(messages) == text
  assert tok.encode(text) == ref.encode(text, add_special_tokens=False)

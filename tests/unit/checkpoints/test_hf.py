"""Hugging Face checkpoints: parity with transformers, config mapping, export, tokenizers.

The golden tests read committed fixtures (tests/support/hf_reference.py wrote them with transformers);
the `hf` tests run transformers itself when torch and transformers are installed (.ci/run).
"""

import dataclasses
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlscale import models
from rlscale.parallel import sharding
from rlscale.checkpoints import hf
from rlscale.checkpoints.safetensors_io import CheckpointError, SafetensorsFolder
from rlscale.checkpoints.tokenizer import HFTokenizer
from rlscale.models import RopeScaling, YarnScaling
from rlscale.models.layers import rope_attention_scale, rope_inv_freq

from tests.support import hf_reference
from tests.support.tiny_tokenizer import make_tokenizer_folder

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


def test_golden_parity_legacy_rope_scaling_over_default_rope_parameters(mesh1, rules):
  """rope_parameters says default, a pasted legacy rope_scaling says YaRN: transformers uses YaRN."""
  folder = _fixture(hf_reference.LEGACY_YARN)
  ref = np.load(os.path.join(folder, "reference.npz"))
  model, cfg = hf.load_policy(folder, mesh1, rules)
  mask = ref["attention_mask"]
  diff = np.abs(_logits(model, ref["input_ids"], mask) - ref["logits"])[mask]
  assert diff.max() <= PARITY_ATOL, diff.max()
  assert cfg.rope_scaling == YarnScaling(factor=4.0, original_max_position=16)
  assert cfg.rope_theta == 10_000.0  # rope_parameters' theta went with the dict it replaced


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


def _rope_free_config(family):
  """A fixture's config.json without any rope field, for a case to add its own."""
  cfg = json.load(open(os.path.join(_fixture(family), "config.json")))
  return {k: v for k, v in cfg.items() if k not in ("rope_parameters", "rope_scaling", "rope_theta")}


_LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 64}
_DEFAULT_1E6 = {"rope_theta": 1e6, "rope_type": "default"}
_MSCALE = (0.1 * np.log(4.0) + 1) / (0.05 * np.log(4.0) + 1)
# (family, rope fields of config.json, the (rope_theta, rope_scaling) transformers 5 makes of them).
# The live test below checks every row against transformers' own rotary embedding.
ROPE_CASES = [
    ("qwen2", {}, (10_000.0, None)),
    ("qwen2", dict(rope_theta=5e5), (5e5, None)),
    ("qwen2", dict(rope_theta=5e5, rope_parameters={"rope_type": "default"}), (5e5, None)),
    # A set rope_scaling replaces rope_parameters whole: theta from the top level, else 10000.
    ("qwen2", dict(rope_parameters=_DEFAULT_1E6,
                   rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
     (10_000.0, YarnScaling(4.0, 32))),
    ("llama", dict(rope_theta=5e5, rope_parameters=_DEFAULT_1E6, rope_scaling={"type": "llama3", **_LLAMA3}),
     (5e5, RopeScaling(8.0, 1.0, 4.0, 64))),
    ("qwen2", dict(rope_theta=5e5, rope_parameters=_DEFAULT_1E6, rope_scaling={}), (1e6, None)),
    ("qwen2", dict(rope_scaling={"type": "yarn", "rope_type": "default", "factor": 4.0}), (10_000.0, None)),
    # original_max_position_embeddings: a top-level one wins, else the dict's, else max_position_embeddings.
    ("qwen2", dict(original_max_position_embeddings=100,
                   rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
     (10_000.0, YarnScaling(4.0, 100))),
    ("qwen2", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), (10_000.0, YarnScaling(4.0, 512))),
    ("llama", dict(max_position_embeddings=None, rope_parameters={"rope_type": "yarn", "factor": 2.0}),
     (10_000.0, YarnScaling(2.0, 2048))),  # LlamaConfig's default max_position_embeddings
    ("qwen3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0,
                                    "original_max_position_embeddings": 64, "beta_fast": 16, "beta_slow": 2,
                                    "truncate": False, "attention_factor": 1.5}),
     (1e6, YarnScaling(2.0, 64, beta_fast=16.0, beta_slow=2.0, attention_factor=1.5, truncate=False))),
    ("qwen3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "mscale": 1.0,
                                    "mscale_all_dim": 0.5, "original_max_position_embeddings": 64}),
     (1e6, YarnScaling(4.0, 64, attention_factor=_MSCALE))),
    ("qwen3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": None,
                                    "original_max_position_embeddings": 128}),
     (1e6, YarnScaling(4.0, 128))),  # no factor: max_position_embeddings / original
]


def _rope_case_config(family, rope):
  cfg = {**_rope_free_config(family), **rope}
  return {k: v for k, v in cfg.items() if v is not None}  # None: leave the field out


@pytest.mark.parametrize("family, rope, want", ROPE_CASES)
def test_rope_fields_resolve_as_transformers_does(family, rope, want):
  cfg = hf.config_from_hf(_rope_case_config(family, rope))
  theta, scaling = want
  assert cfg.rope_theta == theta
  if isinstance(scaling, YarnScaling) and scaling.attention_factor is not None:
    assert cfg.rope_scaling.attention_factor == pytest.approx(scaling.attention_factor)
    scaling = dataclasses.replace(scaling, attention_factor=cfg.rope_scaling.attention_factor)
  assert cfg.rope_scaling == scaling


@pytest.mark.parametrize("rope, match", [
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope_parameters.rope_type='dynamic'"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling.type='linear'"),
    (dict(rope_scaling={"rope_type": "longrope", "factor": 2.0}), "rope_scaling.rope_type='longrope'"),
    (dict(rope_parameters={"rope_type": "yarn"}), "rope_parameters.factor"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "rope_scaling.low_freq_factor"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5"),
    (dict(rope_parameters={"full_attention": _DEFAULT_1E6}), "rope_parameters per layer type"),
])
def test_unsupported_rope_is_refused_naming_field_and_value(rope, match):
  with pytest.raises(CheckpointError, match=re.escape(match)):
    hf.config_from_hf(_rope_case_config("qwen2", rope))


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
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e6}), "dynamic"),
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


@pytest.mark.parametrize("family", hf_reference.FIXTURE_NAMES)
def test_export_then_import_is_exact(family, tmp_path, mesh1, rules):
  model, cfg = hf.load_policy(_fixture(family), mesh1, rules)
  shard = (4 if family == hf_reference.LEGACY_YARN else 64) << 10
  hf.save_policy(model, str(tmp_path), max_shard_bytes=shard)  # several files and an index
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
  written = json.load(open(tmp_path / "config.json"))
  assert written["dtype"] == written["torch_dtype"] == "bfloat16"  # transformers 5 and 4 read these
  again, cfg = hf.load_policy(str(tmp_path), mesh1, rules)
  ref = np.load(os.path.join(_fixture("qwen3"), "reference.npz"))
  mask = ref["attention_mask"]
  diff = np.abs(_logits(again, ref["input_ids"], mask) - ref["logits"])[mask]
  assert diff.max() < 0.05  # bf16-rounded weights


_SOURCE_GENERATION = {"bos_token_id": 1, "eos_token_id": [2, 3, 4], "pad_token_id": 0, "max_length": 300,
                      "do_sample": True, "temperature": 0.6, "top_p": 0.9, "transformers_version": "5.24.0"}


def _source_with_metadata(tmp_path, generation: bool = True):
  """The llama fixture with the special tokens and limits of a chat checkpoint."""
  src = tmp_path / "src"
  shutil.copytree(_fixture("llama"), src)
  cfg = json.load(open(src / "config.json"))
  cfg.update(bos_token_id=1, eos_token_id=[2, 3], pad_token_id=0, max_position_embeddings=384)
  (src / "config.json").write_text(json.dumps(cfg))
  if generation:
    (src / "generation_config.json").write_text(json.dumps(_SOURCE_GENERATION))
  else:
    os.remove(src / "generation_config.json")
  return src


def _read(folder, name):
  return json.load(open(os.path.join(folder, name)))


def test_export_keeps_special_tokens_limits_and_generation_config(tmp_path, mesh1, rules):
  model, cfg = hf.load_policy(str(_source_with_metadata(tmp_path)), mesh1, rules)
  assert (cfg.bos_id, cfg.eos_ids, cfg.pad_id, cfg.max_position) == (1, (2, 3), 0, 384)
  # Ids given to save_policy only fill what the checkpoint lacks: these change nothing.
  hf.save_policy(model, str(tmp_path / "out"), bos_id=7, eos_ids=(7,), pad_id=7)
  out = _read(tmp_path / "out", "config.json")
  assert (out["bos_token_id"], out["eos_token_id"], out["pad_token_id"]) == (1, [2, 3], 0)
  assert out["max_position_embeddings"] == 384
  assert out["dtype"] == out["torch_dtype"] == "float32"
  assert _read(tmp_path / "out", "generation_config.json") == _SOURCE_GENERATION


def test_export_without_a_source_generation_config_writes_one_from_the_ids(tmp_path, mesh1, rules):
  model, _ = hf.load_policy(str(_source_with_metadata(tmp_path, generation=False)), mesh1, rules)
  hf.save_policy(model, str(tmp_path / "out"))
  gen = _read(tmp_path / "out", "generation_config.json")
  assert gen == {"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0}


def test_export_of_a_named_size_policy_takes_special_ids(tmp_path, tiny_cfg, mesh1, rules):
  cfg = tiny_cfg.replace(d_model=32, mlp_dim=64, num_layers=1, head_dim=16)
  hf.save_policy(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)), str(tmp_path), bos_id=1, eos_ids=(2,),
                 pad_id=0)
  out = _read(tmp_path, "config.json")
  assert (out["bos_token_id"], out["eos_token_id"], out["pad_token_id"]) == (1, 2, 0)
  assert _read(tmp_path, "generation_config.json") == {"bos_token_id": 1, "eos_token_id": 2,
                                                        "pad_token_id": 0}
  _, again = hf.load_policy(str(tmp_path), mesh1, rules)
  assert (again.bos_id, again.eos_ids, again.pad_id) == (1, (2,), 0)


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
    ("qwen2", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                    "original_max_position_embeddings": 8})),
    ("qwen3", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0,
                                    "original_max_position_embeddings": 8, "beta_fast": 16, "beta_slow": 2,
                                    "truncate": False})),
    ("llama", dict(rope_scaling=None, rope_parameters={"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0,
                                                      "original_max_position_embeddings": 8, "mscale": 1.0,
                                                      "mscale_all_dim": 0.5})),
]


@hf_mark
@pytest.mark.parametrize("family, overrides", LIVE_CASES)
def test_live_parity_with_transformers(family, overrides, tmp_path, mesh1, rules):
  _need_transformers()
  import transformers
  seed = 10 + LIVE_CASES.index((family, overrides))
  ref_model = hf_reference.build_model(family, seed=seed, **overrides)
  ref_model.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
  ids, mask = hf_reference.reference_batch(seed=seed, length=40)  # past original contexts
  want = hf_reference.reference_logits(ref_model, ids, mask)
  model, _ = hf.load_policy(str(tmp_path / "hf"), mesh1, rules)
  diff = np.abs(_logits(model, ids, mask) - want)[mask]
  assert diff.max() <= PARITY_ATOL, diff.max()
  # And back: our export loads in transformers and gives the same logits.
  hf.save_policy(model, str(tmp_path / "ours"))
  back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "ours")).float().eval()
  diff = np.abs(hf_reference.reference_logits(back, ids, mask) - want)[mask]
  assert diff.max() <= PARITY_ATOL, diff.max()


def _transformers_rope(family, config):
  import importlib
  module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
  rotary = getattr(module, {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family] + "RotaryEmbedding")
  emb = rotary(config)
  return emb.inv_freq.numpy(), emb.attention_scaling


@hf_mark
@pytest.mark.parametrize("family, rope, want", ROPE_CASES)
def test_live_rope_fields_resolve_as_transformers_does(family, rope, want, tmp_path):
  _need_transformers()
  import transformers
  (tmp_path / "config.json").write_text(json.dumps(_rope_case_config(family, rope)))
  inv_freq, scale = _transformers_rope(family, transformers.AutoConfig.from_pretrained(str(tmp_path)))
  cfg = hf.config_from_hf(hf.read_config(str(tmp_path)))
  np.testing.assert_allclose(rope_inv_freq(cfg), inv_freq, rtol=1e-6)
  assert rope_attention_scale(cfg) == pytest.approx(scale, rel=1e-7)


@hf_mark
@pytest.mark.parametrize("generation", [True, False])
def test_live_exported_policy_generates_like_its_source(generation, tmp_path, mesh1, rules):
  _need_transformers()
  import torch
  import transformers
  src = str(_source_with_metadata(tmp_path, generation))
  model, _ = hf.load_policy(src, mesh1, rules)
  hf.save_policy(model, str(tmp_path / "out"))
  theirs = [transformers.AutoModelForCausalLM.from_pretrained(f).eval() for f in (src, str(tmp_path / "out"))]
  for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "max_length", "max_new_tokens", "do_sample",
               "temperature", "top_p"):
    assert getattr(theirs[1].generation_config, attr) == getattr(theirs[0].generation_config, attr), attr
  for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings", "rope_parameters",
               "dtype"):
    assert getattr(theirs[1].config, attr) == getattr(theirs[0].config, attr), attr
  prompt = torch.tensor([[5, 6, 7, 8]])
  out = [m.generate(prompt, do_sample=False, max_new_tokens=8) for m in theirs]
  assert out[1].tolist() == out[0].tolist()


@hf_mark
def test_live_named_size_export_has_the_given_ids(tmp_path, tiny_cfg):
  _need_transformers()
  import transformers
  cfg = tiny_cfg.replace(d_model=32, mlp_dim=64, num_layers=1, head_dim=16)
  hf.save_policy(models.CausalLM(cfg, rngs=nnx.Rngs(params=0)), str(tmp_path), bos_id=1, eos_ids=(2,),
                 pad_id=0)
  gen = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).generation_config
  assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (1, 2, 0)


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

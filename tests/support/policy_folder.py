"""Hugging Face policy folders with random weights, written by the tests (nothing downloaded).

`write_policy_folder` writes config.json, safetensors, tokenizer.json, tokenizer_config.json
(with Qwen2.5 Instruct's chat template) and generation_config.json: what such a checkpoint ships.
With `real_vocab` the tokenizer has Qwen2.5's 151,643 ordinary tokens (a small trained
byte-level BPE padded with unreachable filler tokens) and its special tokens at Qwen's ids:
<|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645; the model has 151,936 rows.
"""

import json
import os

import jax
import jax.numpy as jnp

from rlscale.data import gsm8k_style
from tests.support import FIXTURES

QWEN_ORDINARY = 151_643  # ids below the special tokens in Qwen2.5's tokenizer.json
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
with open(os.path.join(FIXTURES, "chat_templates", "qwen2_5_instruct.jinja")) as _f:
  CHAT_TEMPLATE = _f.read()  # Qwen2.5 Instruct's own (its default system message included)
_DATA = gsm8k_style.FOLDER
CORPUS = ["What is 12 + 30? The answer is 42.", "Compute 7 * 6 and explain step by step.",
          "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
          "Let's think step by step and output the final answer within \\boxed{}.",
          "The final answer is \\boxed{8}. Each pack holds 12 marbles; 3 packs hold 36."] * 20
for _name in ("train.jsonl", "test.jsonl"):  # word problems: prompts of a realistic length
  with open(os.path.join(_DATA, _name)) as _f:
    CORPUS += [json.loads(line)["question"] for line in _f]


def _bpe(vocab_size: int, ordinary: int | None):
  """A byte-level BPE trained on CORPUS; with `ordinary`, padded with filler tokens to that many
  ordinary ids; the special tokens follow."""
  import tokenizers
  from tokenizers import decoders, models as tmodels, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(tmodels.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  if ordinary:
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), ordinary):
      vocab[f"<fill{i}>"] = i  # ordinary tokens no merge reaches, as a big vocabulary's rare ones
    tok = tokenizers.Tokenizer.from_str(json.dumps(spec))
  tok.add_special_tokens(list(QWEN_SPECIALS))
  return tok


def write_tokenizer(folder: str, real_vocab: bool = False) -> dict[str, int]:
  """tokenizer.json, tokenizer_config.json and generation_config.json; the special ids."""
  tok = _bpe(1000, QWEN_ORDINARY if real_vocab else None)
  os.makedirs(folder, exist_ok=True)
  tok.save(os.path.join(folder, "tokenizer.json"))
  ids = {t: tok.token_to_id(t) for t in QWEN_SPECIALS}
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "bos_token": None,
               "tokenizer_class": "PreTrainedTokenizerFast"}, f)
  with open(os.path.join(folder, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
               "pad_token_id": ids["<|endoftext|>"]}, f)
  return ids


def write_policy_folder(folder: str, *, real_vocab: bool = False, seed: int = 0,
                        dtype: str = "bfloat16", **shape) -> str:
  """A Qwen2-family policy with random weights and its tokenizer. `shape` overrides the named
  size qwen2.5-0.5b (e.g. num_layers=2, d_model=64 for a fast test); without real_vocab the
  model has the small tokenizer's vocabulary rounded up to 64."""
  from flax import nnx
  from rlscale import models
  from rlscale.checkpoints import hf
  ids = write_tokenizer(folder, real_vocab)
  vocab = 151_936 if real_vocab else -(-(max(ids.values()) + 1) // 64) * 64
  cfg = models.named("qwen2.5-0.5b", vocab_size=vocab, **shape)
  model = nnx.eval_shape(lambda: models.CausalLM(cfg, rngs=nnx.Rngs(params=seed)))
  graphdef, abstract = nnx.split(model)
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(abstract))))
  def init(path, a):  # matrices N(0, 0.02), norms 1, biases 0
    if a.ndim > 1:
      return (0.02 * jax.random.normal(next(keys), a.shape)).astype(a.dtype)
    return (jnp.ones if "norm" in jax.tree_util.keystr(path) else jnp.zeros)(a.shape, a.dtype)
  params = jax.tree_util.tree_map_with_path(init, abstract)
  hf.save_policy(nnx.merge(graphdef, params), folder, dtype=dtype,
                 eos_ids=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_id=ids["<|endoftext|>"])
  return folder


if __name__ == "__main__":  # python -m tests.support.policy_folder DIR [--real_vocab] [shape=value ...]
  import sys
  args = sys.argv[1:]
  shape = dict(a.split("=") for a in args[1:] if "=" in a)
  write_policy_folder(args[0], real_vocab="--real_vocab" in args,
                      **{k: int(v) for k, v in shape.items()})
  print(args[0])

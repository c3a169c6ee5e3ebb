"""A small BPE tokenizer.json with Qwen-style special tokens and a chat template, for tests."""

import json
import os

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tokenizer_folder(folder):
  """A small BPE tokenizer.json with Qwen-style special tokens, trained on the spot."""
  import tokenizers
  from tokenizers import models as tmodels, pre_tokenizers, trainers, decoders
  tok = tokenizers.Tokenizer(tmodels.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                 "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  corpus = ["What is 12 + 30? The answer is 42.", "Compute 7 * 6 and explain.",
            "The quick brown fox jumps over the lazy dog."] * 20
  tok.train_from_iterator(corpus, trainer)
  os.makedirs(folder, exist_ok=True)
  tok.save(os.path.join(folder, "tokenizer.json"))
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
  with open(os.path.join(folder, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [2, 0]}, f)
  return folder

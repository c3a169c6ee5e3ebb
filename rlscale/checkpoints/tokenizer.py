"""The tokenizer of a Hugging Face checkpoint: tokenizer.json, its chat template and special ids."""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from rlscale.checkpoints.safetensors_io import CheckpointError


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def _token_text(t: Any) -> str | None:
  return t.get("content") if isinstance(t, dict) else t


class HFTokenizer:
  """Text <-> ids with a checkpoint's tokenizer.json, through the `tokenizers` library."""

  def __init__(self, folder: str):
    import tokenizers
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.exists(path):
      raise CheckpointError(f"{folder}: no tokenizer.json")
    try:
      self._tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception on malformed files
      raise CheckpointError(f"{path}: cannot be read by tokenizers ({e})") from None
    cfg = _read_json(os.path.join(folder, "tokenizer_config.json"))
    gen = _read_json(os.path.join(folder, "generation_config.json"))
    template_file = os.path.join(folder, "chat_template.jinja")
    self.chat_template: str | None = cfg.get("chat_template")
    if self.chat_template is None and os.path.exists(template_file):
      with open(template_file) as f:
        self.chat_template = f.read()
    self.bos_token = _token_text(cfg.get("bos_token"))
    self.eos_token = _token_text(cfg.get("eos_token"))
    eos = gen.get("eos_token_id")
    if eos is None and self.eos_token is not None:
      eos = self._tok.token_to_id(self.eos_token)
    self.eos_ids: tuple[int, ...] = tuple(
        int(e) for e in ([] if eos is None else eos if isinstance(eos, list) else [eos]))
    pad = _token_text(cfg.get("pad_token"))
    pad_id = self._tok.token_to_id(pad) if pad is not None else None
    self.pad_id: int = pad_id if pad_id is not None else (self.eos_ids[0] if self.eos_ids else 0)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                          **kwargs) -> str:
    """The prompt text for `messages`, rendered as transformers does (sandboxed Jinja)."""
    if not self.chat_template:
      raise ValueError("this tokenizer has no chat template")
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
      raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, indent=indent,
                                                                    ensure_ascii=False)
    return env.from_string(self.chat_template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)

"""A character tokenizer for the embedded tasks: one id per character, plus pad, bos and eos."""

from __future__ import annotations

from typing import Sequence

SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
  """Ids 0..2 are pad, bos, eos; then one id per character of `alphabet`."""

  def __init__(self, alphabet: str):
    if len(set(alphabet)) != len(alphabet):
      raise ValueError(f"alphabet {alphabet!r} repeats a character")
    self.alphabet = alphabet
    self._ids = {ch: i + len(SPECIALS) for i, ch in enumerate(alphabet)}
    self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
    self.eos_ids = (self.eos_id,)

  @property
  def vocab_size(self) -> int:
    return len(SPECIALS) + len(self.alphabet)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    try:
      ids = [self._ids[ch] for ch in text]
    except KeyError as e:
      raise ValueError(f"character {e.args[0]!r} is not in the alphabet {self.alphabet!r}") from None
    return [self.bos_id] + ids if add_special_tokens else ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of `ids`; ids outside the vocabulary (a model's spare rows) decode to '?'."""
    out = []
    for i in ids:
      i = int(i)
      if 0 <= i < len(SPECIALS):
        if not skip_special_tokens:
          out.append(SPECIALS[i])
      elif len(SPECIALS) <= i < self.vocab_size:
        out.append(self.alphabet[i - len(SPECIALS)])
      else:
        out.append("?")
    return "".join(out)

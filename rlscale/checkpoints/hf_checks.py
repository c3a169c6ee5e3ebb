"""A Hugging Face weights folder checked against the model it must load, from its headers alone.

The resolve step runs these before anything is compiled or loaded: config.json readable and
complete, the architecture the run planned for, every tensor the model needs present with its
shape and a float dtype, no tensor the model would ignore (a layer config.json does not have),
special ids inside the vocabulary. Whether the values are finite is checked as each tensor loads
(rlscale/checkpoints/hf.py: one reduction per tensor).
"""

from __future__ import annotations

import numpy as np

from rlscale.checkpoints import hf, safetensors_io
from rlscale.checkpoints.safetensors_io import CheckpointError
from rlscale.models import CausalLM, ModelConfig

# What fixes the tensors' names and shapes: a folder that differs in one of these is another model.
ARCHITECTURE = ("family", "vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "mlp_dim", "tie_embeddings")
_FLOATS = {np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16),
           safetensors_io.DTYPES["BF16"]}
# Buffers older transformers versions saved beside the weights; nothing reads them.
_BUFFERS = ("rotary_emb.inv_freq",)
_SHOWN = 4  # names listed before "and N more"


def _listed(names: list[str]) -> str:
  more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
  return ", ".join(names[:_SHOWN]) + more


def folder_errors(field: str, folder: str, model_cls=CausalLM,
                  model: ModelConfig | None = None) -> list[str]:
  """The problems of `folder` (the value of config field `field`) as the weights of `model_cls`:
  its config.json, against `model` (the run's model) when given, and its tensors."""
  where = f"{field}={folder!r}"
  try:
    own = hf.config_from_folder(folder)
    tensors = safetensors_io.SafetensorsFolder(folder)
  except (CheckpointError, OSError) as e:
    return [f"{where}: {e}"]
  errors = []
  if model is not None:
    differ = [f"{k}={getattr(own, k)} (the run's model: {getattr(model, k)})"
              for k in ARCHITECTURE if getattr(own, k) != getattr(model, k)]
    if differ:
      return [f"{where}: its config.json is another model: {', '.join(differ)}"]
  ids = [("bos_token_id", own.bos_id), ("pad_token_id", own.pad_id)]
  ids += [("eos_token_id", e) for e in own.eos_ids]
  errors += [f"{where}: config.json's {name}={i} is outside the vocabulary "
             f"(vocab_size={own.vocab_size})" for name, i in ids
             if i is not None and not 0 <= i < own.vocab_size]
  expected = hf.expected_tensors(model_cls, own)
  have = {n: tensors.shape(n) for n in tensors.keys()}
  missing = [n for n in expected if n not in have]
  if missing:
    errors.append(f"{where} lacks {len(missing)} tensor(s) the model needs: {_listed(missing)}")
  wrong = [f"{n} is {list(have[n])}, config.json implies {list(s)}"
           for n, s in expected.items() if n in have and have[n] != s]
  if wrong:
    errors.append(f"{where}: {len(wrong)} tensor(s) of the wrong shape: {_listed(wrong)}")
  # A critic reads a policy folder's backbone: its heads (lm_head, a reward model's score)
  # are not the value head and are left alone; anything else unread is a mismatch.
  heads_read = model_cls is CausalLM
  extra = [n for n in have if n not in expected and not n.endswith(_BUFFERS)
           and (heads_read or n.startswith("model."))]
  if extra:
    errors.append(f"{where} holds {len(extra)} tensor(s) its config.json has no place for "
                  f"(num_hidden_layers={own.num_layers}): {_listed(extra)}")
  not_float = [f"{n} ({tensors.dtype(n)})" for n in expected if n in have
               and tensors.dtype(n) not in _FLOATS]
  if not_float:
    errors.append(f"{where}: tensor(s) of a non-float dtype: {_listed(not_float)}")
  return errors

"""Checks of one config value, each adding an error that names the field and its value: an
integer, a finite number, a bool, a folder a run writes, a Hugging Face folder it reads. The
sections of the schema (rlscale/config/schema.py) check their fields with them, and the
evaluation metrics a target may name are listed here.
"""

from __future__ import annotations

import math
import os

__all__ = ["EVAL_METRICS", "REFERENCE_METRICS", "FRACTIONS", "check_directory", "integer",
           "number", "boolean", "hf_folder", "has_weights"]

# What rlscale.trainer.evaluation.Evaluator reports: eval/<key>_greedy with eval.greedy, and
# eval/<key>_sampled with eval.sampled (tests/unit/resolve/test_bad_configs.py reads the names from
# rlscale/trainer/evaluation.py).
_EVAL_KEYS = ("accuracy", "reward", "response_len", "finished")
EVAL_METRICS = tuple(f"eval/{k}_{m}" for m in ("greedy", "sampled") for k in _EVAL_KEYS)
# With eval.reference: the reference response's mean log-likelihood and probability.
REFERENCE_METRICS = ("eval/reference_logprob", "eval/reference_prob")
FRACTIONS = ("accuracy", "finished", "reference_prob")  # metrics in [0, 1]


def integer(errors: list[str], field: str, value, minimum: int = 1, why: str = "") -> None:
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    errors.append(f"{field}={value!r} must be {allowed}{why}")


def number(errors: list[str], field: str, value, allowed: str, ok) -> None:
  """`value` is a finite number for which `ok(value)` holds, else an error saying `allowed`."""
  if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
      or not ok(value)):
    errors.append(f"{field}={value!r} must be {allowed}")


def boolean(errors: list[str], field: str, value) -> None:
  if not isinstance(value, bool):
    errors.append(f"{field}={value!r} must be True or False")


def check_directory(path, field: str = "--workdir") -> list[str]:
  """Errors of a folder a run creates or reuses: not a file, and creatable and writable."""
  if not isinstance(path, str) or not path:
    return [f"{field}={path!r} must name a directory"]
  if os.path.exists(path) and not os.path.isdir(path):
    return [f"{field}={path!r} is a file; give a directory (created when missing)"]
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return [f"{field}={path!r} cannot be created: {existing!r} is a file"]
  if not os.access(existing, os.W_OK | os.X_OK):
    return [f"{field}={path!r}: {existing!r} is not writable"]
  return []


def has_weights(folder: str) -> bool:
  return any(n.endswith(".safetensors") for n in os.listdir(folder))


def hf_folder(errors: list[str], field: str, folder, *, weights: bool = False,
              tokenizer: bool = False) -> bool:
  """A Hugging Face folder with config.json (and the weights, the tokenizer when asked)."""
  need = ["config.json"] + (["tokenizer.json"] if tokenizer else [])
  if not isinstance(folder, str) or not os.path.isdir(folder):
    what = "is not a directory" if os.path.exists(str(folder)) else "does not exist"
    errors.append(f"{field}={folder!r} {what}: give a Hugging Face folder with "
                  f"{', '.join(need)}{' and *.safetensors' if weights else ''}")
    return False
  missing = [n for n in need if not os.path.isfile(os.path.join(folder, n))]
  if weights and not has_weights(folder):
    missing.append("*.safetensors")
  if missing:
    errors.append(f"{field}={folder!r} lacks {', '.join(missing)} (a Hugging Face checkpoint "
                  f"folder needs them)")
  return not missing

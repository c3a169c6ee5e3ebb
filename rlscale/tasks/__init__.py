"""Tasks: problems, prompts and verifiers. `make(config.task)` builds one by name (the task
section's values are checked first, by the schema: rlscale/config/schema.py)."""

from __future__ import annotations

from typing import Any, Mapping

from rlscale.tasks.base import Problem, Score, Task, Tokenizer

NAMES = ("arithmetic", "chain_sum", "files", "tfds_math", "reasoning_gym")
EMBEDDED = ("arithmetic", "chain_sum")  # built in, with their own character tokenizer


def make(cfg: Mapping[str, Any], tokenizer: Tokenizer | None = None) -> Task:
  """The task named by `cfg.name`; tasks on text take the checkpoint's tokenizer."""
  name = cfg["name"]
  if name == "arithmetic":
    from rlscale.tasks.arithmetic import Arithmetic
    return Arithmetic(digits=cfg["digits"], ops=cfg["ops"], mul_digits=cfg["mul_digits"],
                      num_eval=cfg["num_eval"], seed=cfg["seed"],
                      partial_credit=cfg["partial_credit"], restate=cfg["restate"])
  if name == "chain_sum":
    from rlscale.tasks.chain_sum import ChainSum
    return ChainSum(terms=cfg["terms"], digits=cfg["digits"], flaw=cfg["flaw"],
                    num_eval=cfg["num_eval"], seed=cfg["seed"])
  if name in ("files", "tfds_math", "reasoning_gym"):
    if tokenizer is None:
      raise ValueError(f"task.name={name!r} needs a tokenizer: set model.hf_checkpoint")
    if name == "files":
      from rlscale.tasks.files import FileTask
      return FileTask(cfg, tokenizer)
    if name == "tfds_math":
      from rlscale.tasks.tfds_math import TfdsMath
      return TfdsMath(cfg, tokenizer)
    from rlscale.tasks.reasoning_gym import ReasoningGym
    return ReasoningGym(cfg, tokenizer)
  raise ValueError(f"task.name={name!r}; known: {NAMES}")


__all__ = ["EMBEDDED", "NAMES", "Problem", "Score", "Task", "Tokenizer", "make"]

"""Tasks: problems, prompts and verifiers. `make(config.task)` builds one by name; `field_errors`
finds the task section's own errors first."""

from __future__ import annotations

from typing import Any, Mapping

from rlscale.tasks.base import Problem, Score, Task, Tokenizer

NAMES = ("arithmetic", "chain_sum", "files", "tfds_math", "reasoning_gym")
EMBEDDED = ("arithmetic", "chain_sum")  # built in, with their own character tokenizer


def field_errors(cfg: Mapping[str, Any], hf_checkpoint: str = "") -> list[str]:
  """The errors of the task section's own fields, before anything is built or read (a text
  task's rows are read when the run builds it; the constructors check what is left)."""
  from rlscale.config.fields import boolean, integer
  name = cfg["name"]
  if name not in NAMES:
    return [f"task.name={name!r} is not one of {NAMES}"]
  errors: list[str] = []
  integer(errors, "task.num_eval", cfg["num_eval"])
  integer(errors, "task.seed", cfg["seed"], minimum=0)
  if name not in EMBEDDED:
    if not hf_checkpoint:
      errors.append(f"task.name={name!r} needs a tokenizer: set model.hf_checkpoint")
    for f in ("max_prompt_len", "max_answer_len") + (("rg_size",) if name == "reasoning_gym"
                                                     else ()):
      integer(errors, f"task.{f}", cfg[f])
    if name == "files":  # the paths and fields
      from rlscale.tasks import files
      errors += files.check(cfg)
  else:  # an embedded task sizes its prompts and answers itself: a length set here is unread
    from rlscale.config.sections import task as section
    unread = [f"task.{f}={cfg[f]!r}" for f in ("max_prompt_len", "max_answer_len")
              if f in cfg and cfg[f] != section(name)[f]]
    if unread:
      errors.append(f"{', '.join(unread)}: the {name} task sizes its prompts and answers itself "
                    f"(from its digits and terms) and does not read it; leave it unset")
  if name == "arithmetic":
    integer(errors, "task.digits", cfg["digits"])
    integer(errors, "task.mul_digits", cfg["mul_digits"])
    boolean(errors, "task.partial_credit", cfg["partial_credit"])
    ops = cfg["ops"]
    if not errors and isinstance(ops, str) and ops and not set(ops) - set("+-*"):
      n, m = 10 ** cfg["digits"], 10 ** cfg["mul_digits"]
      space = sum({"+": n * n, "-": n * (n + 1) // 2, "*": n * m}[op] for op in set(ops))
      if cfg["num_eval"] > space // 2:  # the held-out set and training draw from them
        errors.append(f"task.num_eval={cfg['num_eval']} leaves too few training problems: "
                      f"task.digits={cfg['digits']}, task.ops={ops!r} give {space} problems; "
                      f"use at most {space // 2}")
  return errors


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


__all__ = ["EMBEDDED", "NAMES", "Problem", "Score", "Task", "Tokenizer", "field_errors", "make"]

"""Tasks on free text for real checkpoints: chat-templated prompts, boxed final answers."""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import numpy as np

from rlscale.tasks.base import Problem, Score, Task, Tokenizer
from rlscale.tasks import graders

INSTRUCTION = "Put the final answer in \\boxed{}."


class TextTask(Task):
  """Questions and reference answers from a source; the checkpoint's tokenizer and template.

  Subclasses give `_train_size`, `_train_item(i)`, `_eval_items()`. Prompts longer than
  `max_prompt_len` tokens are skipped (deterministically), never truncated.

  The prompt is the problem, then `task.instruction` on its own line (empty: none), as the user
  turn of the checkpoint's chat template after `task.system_prompt` as a system turn (empty:
  none); `task.enable_thinking`, when set, reaches the template (Qwen3's thinking switch).
  Configs written before those fields existed read their old behaviour (`cfg.get` defaults).
  """

  def __init__(self, cfg: Mapping[str, Any], tokenizer: Tokenizer):
    self.tokenizer = tokenizer
    self.seed = int(cfg["seed"])
    self.num_eval = int(cfg["num_eval"])
    self.max_prompt_len = int(cfg["max_prompt_len"])
    self.max_answer_len = int(cfg["max_answer_len"])
    self.system_prompt = cfg["system_prompt"] or ""
    instruction = cfg["instruction"]
    self.instruction = INSTRUCTION if instruction is None else instruction
    thinking = cfg["enable_thinking"]
    self.enable_thinking = None if thinking is None else bool(thinking)
    # task.grader (tasks/graders.py); configs older than the field graded as 'numeric' does
    self.grade = graders.make({"grader": cfg["grader"],
                               "grader_regex": cfg["grader_regex"],
                               "grader_timeout_s": cfg["grader_timeout_s"]})

  # --- what a source provides ---
  _train_size: int

  def _train_item(self, i: int) -> Problem:
    raise NotImplementedError

  def _eval_items(self) -> list[Problem]:
    raise NotImplementedError

  # --- prompts and scoring ---
  def prompt_text(self, problem: Problem) -> str:
    question = problem.question.strip()
    content = f"{question}\n{self.instruction}" if self.instruction else question
    if getattr(self.tokenizer, "chat_template", None):
      system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
      kwargs = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
      return self.tokenizer.apply_chat_template(
          system + [{"role": "user", "content": content}], add_generation_prompt=True, **kwargs)
    first = f"{self.system_prompt}\n" if self.system_prompt else ""
    return f"{first}Question: {content}\nAnswer:"

  def _bos_ids(self) -> list[int]:
    """The BOS id prepended to a prompt without a chat template (a template writes its own)."""
    bos = getattr(self.tokenizer, "bos_token", None)
    if bos and not getattr(self.tokenizer, "chat_template", None):
      bos_id = self.tokenizer.encode(bos, add_special_tokens=False)
      return bos_id if len(bos_id) == 1 else []
    return []

  def prompt_ids(self, problem: Problem) -> list[int]:
    return self._bos_ids() + self.tokenizer.encode(self.prompt_text(problem),
                                                   add_special_tokens=False)

  def prompt_lengths(self, problems: Sequence[Problem]) -> list[int]:
    """len(prompt_ids(p)) of each problem, through the tokenizer's `encode_batch(texts,
    add_special_tokens=False) -> list[list[int]]` when it has one (one call for a whole file)."""
    texts = [self.prompt_text(p) for p in problems]
    batch = getattr(self.tokenizer, "encode_batch", None)
    if callable(batch):
      ids = batch(texts, add_special_tokens=False)
    else:
      ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    extra = len(self._bos_ids())
    return [len(i) + extra for i in ids]

  def demonstration(self, problem: Problem) -> str:
    return f"\\boxed{{{problem.answer}}}"

  def verify(self, response: str, problem: Problem) -> Score:
    """The configured grader's score of the response against the reference answer."""
    return self.grade(response, problem.answer)

  def _fits(self, p: Problem) -> bool:
    return len(self.prompt_ids(p)) <= self.max_prompt_len

  # --- the stream ---
  @functools.lru_cache(maxsize=4)
  def _order(self, epoch: int) -> np.ndarray:
    return np.random.default_rng([self.seed, epoch]).permutation(self._train_size)

  def problem(self, index: int) -> Problem:
    """Item `index` of a seeded shuffle, epoch after epoch; an overlong prompt is replaced by
    the next item of a fixed probe sequence."""
    for attempt in range(100):
      j = index + attempt * 7919
      p = self._train_item(int(self._order(j // self._train_size)[j % self._train_size]))
      if self._fits(p):
        return p
    raise ValueError(f"task: 100 prompts in a row exceed max_prompt_len={self.max_prompt_len}")

  @functools.cached_property
  def _eval(self) -> list[Problem]:
    return [p for p in self._eval_items() if self._fits(p)][:self.num_eval]

  def eval_problems(self) -> list[Problem]:
    return list(self._eval)

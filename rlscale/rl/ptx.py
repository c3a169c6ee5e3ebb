"""PPO-ptx (Ouyang et al. 2022, InstructGPT eq. 2): a supervised loss on demonstrations mixed
into the policy's loss, so that RL does not erode what supervised training taught.

Every optimizer step of the actor adds `rl.ptx_coef` times the mean negative log-likelihood of
`rl.ptx_rows` demonstration tokens' worth of rows to its policy loss:

    loss = policy loss (clipped surrogate, KL, entropy) + ptx_coef * NLL(demonstrations)

The NLL is a token mean over the demonstration rows of that optimizer step, logged on its own
(`actor/ptx_nll`), as is the norm of its gradient (`actor/ptx_grad_norm`). The noise scale and
`grad_norm_rl` measure the RL gradient alone; `grad_norm` is the norm that is clipped, of the sum.

Demonstrations are the task's own (`Task.demonstration` over its training stream, e.g. a worked
solution of a prompt file) or rows of `task.demo_files`. Optimizer step s of the run takes rows
[s * ptx_rows, (s + 1) * ptx_rows) of that stream, each process its share, so a resumed run sees
the same demonstrations as an uninterrupted one.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
import numpy as np
from absl import logging

from rlscale.parallel import distributed
from rlscale.parallel import sharding
from rlscale.rl.update import SequenceBatch
from rlscale.tasks.base import Problem, Task, left_pad, right_pad, turn_end_id


def check(rl: Mapping[str, Any], unit: int) -> list[str]:
  """Errors of the ptx fields; `unit` is batch shards x processes (rows must split over it)."""
  coef, rows = rl["ptx_coef"], rl["ptx_rows"]
  if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
    return [f"rl.ptx_coef={coef!r} must be a number >= 0 (0 turns PPO-ptx off)"]
  if not coef:
    return []
  if isinstance(rows, bool) or not isinstance(rows, int) or rows <= 0 or rows % unit:
    return [f"rl.ptx_rows={rows!r} must be a positive multiple of {unit} (batch shards x "
            f"processes) when rl.ptx_coef > 0"]
  return []


def nll(inputs):
  """Per-token negative log-likelihood of the demonstration tokens, and it as the metric."""
  return -inputs.logp, {"ptx_nll": -inputs.logp}


class Demonstrations:
  """The demonstration rows of each optimizer step, as a SequenceBatch on the mesh.

  `pairs(start, n)` gives (problem, response text) of stream rows [start, start + n): from
  `source` when given (rows of task.demo_files), else the task's own demonstrations.
  """

  def __init__(self, task: Task, rows: int, max_new_tokens: int, mesh, rules,
               source: Sequence[tuple[Problem, str]] | None = None):
    self.task, self.rows, self.max_new_tokens = task, rows, max_new_tokens
    self.mesh, self.rules = mesh, rules
    self.source = source
    self.mine = distributed.process_rows(rows)
    self.cut = 0  # demonstrations longer than the response budget, cut (logged once)

  def pairs(self, start: int, n: int) -> list[tuple[Problem, str]]:
    if self.source is not None:
      return [self.source[i % len(self.source)] for i in range(start, start + n)]
    return [(p, self.task.demonstration(p)) for p in self.task.problems(start, n)]

  def host_rows(self, start: int, n: int):
    """Prompt (left-padded) and demonstration + EOS (right-padded) tokens and masks."""
    tok = self.task.tokenizer
    pairs = self.pairs(start, n)
    prompts = [self.task.prompt_ids(p) for p, _ in pairs]
    answers = [tok.encode(text) + [turn_end_id(tok)] for _, text in pairs]
    cut = sum(len(a) > self.max_new_tokens for a in answers)
    if cut and not self.cut:
      logging.warning("ptx: %d of %d demonstrations exceed rollout.max_new_tokens=%d and are "
                      "cut to it", cut, n, self.max_new_tokens)
    self.cut += cut
    pt, pm = left_pad(prompts, self.task.max_prompt_len, tok.pad_id)
    at, am = right_pad(answers, self.max_new_tokens, tok.pad_id)
    return np.concatenate([pt, at], 1), np.concatenate([pm, am], 1), am

  def batch(self, first_opt_step: int, opt_steps: int) -> SequenceBatch:
    """[opt_steps * rows, T]: the rows of optimizer steps [first, first + opt_steps).

    Each process builds its share of every step's rows, step-major; the update cuts the global
    rows into `opt_steps` blocks in order, so each step trains on `rows` distinct
    demonstrations and every row of the span once (one process: step s gets exactly its own)."""
    parts = [self.host_rows(s * self.rows + self.mine.start, self.mine.stop - self.mine.start)
             for s in range(first_opt_step, first_opt_step + opt_steps)]
    tokens, mask, resp = (np.concatenate(x) for x in zip(*parts))
    put = lambda x: sharding.put_batch(x, self.mesh, self.rules)
    return SequenceBatch(put(tokens), put(mask), put(resp), {})


def steps_taken(state) -> int:
  """The optimizer steps a restored or fresh state has taken (a replicated scalar)."""
  return int(jax.device_get(state.step))

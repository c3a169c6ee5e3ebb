"""Supervised training of the base policy on task demonstrations (`configs/sft.py`).

LLM RL starts from a model with partial skill; this builds one. The result is written as a
Hugging Face folder (`<workdir>/policy`), which the RL configs load like any checkpoint.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from rlscale import models
from rlscale.parallel import distributed
from rlscale.resolve import resolved
from rlscale.rl import optim
from rlscale.parallel import sharding
from rlscale.checkpoints import hf
from rlscale.trainer.evaluation import Evaluator
from rlscale.trainer.loop import Loop, Pending
from rlscale.metrics.writer import write_json
from rlscale.rl.update import (SequenceBatch, TokenInputs, TrainState, UpdateOptions, make_update,
                               policy_forward)
from rlscale.tasks.base import left_pad, right_pad, turn_end_id

DONE = "COMPLETE"  # marker file written last into a finished policy folder


def nll_loss(inputs: TokenInputs):
  """Cross-entropy of the demonstration tokens."""
  return -inputs.logp, {"nll": -inputs.logp, "entropy": inputs.entropy}


def demonstrations(task, problems):
  """Prompt (left-padded) and demonstration + EOS (right-padded) token arrays."""
  prompts = [task.prompt_ids(p) for p in problems]
  stop = turn_end_id(task.tokenizer)
  answers = [task.tokenizer.encode(task.demonstration(p)) + [stop] for p in problems]
  pt, pm = left_pad(prompts, task.max_prompt_len, task.tokenizer.pad_id)
  at, am = right_pad(answers, task.max_answer_len, task.tokenizer.pad_id)
  return pt, pm, at, am


class SFTTrainer:
  """Steps of `sft.batch_size` demonstrations; the loop (rlscale/trainer/loop.py) runs them."""
  sample_key = "examples_seen"

  def __init__(self, run: resolved.Resolved):
    """`run`: the resolved config, its setup (mesh, rules, task) and batch plan."""
    cfg = run.cfg
    self.run, self.cfg, self.workdir = run, cfg, run.workdir
    self.env = env = run.setup
    self.plan = run.plan
    logging.info("batch plan: %s", self.plan.summary_line())
    self.batch_size = self.samples_per_step = self.plan.num_prompts
    self.key = jax.random.key(cfg.seed)
    policy = models.create_sharded(models.CausalLM, env.model_cfg, env.mesh, env.rules,
                                   jax.random.fold_in(self.key, 0))
    self.graphdef, params = nnx.split(policy)
    optimizer, _ = optim.make(cfg.optim, batch=self.batch_size,
                              total_responses=self.plan.total_responses,
                              responses_per_step=self.batch_size)
    forward = policy_forward(self.graphdef, chunk=cfg.train.logprob_chunk,
                             remat=cfg.train.remat)
    self.update = make_update(forward, optimizer, nll_loss, UpdateOptions(
        microbatch=self.plan.main.microbatch, max_len=env.task.max_answer_len, shuffle=False),
        mesh=env.mesh, rules=env.rules)
    self.train_state = self.update.place(
        TrainState(params, jax.jit(optimizer.init)(params), jnp.zeros((), jnp.int32)))
    self.evaluator = Evaluator(env.task, self.graphdef, env.mesh, env.rules,
                               max_new_tokens=env.task.max_answer_len,
                               generation_batch=cfg.eval.generation_batch, sampled=False)
    self.rows = distributed.process_rows(self.batch_size)
    self.counters = {"examples_seen": 0}

  def state(self):
    return self.train_state

  def load(self, state, meta) -> None:
    self.train_state = state

  def meta(self) -> dict:
    return {}

  def fill_counters(self, missing: list[str]) -> None:
    raise ValueError(f"the checkpoint lacks the counters {missing}")

  def begin(self, step: int) -> float:
    return time.time()

  def complete(self, step: int, t_begin: float, t_start: float) -> Pending:
    """Step k trains on problems [(k-1) * batch, k * batch) of the stream."""
    first = (step - 1) * self.batch_size
    problems = self.env.task.problems(first + self.rows.start, self.rows.stop - self.rows.start)
    pt, pm, at, am = demonstrations(self.env.task, problems)
    mesh, rules = self.env.mesh, self.env.rules
    seq = SequenceBatch(sharding.put_batch(np.concatenate([pt, at], 1), mesh, rules),
                        sharding.put_batch(np.concatenate([pm, am], 1), mesh, rules),
                        sharding.put_batch(am, mesh, rules), {})
    t_update = time.time()
    self.train_state, metrics = self.update(self.train_state, seq,
                                            jax.random.fold_in(self.key, step))
    self.counters["examples_seen"] += self.batch_size
    return Pending(step, {"sft": metrics}, {}, {"data": t_update - t_begin}, t_start, t_update)

  def metrics(self, p: Pending, fetched) -> dict:
    return {f"sft/{k}": v for k, v in fetched["sft"].items()}

  def rates(self, p: Pending, wall: float) -> dict:
    return {"throughput/examples_per_s": self.batch_size / wall}

  def evaluate(self, step: int, stop=None) -> dict:
    return self.evaluator(self.train_state.params, jax.random.fold_in(self.key, 10**6 + step),
                          stop)

  def progress(self, row: dict, last_eval: dict) -> dict:
    return {"loss": float(row["sft/loss"]), "eval acc": last_eval.get("eval/accuracy_greedy")}

  def finish(self, counters: dict, last_eval: dict) -> dict:
    """Export the policy (marked complete last) and write summary.json."""
    out = os.path.join(self.workdir, "policy")
    tok = self.env.task.tokenizer  # an exported policy generates with the task's special tokens
    hf.save_policy(nnx.merge(self.graphdef, self.train_state.params), out,
                   bos_id=getattr(tok, "bos_id", None), eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    summary = {"kind": "sft", "steps": self.plan.num_steps, "batch": self.plan.describe(),
               "wall_time": counters["wall_time"], **last_eval}
    write_json(os.path.join(self.workdir, "summary.json"), summary)
    if jax.process_index() == 0:
      with open(os.path.join(out, DONE), "w") as f:
        f.write("ok\n")
    return summary


def run(run: resolved.Resolved) -> dict:
  trainer = SFTTrainer(run)
  loop = Loop(trainer, run.cfg, run.workdir, trainer.plan.num_steps, eval_at_start=False,
              written=run.raw)
  return trainer.finish(*loop.run())

"""Supervised training of the base policy on task demonstrations (`configs/sft.py`).

LLM RL starts from a model with partial skill; this builds one. The result is written as a
Hugging Face folder (`<workdir>/policy`), which the RL configs load like any checkpoint.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from rlscale import distributed, experiment, models, optim, sharding
from rlscale.checkpointing import Checkpointer
from rlscale.checkpoints import hf
from rlscale.evaluation import Evaluator
from rlscale.metrics_writer import MetricsWriter, Progress, write_json
from rlscale.rl.losses import entropy
from rlscale.rl.update import SequenceBatch, TokenInputs, TrainState, make_update, policy_forward
from rlscale.tasks.base import left_pad, right_pad

DONE = "COMPLETE"  # marker file written last into a finished policy folder


def nll_loss(inputs: TokenInputs):
  """Cross-entropy of the demonstration tokens."""
  return -inputs.logp, {"nll": -inputs.logp, "entropy": entropy(inputs.logits)}


def demonstrations(task, problems):
  """Prompt (left-padded) and demonstration + EOS (right-padded) token arrays."""
  prompts = [task.prompt_ids(p) for p in problems]
  answers = [task.tokenizer.encode(task.demonstration(p)) + [task.tokenizer.eos_ids[0]]
             for p in problems]
  pt, pm = left_pad(prompts, task.max_prompt_len, task.tokenizer.pad_id)
  at, am = right_pad(answers, task.max_answer_len, task.tokenizer.pad_id)
  return pt, pm, at, am


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict:
  env = experiment.setup(cfg)
  mesh, rules, task = env.mesh, env.rules, env.task
  experiment.prepare_workdir(workdir, cfg)
  s = cfg.sft
  steps = cfg.train.num_steps
  key = jax.random.key(cfg.seed)
  policy = models.create_sharded(models.CausalLM, env.model_cfg, mesh, rules,
                                 jax.random.fold_in(key, 0))
  graphdef, params = nnx.split(policy)
  optimizer, _ = optim.make(cfg.optim, batch=s.batch_size, total_responses=steps * s.batch_size,
                            responses_per_step=s.batch_size)
  state = TrainState(params, jax.jit(optimizer.init)(params), jnp.zeros((), jnp.int32))
  update = make_update(policy_forward(graphdef), optimizer, nll_loss, num_minibatches=1, num_epochs=1,
                       microbatch=s.microbatch, aggregation="token-mean",
                       max_len=task.max_answer_len, mesh=mesh, rules=rules, shuffle=False)
  evaluator = Evaluator(task, graphdef, mesh, rules, max_new_tokens=task.max_answer_len,
                        generation_batch=cfg.eval.generation_batch, sampled=False)

  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), cfg.train.keep_checkpoints,
                      cfg.train.async_checkpoint)
  start = ckpt.latest_step() or 0
  state = update.place(state)
  if start:
    state, meta = ckpt.restore(start, state)
    logging.info("resumed from step %d", start)
  writer = MetricsWriter(workdir, resume_step=start, tensorboard=cfg.train.tensorboard)
  progress = Progress(steps, cfg.train.log_every, start)
  rows = distributed.process_rows(s.batch_size)
  t0 = time.time()
  last_eval = {}
  try:
    for step in range(start + 1, steps + 1):
      # Step k trains on problems [(k-1) * batch, k * batch) of the stream: the data position.
      first = (step - 1) * s.batch_size
      problems = task.problems(first + rows.start, rows.stop - rows.start)
      pt, pm, at, am = demonstrations(task, problems)
      batch = SequenceBatch(
          sharding.put_batch(np.concatenate([pt, at], 1), mesh, rules),
          sharding.put_batch(np.concatenate([pm, am], 1), mesh, rules),
          sharding.put_batch(am, mesh, rules), {})
      state, metrics = update(state, batch, jax.random.fold_in(key, step))
      metrics = {f"sft/{k}": v for k, v in jax.device_get(metrics).items()}
      if not np.isfinite(metrics["sft/loss"]):
        raise FloatingPointError(f"step {step}: loss is {metrics['sft/loss']}; "
                                 f"the last checkpoint (step {ckpt.latest_step()}) is intact")
      every = cfg.train.eval_every
      if step == steps or (every and step % every == 0):
        last_eval = evaluator(state.params, jax.random.fold_in(key, 10**6 + step))
        metrics.update(last_eval)
      metrics.update(wall_time=time.time() - t0, examples_seen=step * s.batch_size)
      writer.write(step, metrics)
      progress.update(step, {"loss": float(metrics["sft/loss"]),
                             "eval acc": last_eval.get("eval/accuracy_greedy")})
      every = cfg.train.checkpoint_every
      if step == steps or (every and step % every == 0):
        ckpt.save(step, state, {"step": step})
  finally:
    ckpt.close()  # completes the saves it began, also when interrupted
    writer.close()
  policy = nnx.merge(graphdef, state.params)
  out = os.path.join(workdir, "policy")
  hf.save_policy(policy, out)
  summary = {"kind": "sft", "steps": steps, "wall_time": time.time() - t0, **last_eval}
  write_json(os.path.join(workdir, "summary.json"), summary)
  if jax.process_index() == 0:
    with open(os.path.join(out, DONE), "w") as f:
      f.write("ok\n")
  return summary

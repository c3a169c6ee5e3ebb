"""Held-out pass@1 and pass@k of a policy: how much a task leaves to RL.

    python analysis/pass_at_k.py --config=configs/grpo_chain_sum.py runs/base/sft-<hash>/policy
    python analysis/pass_at_k.py --config=configs/grpo_chain_sum.py /tmp/run/policy --k=8

The config gives the task (and the response budget, rollout.max_new_tokens, else the task's
max_answer_len); each POLICY is a Hugging Face folder (a base policy, a run's `policy/`).
Prints one JSON line per policy: greedy accuracy, sampled (temperature 1) pass@1 as the mean
over k samples per problem, pass@k (any of the k right), and the mean length in tokens (EOS
included) of correct sampled responses. With n = k samples the pass@k estimate is the plain
share of problems with a right sample (Chen et al. 2021's estimator at n = k).
"""

from __future__ import annotations

import argparse
import json



def measure(task, policy, mesh, rules, *, k: int, max_new_tokens: int, seed: int = 0,
            generation_batch: int = 512) -> dict:
  import jax
  import numpy as np
  from flax import nnx
  from rlscale.trainer import rollout
  from rlscale.sampling import Sampler, SamplingParams, generate

  graphdef, state = nnx.split(policy)
  tok = task.tokenizer
  problems = task.eval_problems()
  out = {"problems": len(problems), "k": k}
  for name, temperature, group in (("greedy", 0.0, 1), ("sampled", 1.0, k)):
    sampler = Sampler(graphdef, SamplingParams(max_new_tokens=max_new_tokens,
                                               temperature=temperature, eos_ids=tok.eos_ids,
                                               pad_id=tok.pad_id), mesh, rules)
    ptoks, pmask = rollout.prompts(task, problems, group)
    rows = len(problems) * group
    gb = min(generation_batch, rows)
    total = -(-rows // gb) * gb  # whole generation batches; the padding rows are dropped
    ptoks = np.concatenate([ptoks, np.repeat(ptoks[:1], total - rows, axis=0)])
    pmask = np.concatenate([pmask, np.repeat(pmask[:1], total - rows, axis=0)])
    r = generate(sampler, state, ptoks, pmask, jax.random.key(seed), gb)
    toks, mask = (np.asarray(x)[:rows] for x in rollout.host_rollout(r))
    repeated = [p for p in problems for _ in range(group)]
    _, correct, _ = rollout.score(task, repeated, toks, mask, tok.eos_ids)
    lengths = mask.sum(axis=1)
    if name == "greedy":
      out["accuracy_greedy"] = float(correct.mean())
      out["length_greedy"] = float(lengths.mean())
    else:
      by_problem = correct.reshape(len(problems), k)
      out["pass_at_1"] = float(by_problem.mean())
      out[f"pass_at_{k}"] = float(by_problem.any(axis=1).mean())
      out["length_sampled"] = float(lengths.mean())
      out["length_correct"] = float(lengths[correct].mean()) if correct.any() else None
  return out


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("policies", nargs="+", help="Hugging Face folders of policies")
  ap.add_argument("--config", required=True, help="experiment config (its task section)")
  ap.add_argument("--k", type=int, default=8, help="samples per held-out problem")
  ap.add_argument("--seed", type=int, default=0, help="sampling seed")
  args = ap.parse_args(argv)
  if args.k < 1:
    ap.error(f"--k={args.k} must be >= 1")

  from rlscale import tasks
  from rlscale.config import files as config_files
  from rlscale.parallel import sharding
  from rlscale.checkpoints import hf, hf_checks
  try:  # every input checked before a policy loads: one line naming what is wrong
    cfg = config_files.load(args.config)
    task = tasks.make(cfg.task)
  except (FileNotFoundError, ValueError, TypeError) as e:
    ap.error(f"--config={args.config}: {e}")
  bad = [problem for folder in args.policies
         for problem in hf_checks.folder_errors("policy", folder)]
  if bad:
    ap.error("; ".join(bad))
  budget = cfg.rollout.max_new_tokens if "rollout" in cfg else task.max_answer_len
  mesh = sharding.make_mesh(tuple(cfg.mesh.shape))
  rules = sharding.rules_from_config(cfg.mesh.rules)
  for folder in args.policies:
    policy, _ = hf.load_policy(folder, mesh, rules)
    row = measure(task, policy, mesh, rules, k=args.k, max_new_tokens=budget, seed=args.seed)
    print(json.dumps({"policy": folder, **row}), flush=True)


if __name__ == "__main__":
  main()

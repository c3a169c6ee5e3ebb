"""How many of a study's runs an hour buys: a fixed slice of the CPU study, before and after.

    python benchmarks/study_throughput.py --before=REV            # the slice at REV, then here
    python benchmarks/study_throughput.py --slice=scan --before=REV   # 5 rates at one batch
    python benchmarks/study_throughput.py --slice=scan --tiny     # the tests' shape, seconds

`--slice=study` (the default) is the shipped study's verdict runs of GRPO on the chained-sum
testbed at three batches (P = 1, 2, 8 of G = 8: B = 8, 16, 64), each at its chosen rate and at
the reference batch's (docs/study's choices), three seeds, plus PPO at one batch (P = 8 of
G = 4) at its chosen rate, three seeds: 18 runs of 2,560 (GRPO) and 3,072 (PPO) responses,
evaluated every 128. `--slice=scan`: five learning rates at P = 2, one seed, one at a time
(what a rate scan compiles). Each side runs the slice as sweeps of its own code
(launch/sweep.py, in a git worktree of REV as benchmarks/same_numbers.py does, or this
checkout), `--parallel` points at a time, each on its own cores, from an empty compilation
cache and a base policy built beforehand (not timed). The side "after" uses what this
checkout offers a study: evaluation in stages (--after_overrides) and runs side by side
(--vectorize, --max_lanes); "before" runs the points as the study did.

`--slice=lanes --lanes=1,4,10`: this checkout alone, one study point (P = 2, G = 8, 2,560
responses, evaluation in stages) at S seeds side by side in one process on one core, against
the same point alone (S = 1): seconds per run and the speedup, from a warm compilation cache.

Reported per side: runs per hour (runs / wall time), CPU-seconds per run (the processes'
user + system time), compile seconds (XLA's, from the runs' logs: JAX_LOG_COMPILES), the
evaluation's share of the steps' time and the held-out rows scored per run. The last line is
one JSON object with `runs_per_hour`, `runs_per_hour_before` and their `speedup`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

from same_numbers import checkout  # this folder is on the path of a script run from it

GRPO, PPO = "configs/grpo_chain_sum.py", "configs/ppo_chain_sum.py"
SAMPLED = {"eval.greedy": False, "eval.sampled": True, "target.metric": "eval/accuracy_sampled",
           "target.value": 0.41}  # the shipped study's target
GRPO_RATES = {1: 7.07e-05, 2: 0.000141, 8: 0.000283}  # docs/study/study.json's choices
PPO_P, PPO_RATE = 8, 0.0002
SEEDS = (3, 4, 5)
AFTER = {"eval.adaptive": True, "eval.generation_batch": 125}

_CONFIG = '''"""A benchmark's slice: {base} with one sweep of the points below."""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "slice_base", os.path.join({tree!r}, {base!r}))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
POINTS = {points!r}


def get_config(arg=None):
  return _base.get_config(arg)


def sweeps(arg=None):
  return {{"slice": POINTS}}
'''


def grpo_points(extra: dict) -> list[dict]:
  common = {"g": 8, "responses": 2560, "train.eval_every_responses": 128, **SAMPLED,
            "optim.lr_scaling": "none", "optim.reference_batch": 16, **extra}
  out = []
  for p, lr in GRPO_RATES.items():
    for rate in sorted({lr, GRPO_RATES[2]}):
      out += [{"p": p, "lr": rate, "seed": s, **common} for s in SEEDS]
  return out


def ppo_points(extra: dict) -> list[dict]:
  return [{"p": PPO_P, "critic.warmup_steps": 16, "optim.lr": PPO_RATE, "seed": s, "g": 4,
           "responses": 3072, "rl.num_minibatches": 1, "critic.num_minibatches": 1,
           "train.eval_every_responses": 128, **SAMPLED, "optim.lr_scaling": "none",
           "optim.reference_batch": 32, **extra} for s in SEEDS]


def scan_points(extra: dict, tiny: bool = False) -> list[dict]:
  shape = ({"g": 4, "responses": 32, "train.eval_every_responses": 16,
            "optim.reference_batch": 8, "rl.microbatch": "auto"} if tiny else
           {"g": 8, "responses": 512, "train.eval_every_responses": 128,
            "optim.reference_batch": 16})
  return [{"p": 2, "lr": lr, "seed": 0, **shape, **SAMPLED, "optim.lr_scaling": "none", **extra}
          for lr in (5e-5, 7.07e-05, 0.0001, 0.000141, 0.0002)[:2 if tiny else 5]]


def _children_cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


def run_side(tree: str, out: str, sweeps: list[tuple[str, list[dict]]], parallel: int,
             flags: list[str], base_cache: str, arg: str = "") -> dict:
  """Run each (config, points) sweep with `tree`'s code (its config file's `arg`); the side's
  figures."""
  env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu", JAX_LOG_COMPILES="1",
             RLSCALE_COMPILATION_CACHE=os.path.join(out, "xla_cache"))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("XLA_FLAGS", None)
  runs, wall, cpu = 0, 0.0, 0.0
  for i, (base, points) in enumerate(sweeps):
    points = [{**p, "init.cache_dir": base_cache} for p in points]
    path = os.path.join(out, f"slice{i}.py")
    with open(path, "w") as f:
      f.write(_CONFIG.format(base=base, tree=tree, points=points))
    workdir = os.path.join(out, f"sweep{i}")
    # The base policy first, untimed (a study builds it once; the base is cached).
    config = f"{path}:{arg}" if arg else path
    subprocess.run([sys.executable, os.path.join(tree, "launch", "main.py"), f"--config={config}",
                    f"--config.init.cache_dir={base_cache}", "--base_policy_only",
                    f"--workdir={os.path.join(out, 'base_run')}"],
                   cwd=tree, env=env, check=True, capture_output=True)
    argv = [sys.executable, os.path.join(tree, "launch", "sweep.py"), f"--config={config}",
            "--sweep=slice", f"--workdir={workdir}", f"--parallel={parallel}", *flags]
    cpu0, t0 = _children_cpu(), time.time()
    p = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    wall += time.time() - t0
    cpu += _children_cpu() - cpu0
    if p.returncode:
      raise SystemExit(f"study_throughput.py: the sweep of {base} failed in {tree} "
                       f"(exit {p.returncode}):\n" + "\n".join(p.stderr.splitlines()[-20:]))
    runs += len(points)
  return {"runs": runs, "wall_s": round(wall, 1), "runs_per_hour": round(runs * 3600 / wall, 1),
          "cpu_s_per_run": round(cpu / runs, 1), **_from_runs(out)}


_COMPILE = re.compile(r"Finished XLA compilation of .* in ([0-9.e-]+) sec")


def _from_runs(out: str) -> dict:
  """Compile seconds (the logs), evaluation share and held-out rows (metrics.jsonl)."""
  compile_s, programs = 0.0, 0
  logs = glob.glob(os.path.join(out, "sweep*", "*", "launch.log"))
  logs += glob.glob(os.path.join(out, "sweep*", "lanes", "*.log"))
  for path in logs:
    with open(path, errors="replace") as f:
      for m in _COMPILE.finditer(f.read()):
        compile_s += float(m.group(1))
        programs += 1
  step_s = eval_s = rows = 0.0
  metrics = glob.glob(os.path.join(out, "sweep*", "*", "metrics.jsonl"))
  for path in metrics:
    with open(path) as f:
      for line in f:
        r = json.loads(line)
        step_s += r.get("time/step", 0.0)
        eval_s += r.get("time/eval", 0.0)
        if "eval/accuracy_sampled" in r:
          rows += r.get("eval/rows", 2000)
  n = max(len(metrics), 1)
  return {"compile_s_per_run": round(compile_s / n, 2), "programs_per_run": round(programs / n, 1),
          "eval_share": round(eval_s / max(step_s, 1e-9), 3),
          "eval_rows_per_run": round(rows / n)}


def lanes_speedup(root: str, counts: list[int], extra: dict, out: str) -> list[dict]:
  """Seconds per run of one point run at S seeds side by side (one process, one core)."""
  env = dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu",
             RLSCALE_COMPILATION_CACHE=os.path.join(out, "xla_cache"))
  env.pop("XLA_FLAGS", None)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  point = grpo_points(extra)[0]
  point.update(p=2, lr=GRPO_RATES[2])
  args = [f"--config.{k}={v}" for k, v in point.items() if k not in ("p", "lr", "seed", "g",
                                                                       "responses")]
  base = [sys.executable, os.path.join(root, "launch", "main.py"),
          f"--config={GRPO}:p=2,g=8,responses=2560,lr={GRPO_RATES[2]}",
          f"--config.init.cache_dir={os.path.join(out, 'base')}", *args]
  subprocess.run(base + ["--base_policy_only", f"--workdir={out}/b"], env=env, check=True,
                 capture_output=True)
  rows = []
  for n in [1] + [c for c in counts if c != 1]:  # S = 1 first: it also warms the cache
    for attempt in ("warm", "timed"):
      d = os.path.join(out, f"s{n}-{attempt}")
      argv = base + ([f"--workdir={d}"] if n == 1 else
                     [f"--seeds={','.join(str(s) for s in range(n))}", f"--workdir={d}/{{seed}}"])
      t0, c0 = time.time(), _children_cpu()
      p = subprocess.run(["taskset", "-c", "0", *argv], env=env, capture_output=True, text=True)
      if p.returncode:
        raise SystemExit(f"study_throughput.py: {n} lanes failed:\n" + p.stderr[-3000:])
      if attempt == "timed":
        rows.append({"lanes": n, "wall_s": round(time.time() - t0, 1),
                     "s_per_run": round((time.time() - t0) / n, 1),
                     "cpu_s_per_run": round((_children_cpu() - c0) / n, 1)})
  for r in rows:
    r["speedup"] = round(rows[0]["s_per_run"] / r["s_per_run"], 2)
    print(json.dumps({"slice": "lanes", **r}), flush=True)
  return rows


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--before", help="the commit to compare with (default: this checkout alone)")
  ap.add_argument("--slice", choices=("study", "scan", "lanes"), default="study")
  ap.add_argument("--lanes", default="1,4,10", help="--slice=lanes: the S to measure")
  ap.add_argument("--parallel", type=int, default=2, help="points at a time (each its cores)")
  ap.add_argument("--vectorize", default="lanes", help="after: launch/sweep.py --vectorize")
  ap.add_argument("--max_lanes", type=int, default=6, help="after: points per process at most")
  ap.add_argument("--after_overrides", default=json.dumps(AFTER),
                  help="after: overrides every point adds (JSON)")
  ap.add_argument("--keep", help="copy each side's run directories and logs here")
  ap.add_argument("--tiny", action="store_true",
                  help="--slice=scan at the tests' shape (two rates, 4 steps): seconds")
  args = ap.parse_args(argv)
  if args.tiny and args.slice != "scan":
    ap.error("--tiny is for --slice=scan")
  root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                        check=True).stdout.strip()
  extra = json.loads(args.after_overrides)
  if args.slice == "lanes":
    with tempfile.TemporaryDirectory() as tmp:
      rows = lanes_speedup(root, [int(c) for c in args.lanes.split(",")], extra, tmp)
    print(json.dumps({"slice": "lanes", "speedup": {r["lanes"]: r["speedup"] for r in rows}}))
    return 0
  make = ({"study": lambda e: [(GRPO, grpo_points(e)), (PPO, ppo_points(e))],
           "scan": lambda e: [(GRPO, scan_points(e, args.tiny))]}[args.slice])
  parallel = 1 if args.slice == "scan" else args.parallel
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    base_cache = os.path.join(tmp, "base")
    sides = ([("before", args.before)] if args.before else []) + [("after", None)]
    trees = {name: checkout(rev, root, tmp, "tree-" + name) for name, rev in sides}
    try:
      for name, _ in sides:
        after = name == "after"
        flags = ([f"--vectorize={args.vectorize}", f"--max_lanes={args.max_lanes}"]
                 if after and args.vectorize and args.slice != "scan" else [])
        out = os.path.join(tmp, "out-" + name)
        os.makedirs(out)
        results[name] = run_side(trees[name], out, make(extra if after else {}), parallel,
                                 flags, base_cache, "tiny" if args.tiny else "")
        print(json.dumps({"side": name, "slice": args.slice, **results[name]}), flush=True)
        if args.keep:
          import shutil
          shutil.copytree(out, os.path.join(args.keep, name), dirs_exist_ok=True,
                          ignore=shutil.ignore_patterns("xla_cache", "checkpoints"))
    finally:
      for name, tree in trees.items():
        if tree != root:
          subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)
  last = {"slice": args.slice, "runs_per_hour": results["after"]["runs_per_hour"],
          "cpu_s_per_run": results["after"]["cpu_s_per_run"]}
  if "before" in results:
    b = results["before"]
    last.update(runs_per_hour_before=b["runs_per_hour"], cpu_s_per_run_before=b["cpu_s_per_run"],
                speedup=round(results["after"]["runs_per_hour"] / b["runs_per_hour"], 2))
  print(json.dumps(last))
  return 0


if __name__ == "__main__":
  sys.exit(main())

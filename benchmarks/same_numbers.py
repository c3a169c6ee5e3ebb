"""Does a refactor change any number? The tiny GRPO, PPO and SFT runs of two commits, compared.

    python benchmarks/same_numbers.py --before=HEAD~3            # against the working tree
    python benchmarks/same_numbers.py --before=abc123 --after=def456

Each commit is checked out into a temporary git worktree and runs the same configs there
(`python launch/main.py --config=... --workdir=...`), with PYTHONPATH set to that tree so that its
own `rlscale` is imported (not the installed one) and its own base-policy cache. Every row of each
run's metrics.jsonl is compared key by key, timing, memory and throughput keys aside (they are
measurements of the machine, not of the computation); the numbers must be *identical* (bit for
bit as JSON writes them), not close. Prints one JSON line per config and exits 1 on any
difference, naming the first differing step and key. Both sides run on this machine in one
invocation, so the comparison holds whatever machine type it runs on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CONFIGS = ("configs/grpo.py:tiny", "configs/ppo.py:tiny", "configs/sft.py:tiny")
# Measurements of the machine, not of the computation.
MACHINE = ("time/", "memory/", "throughput/", "mfu/", "wall_time")


def _tree(rev: str | None, root: str, tmp: str, name: str) -> str:
  """The checkout of `rev` (None: the working tree itself)."""
  if rev is None:
    return root
  path = os.path.join(tmp, name)
  subprocess.run(["git", "-C", root, "worktree", "add", "--detach", "-q", path, rev], check=True)
  return path


def _run(tree: str, config: str, out: str) -> list[dict]:
  env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  workdir = os.path.join(out, config.replace("/", "_").replace(":", "_"))
  cmd = [sys.executable, os.path.join(tree, "launch", "main.py"), f"--config={config}",
         f"--workdir={workdir}", f"--config.init.cache_dir={os.path.join(out, 'base')}"]
  if config.startswith("configs/sft.py"):
    cmd = cmd[:-1]  # an SFT run has no base policy to cache
  p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
  if p.returncode:
    raise SystemExit(f"same_numbers.py: error: {config} failed in {tree} (exit {p.returncode}):\n"
                     + "\n".join(p.stderr.splitlines()[-15:]))
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def _numbers(row: dict) -> dict:
  return {k: v for k, v in row.items() if not k.startswith(MACHINE)}


def compare(before: list[dict], after: list[dict], added: bool = False) -> str | None:
  """None when every row's numbers are identical, else the first difference in words; with
  `added`, keys only the after rows have (metrics a change adds) are not differences."""
  if len(before) != len(after):
    return f"{len(before)} rows before, {len(after)} after"
  for a, b in zip(before, after):
    a, b = _numbers(a), _numbers(b)
    for k in sorted(set(a) if added else set(a) | set(b)):
      if a.get(k, "absent") != b.get(k, "absent"):
        return f"step {a.get('step')}: {k} = {a.get(k, 'absent')} before, {b.get(k, 'absent')} after"
  return None


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--before", required=True, help="the commit before the refactor")
  ap.add_argument("--after", help="the commit after it (default: the working tree)")
  ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configs")
  ap.add_argument("--added", action="store_true",
                  help="metrics only the after runs log are allowed (every key before must match)")
  args = ap.parse_args(argv)
  root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                        check=True).stdout.strip()
  failed = False
  with tempfile.TemporaryDirectory() as tmp:
    trees = {"before": _tree(args.before, root, tmp, "before"),
             "after": _tree(args.after, root, tmp, "after")}
    try:
      for config in args.configs.split(","):
        rows = {side: _run(tree, config, os.path.join(tmp, f"runs-{side}"))
                for side, tree in trees.items()}
        diff = compare(rows["before"], rows["after"], args.added)
        failed |= diff is not None
        evals = [r for r in rows["after"] if "eval/accuracy_greedy" in r]
        first, last = (evals[0], evals[-1]) if evals else ({}, {})
        print(json.dumps(dict(config=config, rows=len(rows["after"]), identical=diff is None,
                              difference=diff, greedy_first=first.get("eval/accuracy_greedy"),
                              greedy_last=last.get("eval/accuracy_greedy"),
                              sampled_last=last.get("eval/accuracy_sampled"))), flush=True)
    finally:
      for side, tree in trees.items():
        if tree != root:
          subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())

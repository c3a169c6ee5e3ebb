"""Does a refactor change any number? The tiny GRPO, PPO and SFT runs of two commits, compared.

    python benchmarks/same_numbers.py --before=HEAD~3            # against the working tree
    python benchmarks/same_numbers.py --before=abc123 --after=def456

Each commit is checked out into a temporary git worktree and runs the same configs there
(`python launch/main.py --config=... --workdir=...`), with PYTHONPATH set to that tree so that its
own `rlscale` is imported (not the installed one) and its own base-policy cache. Every row of each
run's metrics.jsonl is compared key by key, timing, memory and throughput keys aside (they are
measurements of the machine, not of the computation); the numbers must be *identical* (bit for
bit as JSON writes them), not close; `--rtol` accepts a stated relative tolerance instead (a
change that computes the same numbers in another order, e.g. shared-prompt training; with
`--atol` for numbers that are rounding noise around 0) and
`--ignore` key prefixes whose change is the point (each named in the output). Prints one JSON
line per config and exits 1 on any difference, naming the first differing step and key. Both sides run on this machine in one
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


def checkout(rev: str | None, root: str, tmp: str, name: str) -> str:
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


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _close(x, y, rtol: float, atol: float = 0.0) -> bool:
  if x == y:
    return True
  if (rtol or atol) and _number(x) and _number(y):
    return abs(x - y) <= atol + rtol * max(abs(x), abs(y))
  return False


def compare(before: list[dict], after: list[dict], added: bool = False, rtol: float = 0.0,
            ignore: tuple[str, ...] = (), atol: float = 0.0) -> str | None:
  """None when every row's numbers are identical (within atol + rtol x the larger), else the first
  difference in words; with `added`, keys only the after rows have (metrics a change adds) are
  not differences; keys starting with an `ignore` prefix are not compared."""
  if len(before) != len(after):
    return f"{len(before)} rows before, {len(after)} after"
  for a, b in zip(before, after):
    a, b = _numbers(a), _numbers(b)
    for k in sorted(set(a) if added else set(a) | set(b)):
      if ignore and k.startswith(ignore):
        continue
      if not _close(a.get(k, "absent"), b.get(k, "absent"), rtol, atol):
        return f"step {a.get('step')}: {k} = {a.get(k, 'absent')} before, {b.get(k, 'absent')} after"
  return None


def max_relative(before: list[dict], after: list[dict], ignore: tuple[str, ...] = (),
                 atol: float = 0.0):
  """(largest relative difference of a number both sides log, its key), differences within
  `atol` (numbers that are rounding noise around 0) left out."""
  worst = (0.0, None)
  for a, b in zip(before, after):
    a, b = _numbers(a), _numbers(b)
    for k in set(a) & set(b):
      x, y = a[k], b[k]
      if (ignore and k.startswith(ignore)) or not (_number(x) and _number(y)) or (
          abs(x - y) <= atol):
        continue
      worst = max(worst, (abs(x - y) / max(abs(x), abs(y)), k))
  return worst


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--before", required=True, help="the commit before the refactor")
  ap.add_argument("--after", help="the commit after it (default: the working tree)")
  ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated configs")
  ap.add_argument("--added", action="store_true",
                  help="metrics only the after runs log are allowed (every key before must match)")
  ap.add_argument("--rtol", type=float, default=0.0,
                  help="relative tolerance of a number (0: identical, the default)")
  ap.add_argument("--atol", type=float, default=0.0,
                  help="absolute tolerance added to --rtol's (numbers near 0)")
  ap.add_argument("--ignore", default="", help="comma-separated key prefixes not compared")
  args = ap.parse_args(argv)
  root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                        check=True).stdout.strip()
  failed = False
  with tempfile.TemporaryDirectory() as tmp:
    trees = {"before": checkout(args.before, root, tmp, "before"),
             "after": checkout(args.after, root, tmp, "after")}
    try:
      for config in args.configs.split(","):
        rows = {side: _run(tree, config, os.path.join(tmp, f"runs-{side}"))
                for side, tree in trees.items()}
        ignore = tuple(k for k in args.ignore.split(",") if k)
        diff = compare(rows["before"], rows["after"], args.added, args.rtol, ignore, args.atol)
        worst, worst_key = max_relative(rows["before"], rows["after"], ignore, args.atol)
        failed |= diff is not None
        evals = [r for r in rows["after"] if "eval/accuracy_greedy" in r]
        first, last = (evals[0], evals[-1]) if evals else ({}, {})
        print(json.dumps(dict(config=config, rows=len(rows["after"]), identical=diff is None,
                              difference=diff, rtol=args.rtol, atol=args.atol,
                              ignored=list(ignore),
                              max_relative=worst, max_relative_key=worst_key, greedy_first=first.get("eval/accuracy_greedy"),
                              greedy_last=last.get("eval/accuracy_greedy"),
                              sampled_last=last.get("eval/accuracy_sampled"))), flush=True)
    finally:
      for side, tree in trees.items():
        if tree != root:
          subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], check=False)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())

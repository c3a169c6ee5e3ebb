"""How the sweep machinery copes with a thousand points and more; one JSON line per size.

    python benchmarks/sweep_scale.py                          # 1,000 and 10,000 points
    python benchmarks/sweep_scale.py --points=1000 --tree=/tmp/before   # another checkout's code

For each size N, a config wrapping configs/grpo.py:tiny declares one sweep of N points (ten
learning rates x N/10 seeds), and in a fresh folder this measures, each case a process of
`launch/sweep.py` as a user runs it (its wall time; `..._cpu_s`: the CPU time it and its
children used, about the wall time on an idle machine), with fake sbatch, squeue, sacct and
scontrol first on
PATH that record what is submitted, run nothing and answer at once (`scontrol show config`
says MaxArraySize = 1001, as a cluster's controller would):

  dry_run_local_s, dry_run_slurm_s   `--dry_run` with the local and the Slurm launcher;
  slurm_submit_s                     `--launcher=slurm`; sbatch_calls: the base policy's
                                     job and the points' arrays, slurm_max_task: the highest
                                     array task id submitted;
  relaunch_done_local_s, _slurm_s    every point done (summary.json in each run directory),
                                     the same command once to record it, then again, timed;
                                     touched_local, touched_slurm: the files in the sweep
                                     folder that second launch created, removed or rewrote
                                     (mtime or size);
  status_changes, bytes_per_change   the local launcher (one process) runs --pending of the N
                                     points (the others done; no base policy built) with a
                                     command that only writes summary.json, --parallel=4: the
                                     bytes that process wrote (/proc/self/io wchar: sweep.json,
                                     its journal, the points' launch.log headers, anything)
                                     per status change (two per point: running, done), from
                                     its start to its end (the manifest closed);
                                     s_per_change: its wall time per change;
                                     sweep_json_bytes: the size of sweep.json.

A case that runs past --timeout seconds is reported as that many seconds with `"timed_out"`
naming it. `--tree` runs another checkout (a git worktree of an older commit) the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CONFIG = '''"""benchmarks/sweep_scale.py: configs/grpo.py with one sweep of {n} points."""
import importlib.util

_spec = importlib.util.spec_from_file_location("scale_base", {base!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)


def get_config(arg=None):
  return _base.get_config(arg)


def sweeps(arg=None):
  del arg
  return {{"scale": [{{"lr": 1e-4 * (1 + i % 10), "seed": i // 10}} for i in range({n})]}}
'''

# A point's run that only says it is done: summary.json in its --workdir.
_DONE = ('for a; do case "$a" in --workdir=*) d="${a#--workdir=}";; esac; done; '
         'mkdir -p "$d" && echo "{}" > "$d/summary.json"')
RUN_COMMAND = ["sh", "-c", _DONE, "fake_run"]

_FAKES = {
    "sbatch": '''#!/bin/sh
# Records the submission (argv and the script's --array line) and runs nothing.
n=$(cat "$FAKE_DIR/next" 2>/dev/null || echo 1000)
echo $((n + 1)) > "$FAKE_DIR/next"
last=""; for a; do last="$a"; done
echo "$n $* $(grep -m1 '^#SBATCH --array=' "$last")" >> "$FAKE_DIR/submissions"
echo "$n"
''',
    "squeue": "#!/bin/sh\nexit 0\n",
    "sacct": "#!/bin/sh\nexit 0\n",
    "scontrol": '''#!/bin/sh
if [ "$1 $2" = "show config" ]; then
  echo "MaxArraySize            = ${FAKE_MAX_ARRAY_SIZE:-1001}"; exit 0
fi
exit 0
''',
}


def fake_slurm(folder: str) -> dict:
  """The fakes' folder first on PATH; their records in `folder`."""
  os.makedirs(folder, exist_ok=True)
  for name, text in _FAKES.items():
    path = os.path.join(folder, name)
    with open(path, "w") as f:
      f.write(text)
    os.chmod(path, 0o755)
  return dict(os.environ, PATH=folder + os.pathsep + os.environ["PATH"], FAKE_DIR=folder)


def cli(tree: str, config: str, workdir: str, *flags, env=None,
        timeout=600) -> tuple[float | None, float]:
  """`launch/sweep.py` of `tree` on the sweep: (wall seconds, None past `timeout`; CPU
  seconds)."""
  argv = [sys.executable, os.path.join(tree, "launch", "sweep.py"), f"--config={config}",
          "--sweep=scale", f"--workdir={workdir}",
          "--run_command=" + shlex.join(RUN_COMMAND), *flags]
  env = dict(env or os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
  t0, cpu0 = time.time(), _children_cpu()
  try:  # in the sweep's parent folder: the base policies' cache (runs/base) goes there
    out = subprocess.run(argv, cwd=os.path.dirname(workdir), env=env, capture_output=True,
                         text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return None, round(_children_cpu() - cpu0, 2)
  if out.returncode not in (0, 75):
    raise SystemExit(f"{shlex.join(argv)} exited {out.returncode}:\n{out.stderr[-3000:]}")
  return round(time.time() - t0, 2), round(_children_cpu() - cpu0, 2)


def _children_cpu() -> float:
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


def files(folder: str) -> dict[str, tuple[int, int]]:
  """path -> (mtime_ns, size) of every file under `folder`."""
  out = {}
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      st = os.stat(path)
      out[path] = (st.st_mtime_ns, st.st_size)
  return out


def all_done(tree: str, config: str, workdir: str, n: int) -> None:
  """A run directory with summary.json for each of the sweep's points."""
  code = ("import sys; from rlscale.sweep import points\n"
          "for p in points.points(sys.argv[1], 'scale', sys.argv[2]):\n"
          "  __import__('os').makedirs(p.run_dir, exist_ok=True)\n"
          "  open(p.run_dir + '/summary.json', 'w').write('{}')\n")
  subprocess.run([sys.executable, "-c", code, config, workdir], cwd=tree, check=True,
                 env=dict(os.environ, PYTHONPATH=tree))


def relaunch_done(tree: str, config: str, workdir: str, n: int, env, timeout: float,
                  *flags) -> tuple[tuple, int]:
  """((wall, CPU seconds), files touched) of a launch when every point is done and
  recorded."""
  all_done(tree, config, workdir, n)
  cli(tree, config, workdir, *flags, env=env, timeout=timeout)  # records them done
  before = files(workdir)
  time.sleep(0.05)  # an mtime that changes is seen as changed
  seconds = cli(tree, config, workdir, *flags, env=env, timeout=timeout)
  after = files(workdir)
  touched = [p for p in set(before) | set(after) if before.get(p) != after.get(p)]
  return seconds, len(touched)


def status_child(config: str, workdir: str, pending: int) -> None:
  """In a process of the tree's code: the local launcher runs `pending` points, the others
  done; prints {"changes", "bytes", "seconds"}."""
  from absl import logging
  from rlscale.sweep.launchers import local
  from rlscale.sweep import points
  from rlscale.sweep import manifest as mf
  logging.set_verbosity(logging.WARNING)
  pts = points.points(config, "scale", workdir)
  for p in pts[pending:]:
    os.makedirs(p.run_dir, exist_ok=True)
    with open(os.path.join(p.run_dir, "summary.json"), "w") as f:
      f.write("{}")
  m = mf.open_sweep(workdir, "scale", config, "local", pts)
  runner = local.LocalLauncher(config, m, pts, parallel=4, command=RUN_COMMAND,
                               progress_every=3600, poll=0.01)
  m.save()
  runner.build_bases = lambda todo: set()  # the base policy is not what is measured
  written = _wchar()
  t0 = time.time()
  counts = runner.run()
  seconds = time.time() - t0
  assert counts[mf.DONE] == len(pts), counts
  print(json.dumps({"changes": 2 * pending, "bytes": _wchar() - written,
                    "seconds": seconds}))


def _wchar() -> int:
  with open("/proc/self/io") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))


def measure(tree: str, n: int, pending: int, timeout: float, keep: str | None) -> dict:
  tmp = keep or tempfile.mkdtemp(prefix="sweep_scale-")
  os.makedirs(tmp, exist_ok=True)
  config = os.path.join(tmp, "scale_config.py")
  with open(config, "w") as f:
    f.write(_CONFIG.format(n=n, base=os.path.join(tree, "configs", "grpo.py")))
  config += ":tiny"
  out: dict = {"benchmark": "sweep_scale", "points": n, "tree": tree}
  timed_out = []

  def record(name, seconds):
    wall, cpu = seconds
    out[name] = timeout if wall is None else wall
    out[name[:-len("_s")] + "_cpu_s"] = cpu
    if wall is None:
      timed_out.append(name)

  fakes = os.path.join(tmp, "fake_slurm")
  env = fake_slurm(fakes)
  record("dry_run_local_s", cli(tree, config, os.path.join(tmp, "dry"), "--dry_run", env=env,
                                timeout=timeout))
  record("dry_run_slurm_s", cli(tree, config, os.path.join(tmp, "dry"), "--dry_run",
                                "--launcher=slurm", env=env, timeout=timeout))
  record("slurm_submit_s", cli(tree, config, os.path.join(tmp, "slurm"), "--launcher=slurm",
                               env=env, timeout=timeout))
  subs = open(os.path.join(fakes, "submissions")).read().splitlines() if os.path.exists(
      os.path.join(fakes, "submissions")) else []
  out["sbatch_calls"] = len(subs)
  tasks = [int(x) for line in subs for part in line.split("--array=")[-1].split("%")[0]
           .split(",") for x in part.split("-") if x.isdigit()]
  out["slurm_max_task"] = max(tasks) if tasks else None
  seconds, out["touched_local"] = relaunch_done(tree, config, os.path.join(tmp, "done"), n,
                                                env, timeout)
  record("relaunch_done_local_s", seconds)
  os.remove(os.path.join(fakes, "submissions")) if subs else None
  seconds, out["touched_slurm"] = relaunch_done(tree, config, os.path.join(tmp, "done_slurm"),
                                                n, env, timeout, "--launcher=slurm")
  record("relaunch_done_slurm_s", seconds)
  child = subprocess.run([sys.executable, os.path.abspath(__file__), "--child_status",
                          config, os.path.join(tmp, "status"), str(min(pending, n))],
                         cwd=tree, env=dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu"),
                         capture_output=True, text=True, timeout=None)
  if child.returncode:
    raise SystemExit(f"the status measurement failed:\n{child.stderr[-3000:]}")
  st = json.loads(child.stdout.strip().splitlines()[-1])
  out.update(status_changes=st["changes"], bytes_per_change=round(st["bytes"] / st["changes"]),
             s_per_change=round(st["seconds"] / st["changes"], 4))
  manifest = os.path.join(tmp, "status", "sweep.json")
  out["sweep_json_bytes"] = os.path.getsize(manifest)
  if timed_out:
    out["timed_out"] = timed_out
  out.update(cores=os.cpu_count(), load_avg=round(os.getloadavg()[0], 1), commit=_commit(tree))
  if not keep:
    shutil.rmtree(tmp, ignore_errors=True)
  return out


def _commit(tree: str) -> str:
  out = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                       text=True)
  dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no",
                          "rlscale/sweep"], capture_output=True, text=True).stdout.strip()
  return out.stdout.strip() + ("+dirty" if dirty else "")


def main() -> None:
  if len(sys.argv) > 1 and sys.argv[1] == "--child_status":
    config, workdir, pending = sys.argv[2:5]
    status_child(config, workdir, int(pending))
    return
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--points", default="1000,10000", help="sweep sizes, comma-separated")
  ap.add_argument("--pending", type=int, default=200, help="points the status case runs")
  ap.add_argument("--timeout", type=float, default=600, help="seconds a case may take")
  ap.add_argument("--tree", default=HERE, help="the checkout whose code runs")
  ap.add_argument("--keep", default=None, help="a folder to leave the sweeps in")
  args = ap.parse_args()
  for n in (int(x) for x in args.points.split(",")):
    keep = os.path.abspath(os.path.join(args.keep, str(n))) if args.keep else None
    print(json.dumps(measure(os.path.abspath(args.tree), n, args.pending, args.timeout, keep)),
          flush=True)


if __name__ == "__main__":
  main()

"""What a long run holds on to: host memory, open files, checkpoints and logs over steps; one JSON line.

    python benchmarks/long_run.py [--steps=2000] [--every=2] [--config=configs/grpo.py:tiny]
    python benchmarks/long_run.py --steps=400 --trace   # where the growth is allocated

Runs `launch/main.py` for --steps steps, evaluating and saving every --every steps, and samples
its process from outside (/proc) at each new row of metrics.jsonl: resident memory (RSS), open
file descriptors, checkpoints on disk, and the bytes of metrics.jsonl and the TensorBoard
events. Reports them at the step nearest 10% of the run and at its end, with their ratios:
memory that is flat stays within 10%, files do not grow, checkpoints stay at
`train.keep_checkpoints`, and the logs grow linearly (bytes per step in the second half over
the first). Linux only (/proc).

Measured on configs/grpo.py:tiny, evaluating and saving every 2 steps, 2026-12-06, a 2-core CPU
shared with other jobs. RSS in MB, the median over steps 100-300 and over the last 200 steps:

| code | steps 100-300 | 1,800-2,000 | ratio | open files (fewest) | between compiles |
| --- | --- | --- | --- | --- | --- |
| 1537aa7 (single samples at 200 and 2,000) | 509 | 672 | 1.32 | 15 -> 9 | +31 KB a step |
| orbax's byte counter fixed, buckets compiled when met | 585 | 725 | 1.24 | 9 -> 9 | +28 KB a step |
| 86ae4dd: both orbax leaks, no rows held, buckets compiled ahead | 768 | 796 | **1.035** | 9 -> 9 | +15 KB a step |

Where it went: (a) each bucket of packed rows a run first meets compiles one more update program
(rlscale/rl/packing.py, at most 8 per model) and RSS steps up by 40-65 MB there (steps ~516 and
~1,814 of this run) and stays: train.compile_buckets='ahead' ('auto' from 1,000 steps) compiles
them all at the first update, so the memory is taken in the first step (here ~180 MB more than
the 3 buckets this run meets; a CPU program is large, an accelerator's host side much less).
(b) orbax keeps what tensorstore returns on every save (rlscale/checkpoints/orbax_leak.py: ~27 KB
a save of 16 arrays before, ~8 KB after). (c) The metrics writer held every row for the
checkpoints (~2 KB a step): now read back from the file. Without saves and evaluations RSS is
flat between compiles over 3,000 steps. Checkpoints on disk stay at keep_checkpoints = 2 (3
while a save is written) and the logs grow by the same bytes a step (1.004 / 1.005, second half
over first).

--trace runs the job under tracemalloc instead (slower) and prints the 15 call sites
whose Python allocations grew most between the two steps (the RSS sampled the same way).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

FLAGS = flags.FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rss_mb(pid: int) -> float:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def _size(path: str) -> int:
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _sample(pid: int, workdir: str) -> dict:
  """One sample of the run's process and folder (None fields before they exist)."""
  metrics = os.path.join(workdir, "metrics.jsonl")
  ckpt = os.path.join(workdir, "checkpoints")
  steps = 0
  if os.path.exists(metrics):
    with open(metrics, "rb") as f:
      steps = sum(1 for _ in f) - 1  # the first row is the starting evaluation
  return dict(step=steps, rss_mb=_rss_mb(pid), fds=len(os.listdir(f"/proc/{pid}/fd")),
              checkpoints=len([d for d in os.listdir(ckpt) if d.isdigit()])
              if os.path.isdir(ckpt) else 0,
              metrics_bytes=_size(metrics) if os.path.exists(metrics) else 0,
              events_bytes=_size(os.path.join(workdir, "tensorboard")))


def _watch(pid: int, workdir: str, alive, period: float = 0.5) -> list[dict]:
  samples, last = [], -1
  while alive():
    try:
      s = _sample(pid, workdir)
    except (FileNotFoundError, ProcessLookupError):
      break
    if s["step"] != last:
      samples.append(s)
      last = s["step"]
    time.sleep(period)
  return samples


def _at(samples: list[dict], step: int) -> dict:
  return min(samples, key=lambda s: abs(s["step"] - step))


def _window(samples: list[dict], lo: int, hi: int) -> dict:
  """Over the samples of steps lo..hi: the median RSS (a save or an evaluation in flight
  raises it by ~15 MB for a moment) and the fewest and most open files (a save in flight
  holds ~10 more)."""
  inside = [s for s in samples if lo <= s["step"] <= hi] or [_at(samples, hi)]
  rss = sorted(s["rss_mb"] for s in inside)
  return dict(steps=[inside[0]["step"], inside[-1]["step"]], samples=len(inside),
              rss_mb=round(rss[len(rss) // 2], 1), fds_min=min(s["fds"] for s in inside),
              fds_max=max(s["fds"] for s in inside))


def summary(samples: list[dict], steps: int) -> dict:
  """The figures at ~10% of the run and at its end, and their ratios: RSS and open files over
  windows of 10% of the run (around 10%, the last), the logs' growth per step."""
  early, end = _at(samples, max(1, steps // 10)), samples[-1]
  mid = _at(samples, (early["step"] + end["step"]) // 2)
  span = max(1, steps // 20)
  first = _window(samples, max(1, steps // 10 - span), steps // 10 + span)
  last = _window(samples, end["step"] - 2 * span, end["step"])

  def rate(key):  # bytes per step, second half over first
    a = (mid[key] - early[key]) / max(1, mid["step"] - early["step"])
    b = (end[key] - mid[key]) / max(1, end["step"] - mid["step"])
    return round(b / a, 3) if a else None
  return dict(early=early, mid=mid, end=end, early_window=first, end_window=last,
              rss_ratio=round(last["rss_mb"] / first["rss_mb"], 3),
              fds_growth=last["fds_min"] - first["fds_min"], max_checkpoints=max(
                  s["checkpoints"] for s in samples),
              metrics_rate_ratio=rate("metrics_bytes"), events_rate_ratio=rate("events_bytes"))


def _args(workdir: str) -> list[str]:
  return [f"--config={os.path.join(REPO, FLAGS.config)}", f"--workdir={workdir}",
          f"--config.train.num_steps={FLAGS.steps}", f"--config.train.eval_every={FLAGS.every}",
          f"--config.train.checkpoint_every={FLAGS.every}"]


def _outside(workdir: str, command: list[str] | None = None) -> list[dict]:
  command = command or [sys.executable, os.path.join(REPO, "launch", "main.py"), *_args(workdir)]
  proc = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, cwd=REPO)
  samples = _watch(proc.pid, workdir, lambda: proc.poll() is None)
  if proc.wait():
    raise SystemExit(f"long_run: the run exited with status {proc.returncode}")
  return samples


def trace_child(workdir: str, first: int, late: int, out: str) -> None:
  """In the run's own process (before launch/main.py): snapshot Python's allocations once the
  run reaches step `first` and at exit, and write the 15 largest growths to `out`, after the
  device buffers Python holds at `first` and at `late`."""
  import atexit
  import tracemalloc
  tracemalloc.start(8)
  snaps = {}

  def live():  # the device buffers Python still holds
    import jax
    arrays = jax.live_arrays()
    return f"{len(arrays)} live arrays, {sum(a.nbytes for a in arrays) / 1e6:.2f} MB"

  def watcher():
    while "late_live" not in snaps:
      step = _sample(os.getpid(), workdir)["step"]
      if step >= first and "early" not in snaps:
        snaps["early"] = tracemalloc.take_snapshot()
        snaps["early_live"] = live()
      if step >= late:
        snaps["late_live"] = live()
      time.sleep(0.5)

  def report():
    if "early" not in snaps:
      return
    top = tracemalloc.take_snapshot().compare_to(snaps["early"], "traceback")[:15]
    with open(out, "w") as f:
      f.write(f"at step {first}: {snaps['early_live']}; at step {late}: "
              f"{snaps.get('late_live')}\n")
      for s in top:
        where = " <- ".join(f"{fr.filename.rpartition('site-packages/')[2]}:{fr.lineno}"
                            for fr in s.traceback[:4])
        f.write(f"{s.size_diff / 1e6:+.2f} MB in {s.count_diff:+d} blocks at {where}\n")
  threading.Thread(target=watcher, daemon=True).start()
  atexit.register(report)


def _inside(workdir: str) -> tuple[list[dict], list[str]]:
  out = os.path.join(os.path.dirname(workdir), "trace.txt")
  child = (f"import sys, runpy; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
           f"import long_run; long_run.trace_child({workdir!r}, {max(1, FLAGS.steps // 10)}, "
           f"{FLAGS.steps * 9 // 10}, {out!r}); sys.argv = ['main.py'] + {_args(workdir)!r}; "
           f"runpy.run_path({os.path.join(REPO, 'launch', 'main.py')!r}, run_name='__main__')")
  samples = _outside(workdir, [sys.executable, "-c", child])
  with open(out) as f:
    return samples, f.read().splitlines()


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as tmp:
    workdir = FLAGS.workdir or os.path.join(tmp, "run")
    if FLAGS.trace:
      samples, lines = _inside(workdir)
      print("\n".join(lines), file=sys.stderr)
    else:
      samples = _outside(workdir)
  if FLAGS.samples:
    with open(FLAGS.samples, "w") as f:
      f.writelines(json.dumps(s) + "\n" for s in samples)
  print(json.dumps(dict(benchmark="long_run", config=FLAGS.config, steps=FLAGS.steps,
                        every=FLAGS.every, **summary(samples, FLAGS.steps))))


if __name__ == "__main__":
  flags.DEFINE_integer("steps", 2000, "RL steps of the run")
  flags.DEFINE_integer("every", 2, "evaluate and save every this many steps")
  flags.DEFINE_string("config", "configs/grpo.py:tiny", "the run's config")
  flags.DEFINE_bool("trace", False, "run under tracemalloc and print what grew most")
  flags.DEFINE_string("workdir", None, "the run's folder (default: a temporary one)")
  flags.DEFINE_string("samples", None, "also write every sample to this JSON-lines file")
  app.run(main)

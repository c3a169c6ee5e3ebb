"""Where one RL step's time goes, op by op: the decode and the update profiled; JSON lines.

    python benchmarks/profile_step.py                  # the shape and flags of rl_step.py
    python benchmarks/profile_step.py --microbatch=128 --top=30

Runs the trainer's step as benchmarks/rl_step.py does (same flags), compiles it with one
step, then records one more under `jax.profiler.trace`: the decode (`begin`) and the rest
(`complete`: scoring, the algorithm's prepare and update, the metrics fetch) in two traces.
For each it prints one line: the seconds its ops took by kind (the op name without its
number: on the CPU `ynn_fusion` is a matmul, `*_fusion` an elementwise loop, on a GPU the
kernel names) and the `--top` ops with their share and, on the CPU, the framework op they
came from (jit op_name metadata). Op times can overlap (ops run concurrently on the host's
threads), so shares are of the summed op time, not of the wall time. On the CPU this sets
--xla_cpu_enable_xprof_traceme, which XLA needs to time each op.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import shutil
import tempfile
import time

from absl import app, flags, logging

import rl_step  # (the step's flags and its setup)

FLAGS = flags.FLAGS
flags.DEFINE_integer("top", 20, "ops listed per phase")

# An op is an HLO instruction's name (`ynn_fusion.12`, `dot`) or a kernel's; the trace also holds
# the runtime's own events (CamelCase, `shard_args`) and ops that contain others (a while loop's
# time is its body's ops), which would count twice.
_OP = re.compile(r"^[a-z][\w-]*(\.\d+)?$")
_NOT_OPS = ("while", "conditional", "call", "shard_args")


def op_times(trace_dir: str) -> dict[str, float]:
  """Seconds per op name, summed over the trace's events (Python frames and executors out)."""
  import jax
  path = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0]
  out: dict[str, float] = collections.defaultdict(float)
  for plane in jax.profiler.ProfileData.from_file(path).planes:
    for line in plane.lines:
      for ev in line.events:
        if _OP.match(ev.name) and not ev.name.startswith(_NOT_OPS):
          out[ev.name] += ev.duration_ns / 1e9
  return out


def summarize(phase: str, wall: float, ops: dict[str, float], origin: dict[str, str]) -> dict:
  total = sum(ops.values()) or 1.0
  kinds: dict[str, float] = collections.defaultdict(float)
  for name, s in ops.items():
    kinds[re.sub(r"\.\d+$", "", name)] += s
  top = sorted(ops.items(), key=lambda kv: -kv[1])[:FLAGS.top]
  return {"phase": phase, "wall_s": round(wall, 4), "op_s": round(total, 4),
          "kinds": {k: round(v, 4) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])[:15]},
          "top": [{"op": n, "s": round(s, 4), "share": round(s / total, 4),
                   "from": origin.get(n, "")} for n, s in top]}


def hlo_origins(texts: list[str]) -> dict[str, str]:
  """op name -> 'shape op_name' from compiled HLO texts (where the op's metadata says; ops XLA
  inserted have none). A name that several programs use gets each origin, joined by ' | '."""
  out: dict[str, list[str]] = collections.defaultdict(list)
  for text in texts:
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.-]+) = (\S+) .*?op_name=\"([^\"]+)\"", text, re.M):
      origin = f"{m.group(2)[:48]} {m.group(3)[-80:]}"
      if origin not in out[m.group(1)]:
        out[m.group(1)].append(origin)
  return {name: " | ".join(origins) for name, origins in out.items()}


def main(argv):
  del argv
  workdir = tempfile.mkdtemp(prefix="profile_step_")
  hlo_dir = os.path.join(workdir, "hlo")  # the compiled programs, to name each op's origin
  os.environ["XLA_FLAGS"] = " ".join([
      os.environ.get("XLA_FLAGS", ""), "--xla_cpu_enable_xprof_traceme=true",
      f"--xla_dump_to={hlo_dir}", "--xla_dump_hlo_as_text"]).strip()
  import jax
  from rlscale.run import logs
  logs.quiet_libraries()
  logging.set_verbosity(logging.WARNING)
  try:
    trainer = rl_step.make_trainer(workdir)
    walls = {}
    for step in (1, 2):  # the first compiles; the second is traced
      traced = step == 2
      t = time.time()
      with _maybe_trace(traced, os.path.join(workdir, "generate")):
        begun = trainer.begin(step)
        jax.block_until_ready(begun.rollout)
      walls["generate"] = time.time() - t
      t = time.time()
      with _maybe_trace(traced, os.path.join(workdir, "update")):
        jax.device_get(trainer.complete(step, begun, t).device)
      walls["update"] = time.time() - t
    # An op's name is unique within its program: the decode is jit(_run); the update phase runs
    # the updates (jit(counted)) and the algorithm's smaller programs (advantages, log-probs).
    dumps = glob.glob(os.path.join(hlo_dir, "*after_optimizations.txt"))
    sampler = [f for f in dumps if "jit__run" in f]
    for phase, files in (("generate", sampler), ("update", sorted(set(dumps) - set(sampler)))):
      texts = [open(f).read() for f in files]
      print(json.dumps(summarize(phase, walls[phase], op_times(os.path.join(workdir, phase)),
                                 hlo_origins(texts))))
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


def _maybe_trace(on: bool, path: str):
  import contextlib
  import jax
  return jax.profiler.trace(path) if on else contextlib.nullcontext()


if __name__ == "__main__":
  app.run(main)

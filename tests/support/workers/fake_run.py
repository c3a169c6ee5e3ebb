"""A stand-in for `python -m rlscale` in the launchers' tests: rlscale's flags and exit statuses,
a run of sleeps (tests/support/fixtures/fake_sweep_config.py declares its sweeps).

Like a real run it holds the workdir lock, keeps a checkpoint (the step, in `step`) and resumes
from it, saves and exits 75 on SIGTERM or SIGUSR2, and writes summary.json when done; only
process 0 (SLURM_PROCID) locks and writes.
Every process appends `start <step> <SLURM_PROCID>/<SLURM_NTASKS> <SLURM_LOCALID>
<JAX_COORDINATOR_PORT> <SLURM_RESTART_COUNT>` to starts.txt, so a test sees how it was started.
With --base_policy_only it prints a line and exits: 0, or 1 when FAKE_BASE_FAILS is set.
"""

import fcntl
import json
import math
import os
import signal
import sys
import time

stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
signal.signal(signal.SIGUSR2, lambda *a: stop.append(1))

args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
if "--base_policy_only" in sys.argv:
  print("building the base policy", flush=True)
  sys.exit(1 if os.environ.get("FAKE_BASE_FAILS") else 0)
workdir = args["workdir"]
fields = {k[len("config."):]: v for k, v in args.items() if k.startswith("config.")}
steps, delay = int(fields.get("steps", 3)), float(fields.get("delay", 0.02))
env = os.environ
first = env.get("SLURM_PROCID", "0") == "0"
os.makedirs(workdir, exist_ok=True)
if first:
  lock = open(os.path.join(workdir, ".lock"), "a")
  fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
step_file = os.path.join(workdir, "step")
step = int(open(step_file).read()) if os.path.exists(step_file) else 0
starts = os.path.join(workdir, "starts.txt")
previous = open(starts).read().count("start") if os.path.exists(starts) else 0
with open(starts, "a") as f:
  f.write(f"start {step} {env.get('SLURM_PROCID')}/{env.get('SLURM_NTASKS')} "
          f"{env.get('SLURM_LOCALID')} {env.get('JAX_COORDINATOR_PORT')} "
          f"{env.get('SLURM_RESTART_COUNT')}\n")
if previous < int(fields.get("fail_times", 0)):
  print("Traceback (most recent call last):\nValueError: this point is broken", flush=True)
  sys.exit(3)
preempt_at = int(fields.get("preempt_at", 0))
while step < steps:
  time.sleep(delay)
  step += 1
  if first:  # replaced whole: another process of the point may be reading it as it starts
    with open(step_file + ".tmp", "w") as f:
      f.write(str(step))
    os.replace(step_file + ".tmp", step_file)
  preempted = os.path.join(workdir, "preempted")
  if stop or (step == preempt_at and not os.path.exists(preempted)):
    if first:
      open(preempted, "w").close()
    print(f"preempted: saved step {step}", flush=True)
    sys.exit(75)
if first:
  # A study reads config.json and the evaluations: a curve that reaches 0.5 at `rtt` responses
  # (rtt x (1 + log2(lr / best_lr)^2) when best_lr is set: a scan with an optimum), else stays
  # below it, and ends at `final`.
  rtt = int(fields.get("rtt", 0))
  lr, best = float(fields.get("lr", 1.0)), float(fields.get("best_lr", 0))
  if rtt and best:
    rtt = int(rtt * (1 + math.log2(lr / best) ** 2))
  final = float(fields.get("final", 0.5))
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"target": {"metric": "accuracy", "value": 0.5}, "lr": lr}, f)
  curve = ([(0, 0.0), (rtt, 0.5), (2 * rtt, max(final, 0.5))] if rtt
           else [(0, 0.0), (1000, min(final, 0.49))])
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"step": i, "responses_seen": x, "accuracy": y}) + "\n"
                 for i, (x, y) in enumerate(curve))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"step": step, "fields": fields, "config": args.get("config"),
               "target": {"metric": "accuracy", "value": 0.5},
               "responses_to_target": rtt or None, "accuracy": float(fields.get("final", 0.5))},
              f)
print("done", flush=True)

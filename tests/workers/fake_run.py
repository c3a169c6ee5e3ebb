"""A stand-in for `python -m rlscale` in launcher tests: the same flags, a run of sleeps.

It keeps what a real run keeps: the workdir lock, a checkpoint (the step, in `step`), resume
from it, exit 75 after saving on SIGTERM or SIGUSR2, summary.json when done. Each start
appends `start <step>` to `starts.txt`, so a test sees whether a point restarted from scratch.
"""

import fcntl
import json
import os
import signal
import sys
import time

stop = []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
signal.signal(signal.SIGUSR2, lambda *a: stop.append(1))

args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
if "--base_policy_only" in sys.argv:
  sys.exit(0)
workdir = args["workdir"]
fields = {k[len("config."):]: v for k, v in args.items() if k.startswith("config.")}
steps, delay = int(fields.get("steps", 3)), float(fields.get("delay", 0.05))
os.makedirs(workdir, exist_ok=True)
lock = open(os.path.join(workdir, ".lock"), "a")
fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
step_file = os.path.join(workdir, "step")
step = int(open(step_file).read()) if os.path.exists(step_file) else 0
with open(os.path.join(workdir, "starts.txt"), "a") as f:
  f.write(f"start {step}\n")
if fields.get("fail") == "True":
  print("Traceback (most recent call last):\nValueError: this point is broken", flush=True)
  sys.exit(3)
preempt_at = int(fields.get("preempt_at", 0))
while step < steps:
  time.sleep(delay)
  step += 1
  with open(step_file, "w") as f:
    f.write(str(step))
  first = not os.path.exists(os.path.join(workdir, "preempted"))
  if stop or (step == preempt_at and first):
    open(os.path.join(workdir, "preempted"), "w").close()
    print(f"preempted: saved step {step}", flush=True)
    sys.exit(75)
with open(os.path.join(workdir, "summary.json"), "w") as f:
  json.dump({"step": step, "fields": fields}, f)
print("done", flush=True)

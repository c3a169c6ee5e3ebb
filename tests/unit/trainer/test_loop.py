"""The loop every trainer shares, driven by a fake trainer whose every call is logged."""

import json
import math
import os
import time

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlscale.config import sections as common
from rlscale.trainer import loop
from rlscale.checkpoints.checkpointer import Checkpointer

NAP = 0.003  # seconds each fake phase takes, so that phases have a measurable length
EVAL_NAP = 0.01


class Interrupted(Exception):
  pass


class FakeTrainer:
  """Step k adds k to the state `w` and `samples_per_step` to responses_seen.

  Its device metrics are tiny jax arrays: fake/loss = k / 10 (or `bad_value` at step `bad`)
  and fake/w. `meta()` is the list of completed steps. Every call goes into `calls`.
  """
  sample_key = "responses_seen"

  def __init__(self, samples_per_step=3, bad=None, bad_value=math.nan, fail_at=None,
               acc=lambda step: step / 10):
    self.samples_per_step = samples_per_step
    self.bad, self.bad_value, self.fail_at, self.acc = bad, bad_value, fail_at, acc
    self.counters = {"responses_seen": 0}
    self.w = 0.0
    self.done = []
    self.calls = []
    self.loaded = None
    self.fetched_types = set()

  def state(self):
    return {"w": jnp.asarray(self.w, jnp.float32)}

  def load(self, state, meta):
    self.w = float(state["w"])
    self.done = list(meta["done"])
    self.loaded = (self.w, dict(meta))

  def meta(self):
    return {"done": list(self.done)}

  def begin(self, step):
    self.calls.append(("begin", step))
    if step == self.fail_at:
      raise Interrupted(f"killed in step {step}")
    t = time.time()
    time.sleep(NAP)
    return t

  def complete(self, step, t_begin, t_start):
    self.calls.append(("complete", step))
    t = time.time()
    phases = {"generate": t - max(t_begin, t_start)}
    time.sleep(NAP)
    phases["reward"] = time.time() - t
    self.w += step
    self.done.append(step)
    self.counters["responses_seen"] += self.samples_per_step
    loss = self.bad_value if step == self.bad else step / 10
    device = {"fake": {"loss": jnp.asarray(loss, jnp.float32),
                       "w": jnp.asarray(self.w, jnp.float32)}}
    t_update = time.time()
    time.sleep(NAP)
    return loop.Pending(step, device, {"host_step": step}, phases, t_start, t_update)

  def metrics(self, p, fetched):
    self.calls.append(("metrics", p.step))
    self.fetched_types.update(type(v) for m in fetched.values() for v in m.values())
    return {f"fake/{k}": v for k, v in fetched["fake"].items()} | p.host

  def rates(self, p, wall):
    return {"throughput/responses_per_s": self.samples_per_step / wall}

  def evaluate(self, step):
    self.calls.append(("evaluate", step))
    time.sleep(EVAL_NAP)
    return {"eval/acc": self.acc(step)}

  def progress(self, row, last_eval):
    return {"loss": float(row["fake/loss"]), "acc": last_eval.get("eval/acc")}


def _cfg(target=None, stop=False, margin=0.0, **train):
  c = ml_collections.ConfigDict()
  c.seed = 7
  c.train = common.run(num_steps=0)
  c.train.update(eval_every=0, checkpoint_every=0, tensorboard=False, log_every=1,
                 async_checkpoint=False)
  c.train.update(train)
  c.eval = common.evaluation()
  if target is not None:
    c.target = common.target("eval/acc", target)
    c.target.stop, c.target.stop_margin = stop, margin
  return c


def _run(tmp_path, trainer, steps, eval_at_start=False, **cfg):
  c = _cfg(**cfg)
  lp = loop.Loop(trainer, c, str(tmp_path), steps, eval_at_start, written=c)
  return lp.run()


def _rows(tmp_path):
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _called(trainer, name):
  return [s for n, s in trainer.calls if n == name]


def _latest(tmp_path):
  ckpt = Checkpointer(os.path.join(tmp_path, "checkpoints"), async_save=False)
  try:
    step = ckpt.latest_step()
    state = ckpt.restore(step, {"w": jnp.zeros((), jnp.float32)}) if step else None
  finally:
    ckpt.close()
  return step, state


@pytest.mark.parametrize("eval_at_start", [True, False])
def test_rows_are_the_steps_and_evaluations_fall_on_step_marks(tmp_path, eval_at_start):
  t = FakeTrainer()
  counters, last_eval = _run(tmp_path, t, 5, eval_at_start, eval_every=2)
  rows = _rows(tmp_path)
  first = 0 if eval_at_start else 1
  assert [r["step"] for r in rows] == list(range(first, 6))
  evals = [0, 2, 4, 5] if eval_at_start else [2, 4, 5]
  assert _called(t, "evaluate") == evals
  assert [r["step"] for r in rows if "eval/acc" in r] == evals
  for r in rows:
    assert r["responses_seen"] == 3 * r["step"]
    if r["step"]:
      assert r["fake/w"] == sum(range(r["step"] + 1))  # the device metric of that very step
      assert r["fake/loss"] == pytest.approx(r["step"] / 10)
      assert r["host_step"] == r["step"]
  if eval_at_start:
    assert rows[0]["wall_time"] == 0.0 and rows[0]["eval/acc"] == 0.0
  assert _called(t, "begin") == [1, 2, 3, 4, 5]
  assert counters["step"] == 5 and counters["seed"] == 7 and counters["responses_seen"] == 15
  assert last_eval == {"eval/acc": 0.5}
  assert _latest(tmp_path)[0] == 5  # checkpoint_every=0: the last step only


def test_evaluations_fall_at_the_first_step_past_each_sample_mark(tmp_path):
  """3 responses per step, a mark every 5: steps 2 (6), 4 (12), 5 (15), 7 (21) and the last."""
  t = FakeTrainer(samples_per_step=3)
  _run(tmp_path, t, 8, eval_every_responses=5, eval_every=3)  # eval_every is then ignored
  assert _called(t, "evaluate") == [2, 4, 5, 7, 8]
  rows = _rows(tmp_path)
  evaluated = {r["step"] for r in rows if "eval/acc" in r}
  for mark in (5, 10, 15, 20):
    first_past = min(r["step"] for r in rows if r["responses_seen"] >= mark)
    assert first_past in evaluated, mark


def test_time_phases_add_up_to_the_step_and_steps_to_the_run(tmp_path):
  t = FakeTrainer()
  counters, _ = _run(tmp_path, t, 6, eval_at_start=True, eval_every=3, checkpoint_every=2)
  rows = _rows(tmp_path)
  assert "time/step" not in rows[0] and rows[0]["time/eval"] >= EVAL_NAP
  for r in rows[1:]:
    phases = {k: v for k, v in r.items() if k.startswith("time/") and k != "time/step"}
    assert {"time/generate", "time/reward", "time/update", "time/other"} <= set(phases)
    assert ("time/eval" in phases) == (r["step"] in (3, 6))
    # A checkpoint is saved after its step's row (it carries the rows); its time counts in the
    # next step. The last step's save is in no row.
    assert ("time/checkpoint" in phases) == (r["step"] in (3, 5))
    assert sum(phases.values()) == pytest.approx(r["time/step"], rel=1e-9, abs=1e-9)
    assert all(v >= -1e-6 for v in phases.values()), phases  # phases lie inside the step
    assert r["time/update"] >= NAP and r["time/reward"] >= NAP
    if "time/eval" in phases:
      assert phases["time/eval"] >= EVAL_NAP
    assert r["throughput/responses_per_s"] == pytest.approx(3 / r["time/step"])
  # Steps tile the run: their lengths add up to the wall time (the step-0 evaluation excluded).
  total = sum(r["time/step"] for r in rows[1:])
  assert total == pytest.approx(rows[-1]["wall_time"], abs=0.02)
  assert counters["wall_time"] == pytest.approx(rows[-1]["wall_time"])
  walls = [r["wall_time"] for r in rows]
  assert walls == sorted(walls)


def test_a_steps_metrics_are_fetched_after_the_next_step_was_begun(tmp_path):
  t = FakeTrainer()
  _run(tmp_path, t, 6, eval_every=3)
  at = {c: i for i, c in enumerate(t.calls)}
  for n in (1, 2, 4):  # no evaluation or checkpoint at n: fetched once n+1 was dispatched
    assert at[("begin", n + 1)] < at[("metrics", n)] < at[("complete", n + 1)], t.calls
  # An evaluation needs step n's parameters and metrics first, before step n+1 starts.
  assert at[("metrics", 3)] < at[("evaluate", 3)] < at[("begin", 4)]
  assert t.calls[-3:] == [("complete", 6), ("metrics", 6), ("evaluate", 6)]
  assert _called(t, "metrics") == [1, 2, 3, 4, 5, 6]
  assert t.fetched_types and all(issubclass(c, (np.ndarray, np.generic)) for c in t.fetched_types)


@pytest.mark.parametrize("checkpoint_every,bad,value,async_checkpoint", [
    (1, 3, math.nan, True),  # a checkpoint step, finished at once, step 2's save still in flight
    (2, 3, math.inf, False),  # fetched late, after step 4 was begun
    (2, 4, math.nan, False),  # due a checkpoint that must not be written
])
def test_a_non_finite_metric_stops_before_its_checkpoint(tmp_path, checkpoint_every, bad, value,
                                                         async_checkpoint):
  t = FakeTrainer(bad=bad, bad_value=value)
  with pytest.raises(loop.NonFiniteError) as e:
    _run(tmp_path, t, 6, checkpoint_every=checkpoint_every, async_checkpoint=async_checkpoint)
  msg = str(e.value)
  assert f"step {bad}:" in msg and f"fake/loss={value}" in msg and "fake/w" not in msg
  assert "(step 2)" in msg  # names the checkpoint that is left
  step, (state, meta) = _latest(tmp_path)
  assert step == 2
  assert float(state["w"]) == 3.0 and meta["trainer"] == {"done": [1, 2]}
  assert meta["responses_seen"] == 6 and meta["step"] == 2
  assert [r["step"] for r in _rows(tmp_path)] == list(range(1, bad))
  assert bad not in _called(t, "metrics")


def test_resume_continues_the_counters_and_the_trainers_meta(tmp_path):
  cfg = dict(checkpoint_every=4, eval_every=2, async_checkpoint=True)
  t1 = FakeTrainer(fail_at=7)
  with pytest.raises(Interrupted):
    _run(tmp_path, t1, 8, eval_at_start=True, **cfg)
  before = _rows(tmp_path)
  assert [r["step"] for r in before] == list(range(7))  # steps 5 and 6 went past the save
  assert _latest(tmp_path)[0] == 4

  t2 = FakeTrainer()
  counters, last_eval = _run(tmp_path, t2, 8, eval_at_start=True, **cfg)
  assert t2.loaded == (10.0, {"done": [1, 2, 3, 4]})  # w = 1 + 2 + 3 + 4
  assert _called(t2, "begin") == [5, 6, 7, 8]
  assert _called(t2, "evaluate") == [6, 8]  # no second step-0 evaluation
  assert t2.done == list(range(1, 9)) and t2.w == sum(range(9))
  rows = _rows(tmp_path)
  assert [r["step"] for r in rows] == list(range(9))  # steps 5 and 6 once, from the resumed run
  assert [r["responses_seen"] for r in rows] == [3 * s for s in range(9)]
  assert rows[5]["wall_time"] > rows[4]["wall_time"]  # the clock continues
  assert counters["step"] == 8 and counters["responses_seen"] == 24 and counters["seed"] == 7
  assert last_eval == {"eval/acc": 0.8}
  step, (state, meta) = _latest(tmp_path)
  assert step == 8 and float(state["w"]) == 36.0 and meta["trainer"]["done"] == list(range(1, 9))


def test_target_reached_is_recorded_and_the_run_goes_on(tmp_path):
  t = FakeTrainer()
  counters, _ = _run(tmp_path, t, 8, eval_every=2, target=0.5)
  rows = _rows(tmp_path)
  by_step = {r["step"]: r for r in rows}
  # accuracy step / 10 is first >= 0.5 at the evaluation of step 6 (step 5 is not evaluated)
  assert counters["step_to_target"] == 6 and counters["responses_to_target"] == 18
  assert by_step[4]["wall_time"] < counters["time_to_target"] <= by_step[6]["wall_time"]
  assert counters["step"] == 8 and _called(t, "begin") == list(range(1, 9))
  assert _latest(tmp_path)[0] == 8


def test_target_with_stop_ends_the_run_after_a_checkpoint_of_that_step(tmp_path):
  t = FakeTrainer()
  counters, last_eval = _run(tmp_path, t, 8, eval_every=2, target=0.5, stop=True)
  assert counters["step_to_target"] == 6 and counters["responses_to_target"] == 18
  assert counters["step"] == 6 and last_eval == {"eval/acc": 0.6}
  assert _called(t, "begin") == list(range(1, 7))
  assert [r["step"] for r in _rows(tmp_path)] == list(range(1, 7))
  step, (state, meta) = _latest(tmp_path)
  assert step == 6 and float(state["w"]) == 21.0
  assert meta["responses_to_target"] == 18 and meta["step_to_target"] == 6

  t2 = FakeTrainer()  # a restart of a stopped run does nothing more
  counters2, _ = _run(tmp_path, t2, 8, eval_every=2, target=0.5, stop=True)
  assert t2.calls == [] and counters2["step"] == 6 and counters2["responses_to_target"] == 18


def test_a_stop_margin_runs_on_to_the_first_evaluation_past_it_and_a_restart_stays_stopped(
    tmp_path):
  t = FakeTrainer()
  # crossed at the evaluation of step 6 (18 responses); 1.5 x 18 = 27 responses is step 9,
  # not evaluated: the run ends at the evaluation of step 10, after its checkpoint
  counters, last_eval = _run(tmp_path, t, 14, eval_every=2, target=0.5, stop=True, margin=0.5)
  assert counters["responses_to_target"] == 18 and counters["step"] == 10
  assert last_eval == {"eval/acc": 1.0} and _called(t, "begin") == list(range(1, 11))
  assert _called(t, "evaluate") == [2, 4, 6, 8, 10]
  step, (state, meta) = _latest(tmp_path)
  assert step == 10 and meta["eval_seen"] == 30
  t2 = FakeTrainer()
  counters2, _ = _run(tmp_path, t2, 14, eval_every=2, target=0.5, stop=True, margin=0.5)
  assert t2.calls == [] and counters2["step"] == 10


def test_a_starting_policy_that_meets_the_target_reaches_it_at_zero_responses(tmp_path):
  t = FakeTrainer(acc=lambda step: 0.9)
  counters, _ = _run(tmp_path, t, 4, eval_at_start=True, eval_every=2, target=0.5)
  assert counters["responses_to_target"] == 0 and counters["step_to_target"] == 0


def test_restarting_a_finished_run_does_no_step_again(tmp_path):
  _run(tmp_path, FakeTrainer(), 4, eval_at_start=True, eval_every=2)
  rows = _rows(tmp_path)
  t = FakeTrainer()
  counters, _ = _run(tmp_path, t, 4, eval_at_start=True, eval_every=2)
  assert t.calls == [] and t.w == 10.0 and t.counters == {"responses_seen": 12}
  assert counters["step"] == 4 and counters["responses_seen"] == 12
  assert _rows(tmp_path) == rows


def test_restarting_a_finished_run_returns_its_last_evaluation(tmp_path):
  _, first = _run(tmp_path, FakeTrainer(), 4, eval_every=2)
  assert first == {"eval/acc": 0.4}
  _, again = _run(tmp_path, FakeTrainer(), 4, eval_every=2)
  assert again == first


class StateGoesBad(FakeTrainer):
  """Finite metrics (computed before the update), but the state after step `bad_state` is NaN,
  as with a learning rate of 1e39."""

  def __init__(self, bad_state, **kw):
    super().__init__(**kw)
    self.bad_state = bad_state

  def complete(self, step, t_begin, t_start):
    p = super().complete(step, t_begin, t_start)
    if step >= self.bad_state:
      self.w = math.nan
    return p


@pytest.mark.parametrize("bad_state, intact", [(4, r"The last checkpoint \(step 2\)"),
                                               (2, "No checkpoint was saved yet")])
def test_a_state_with_nan_is_never_saved(tmp_path, bad_state, intact):
  """The step's metrics are finite; the state after it is not: the save refuses it."""
  with pytest.raises(loop.NonFiniteError, match=rf"step {bad_state}: the state to save holds "
                     rf"NaN or Inf in 1 arrays \(\['w'\]\).*{intact}"):
    _run(tmp_path, StateGoesBad(bad_state), 6, checkpoint_every=2)
  ckpt = Checkpointer(str(tmp_path / "checkpoints"))
  assert ckpt.latest_step() == (2 if bad_state == 4 else None)
  if ckpt.latest_step():
    state, _ = ckpt.restore(2, {"w": jnp.zeros((), jnp.float32)})
    assert np.isfinite(float(state["w"]))


def test_resume_rewrites_metrics_from_the_checkpoint(tmp_path):
  """A cut last line and a damaged middle line: the resumed file has one valid row a step."""
  with pytest.raises(Interrupted):
    _run(tmp_path, FakeTrainer(fail_at=6), 8, eval_at_start=True, eval_every=2,
         checkpoint_every=4)
  path = tmp_path / "metrics.jsonl"
  lines = path.read_text().splitlines(keepends=True)
  assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 3, 4]  # 5 was not fetched yet
  lines[2] = lines[2][:10] + "\n"  # step 2's row cut mid-way
  path.write_text("".join(lines[:-1]) + lines[-1][:7])  # and step 4's, the checkpoint's, too
  _run(tmp_path, FakeTrainer(), 8, eval_at_start=True, eval_every=2, checkpoint_every=4)
  rows = _rows(tmp_path)
  assert [r["step"] for r in rows] == list(range(9))
  straight = tmp_path / "straight"
  _run(straight, FakeTrainer(), 8, eval_at_start=True, eval_every=2, checkpoint_every=4)
  for a, b in zip(_rows(straight), rows):
    assert {k: v for k, v in a.items() if not k.startswith(("time/", "wall", "throughput/"))} == \
        {k: v for k, v in b.items() if not k.startswith(("time/", "wall", "throughput/"))}


def test_preemption_saves_the_step_in_flight_and_asks_to_be_requeued(tmp_path):
  from rlscale.trainer import preemption

  class Preempts(FakeTrainer):
    def complete(self, step, t_begin, t_start):
      if step == 3:
        preemption._handler(15, None)  # SIGTERM arrives during step 3
      return super().complete(step, t_begin, t_start)

  try:
    with pytest.raises(preemption.Preempted) as e:
      _run(tmp_path, Preempts(), 8, checkpoint_every=5)
  finally:
    preemption.reset()
  assert e.value.step == 3
  assert Checkpointer(str(tmp_path / "checkpoints")).latest_step() == 3  # not 0: nothing lost
  assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]
  t = FakeTrainer()
  _run(tmp_path, t, 8, checkpoint_every=5)
  assert _called(t, "begin")[0] == 4 and t.w == sum(range(1, 9))


@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR2"])
def test_preemption_signals(name):
  """Slurm sends SIGUSR2 before the time limit (rlscale/sweep/launchers/slurm.py), SIGTERM on preemption."""
  import os
  import signal

  from rlscale.trainer import preemption
  old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
  try:
    preemption.install(watchdog=False)  # the watchdog would stop this process: below
    os.kill(os.getpid(), getattr(signal, name))
    assert preemption.requested()
  finally:
    preemption.reset()
    for s, h in old.items():
      signal.signal(s, h)


_STUCK = """
import sys, time
from rlscale.trainer import preemption
preemption.install()
if sys.argv[1] == "steps":
  preemption.step_finished()
print("ready", flush=True)
time.sleep(120)  # a main thread that never reaches a step boundary
"""


@pytest.mark.parametrize("phase", ["setup", "steps"])
def test_a_signal_stops_a_process_that_never_reaches_a_step_boundary(phase):
  """Before this process finished a step (validation, compilation, a first step that never
  ends) a SIGTERM stops it at once; later, after the grace the step in flight has to be saved.
  Both with EXIT_REQUEUE and one line naming why."""
  import signal
  import subprocess
  import sys
  import time

  from rlscale.trainer.preemption import EXIT_REQUEUE
  env = dict(os.environ, RLSCALE_PREEMPT_GRACE_S="1.5")
  proc = subprocess.Popen([sys.executable, "-c", _STUCK, phase], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)
  assert proc.stdout.readline().strip() == "ready"
  t = time.time()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=30)
  waited = time.time() - t
  assert proc.returncode == EXIT_REQUEUE, err
  if phase == "setup":
    assert "before this process finished a step" in err and waited < 1.5, (waited, err)
  else:
    assert "did not reach its boundary within 1.5 s" in err and waited >= 1.5, (waited, err)


_FORKS = """
import os, signal, sys, time
from rlscale.trainer import preemption
preemption.install()
preemption.step_finished()
pid = os.fork()
if pid == 0:  # a forked child's signal is its own: the parent's watchdog must not wake
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.3)
  os._exit(0)
os.waitpid(pid, 0)
time.sleep(1.5)  # past the parent's grace
print("parent alive", flush=True)
"""


def test_a_forked_childs_signal_does_not_stop_the_parent():
  import subprocess
  import sys
  env = dict(os.environ, RLSCALE_PREEMPT_GRACE_S="0.5")
  out = subprocess.run([sys.executable, "-c", _FORKS], capture_output=True, text=True, env=env,
                       timeout=60)
  assert out.returncode == 0 and out.stdout.strip() == "parent alive", out.stderr

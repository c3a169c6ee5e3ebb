"""Runs side by side (--seeds, --lanes, a sweep's --vectorize): each lane is its run alone.

Real processes on one CPU device per run (the tests' 8 simulated devices would lay a run out
anew): the non-degenerate tiny GRPO recipe of tests/support/workers/two_process_rl.py, whose
rewards and gradients are not zero.

What holds (and is asserted): a lane's decode runs the program of its run alone, so its
starting evaluation and its first step's sampled responses (rewards, lengths, tokens) are
identical; its update is compiled inside the mapped program, whose fusions may order a sum
differently (bit-identical on some runs of this test, 1e-7 apart on others: a gradient norm of
0.90833777 against 0.90833783), so the update's metrics and every later step agree within
LANE_RTOL (LANE_ATOL for numbers that are rounding noise around 0,
such as PPO's policy loss, whose whitened advantages cancel to 1e-8, or a KL of 1e-14) over
10 steps of GRPO and 4 of PPO.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import REPO

SFT = ("--config.init.sft_config=configs/sft.py:tiny,optim.warmup_responses=0,"
       "train.num_steps=60,train.eval_every=0,train.checkpoint_every=0")
MACHINE = ("time/", "memory/", "throughput/", "mfu/", "wall_time")
LANE_RTOL, LANE_ATOL = 1e-4, 1e-6


def _env(cache: str) -> dict:
  xla = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count"))
  return dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS=xla, RLSCALE_COMPILATION_CACHE="off")


def _run(args: list[str], cwd, steps: int = 10, config: str = "grpo.py",
         **kw) -> subprocess.CompletedProcess:
  argv = [sys.executable, os.path.join(REPO, "launch", "main.py"),
          f"--config=configs/{config}:tiny", "--config.task.partial_credit=True", SFT,
          f"--config.train.num_steps={steps}", "--config.train.checkpoint_every=4", *args]
  return subprocess.run(argv, cwd=cwd, env=_env(str(cwd)), capture_output=True, text=True, **kw)


def _rows(path) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _numbers(row: dict) -> dict:
  return {k: v for k, v in row.items() if not k.startswith(MACHINE)}


SAMPLED = ("reward/", "response/", "rollout/", "response_tokens", "responses_", "tokens_seen",
           "train_tokens", "step")


def _sampled(row: dict) -> dict:
  """What a step's sampled responses alone decide (no update has run yet)."""
  return {k: v for k, v in row.items() if k.startswith(SAMPLED)}


# (config, steps, the seed compared with its run alone)
CASES = (("grpo.py", 10, 1), ("ppo.py", 4, 0))


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory, tiny_sft_base):
  """Seeds 0 and 1 side by side, and one of them alone: GRPO 10 steps, PPO 4 (one base: the
  session's, which tests/support/workers/two_process_rl.py's recipe builds too)."""
  root = tmp_path_factory.mktemp("lanes")
  alone, side = {}, {}
  base = f"--config.init.cache_dir={tiny_sft_base}"
  for config, steps, seed in CASES:
    p = _run([f"--config.seed={seed}", f"--workdir={config}-alone", base], root, steps, config)
    assert p.returncode == 0, p.stderr[-3000:]
    alone[config] = _rows(root / f"{config}-alone" / "metrics.jsonl")
    p = _run([f"--seeds=0,1", f"--workdir={config}-side/seed={{seed}}", base], root, steps,
             config)
    assert p.returncode == 0, p.stderr[-3000:]
    for s in (0, 1):
      side[config, s] = _rows(root / f"{config}-side" / f"seed={s}" / "metrics.jsonl")
  return root, alone, side


@pytest.mark.slow(seconds=150)
@pytest.mark.parametrize("config, steps, seed", CASES)
def test_each_lane_is_its_seed_run_alone(side_by_side, config, steps, seed):
  root, alone, side = side_by_side
  a, b = side[config, seed], alone[config]
  assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(steps + 1))
  assert _numbers(a[0]) == _numbers(b[0])  # the starting evaluation: same samples
  assert _sampled(a[1]) == _sampled(b[1])  # step 1: the same responses
  for x, y in zip(a[1:], b[1:]):
    x, y = _numbers(x), _numbers(y)
    assert set(x) == set(y)
    for k in x:
      if isinstance(x[k], (int, float)) and not isinstance(x[k], bool):
        assert x[k] == pytest.approx(y[k], rel=LANE_RTOL, abs=LANE_ATOL), (x["step"], k)
      else:
        assert x[k] == y[k], (x["step"], k)
  assert _numbers(side[config, 0][1]) != _numbers(side[config, 1][1])  # two runs, not one
  with open(root / f"{config}-side" / "seed=1" / "summary.json") as f:
    summary = json.load(f)
  assert summary["lanes"]["count"] == 2 and summary["lanes"]["lane"] == 1
  assert summary["seed"] == 1 and summary["compilations"]["actor"] == 1


@pytest.mark.slow(seconds=90)
def test_a_lane_resumes_alone_and_a_stopped_group_resumes_bit_exactly(side_by_side, tmp_path,
                                                                     tiny_sft_base):
  root, alone, side = side_by_side
  base = f"--config.init.cache_dir={tiny_sft_base}"
  # A lane's checkpoint is its run's: the run alone extends it (its own programs from there).
  import shutil
  shutil.copytree(root / "grpo.py-side" / "seed=1", tmp_path / "lane1")
  p = _run(["--config.seed=1", f"--workdir={tmp_path / 'lane1'}", base,
            "--allow_config_change=train.num_steps"], root, steps=12)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "resumed from the checkpoint of step 10" in p.stderr
  assert [r["step"] for r in _rows(tmp_path / "lane1" / "metrics.jsonl")] == list(range(13))
  # A group stopped by SIGTERM once a step saved resumes to the rows of the unbroken group.
  argv = [sys.executable, os.path.join(REPO, "launch", "main.py"),
          "--config=configs/grpo.py:tiny", "--config.task.partial_credit=True", SFT,
          "--config.train.num_steps=10", "--config.train.checkpoint_every=4", "--seeds=0,1",
          f"--workdir={tmp_path}/stop/seed={{seed}}", base]
  proc = subprocess.Popen(argv, cwd=root, env=_env(str(root)), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  # Signalled once the first lane's row of step 4 is written (its save dispatched; orbax names
  # the step's folder only when the save commits, which a fast run could outlive).
  rows = tmp_path / "stop" / "seed=1" / "metrics.jsonl"
  deadline = time.time() + 240
  while (proc.poll() is None and time.time() < deadline
         and not (rows.exists() and '"step": 4,' in rows.read_text())):
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=240)
  assert proc.returncode == 75, err[-3000:]
  p = subprocess.run(argv, cwd=root, env=_env(str(root)), capture_output=True, text=True)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "all resume from" in p.stderr or "resumed from the checkpoint" in p.stderr
  for seed in (0, 1):
    got = _rows(tmp_path / "stop" / f"seed={seed}" / "metrics.jsonl")
    assert [_numbers(r) for r in got] == [_numbers(r) for r in side["grpo.py", seed]], seed


@pytest.mark.slow(seconds=60)
def test_a_sweep_runs_its_seeds_side_by_side(tmp_path):
  """launch/sweep.py --vectorize=seed: two points in one process, each done in its directory
  with its own launch.log naming the group."""
  from rlscale.sweep import manifest as mf
  # Its own process: the sweep's command line defines --config, as launch/main.py's does.
  argv = [sys.executable, os.path.join(REPO, "launch", "sweep.py"),
          f"--config={os.path.join(REPO, 'configs', 'grpo.py')}:tiny",
          "--sweep=batch_invariance", f"--workdir={tmp_path / 'sw'}", "--vectorize=seed",
          "--only=p=4,lr_scaling=sqrt"]
  env = _env(str(tmp_path))
  # From a folder of its own: the config's base policy goes to its runs/base.
  r = subprocess.run(argv + ["--dry_run"], cwd=tmp_path, env=env, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "# side by side: p=4,lr_scaling=sqrt,seed=0, " in r.stdout
  assert r.stdout.count("--lanes=") == 1 and "2 points in 1 processes" in r.stdout
  r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]
  m = mf.load(str(tmp_path / "sw"))
  done = [e for e in m.points if e.status == mf.DONE]
  assert len(done) == 2 and len({e.job_id for e in done}) == 1  # one process, two runs
  for e in done:
    assert os.path.exists(os.path.join(e.run_dir, "summary.json"))
    with open(os.path.join(e.run_dir, "launch.log")) as f:
      assert "side by side with 1 other points" in f.read()


def test_configs_that_cannot_run_side_by_side_are_refused_in_one_line(tmp_path):
  from rlscale.config import files as config_files
  from rlscale.config.errors import ConfigError
  from rlscale.run import train
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  cfgs, dirs = train.lane_configs(cfg, [0, 1], workdir=str(tmp_path / "s{seed}"))
  assert [c.seed for c in cfgs] == [0, 1] and dirs[1].endswith("s1")
  with cfgs[1].unlocked():
    cfgs[1].rl.num_prompts = 8
    cfgs[1].rl.kl_coef = 0.1
  with pytest.raises(ConfigError, match="differs from .* in rl.num_prompts.*may differ only "
                     "in seed, optim.lr"):
    train.main_lanes(cfgs, dirs)
  cfgs[1].rl.num_prompts = cfgs[0].rl.num_prompts
  with pytest.raises(ConfigError, match="rl.kl_coef: 0.0 in .* 0.1 in .* which removes a term"):
    train.main_lanes(cfgs, dirs)
  with cfgs[0].unlocked():
    cfgs[0].rollout.max_staleness = 1
  with pytest.raises(ConfigError, match="rollout.max_staleness=1: runs side by side need 0"):
    train.main_lanes(cfgs[:1], dirs[:1])
  with pytest.raises(ConfigError, match=r"put \{seed\} in it"):
    train.lane_configs(cfg, [0, 1], workdir=str(tmp_path / "one"))


@pytest.mark.slow(seconds=60)
def test_each_lane_stops_at_its_own_target(side_by_side, tmp_path, tiny_sft_base):
  """target.stop with a margin: each lane ends at its first evaluation at or past 1.5 x its own
  responses to target, its rows those of the unbroken group up to there, its policy that
  step's; the group ends with its last lane. The target is read off the unbroken group's
  evaluations so that the two seeds reach it at different evaluations where any value does."""
  root, alone, side = side_by_side
  runs = [side["grpo.py", s] for s in (0, 1)]
  evals = [[(r["step"], r["responses_seen"], r) for r in rows if any(k.startswith("eval/")
                                                                       for k in r)]
           for rows in runs]

  def stop_step(ev, metric, value):
    hit = next((seen for _, seen, r in ev if r[metric] >= value), None)
    if hit is None:
      return None
    return next((step for step, seen, _ in ev if seen >= 1.5 * hit), None)

  def candidates(metric):
    start = max(ev[0][2][metric] for ev in evals)  # above where both start: a crossing to make
    return [(metric, v) for v in sorted({r[metric] for ev in evals for _, _, r in ev})
            if v > start]

  # the sampled evaluations differ by seed, the greedy ones once the weights do
  pairs = [c for m in ("eval/reward_sampled", "eval/reward_greedy", "eval/accuracy_sampled")
           for c in candidates(m)] or [("eval/reward_greedy", 1.0)]
  metric, value = max(pairs, key=lambda mv: len({stop_step(ev, *mv) for ev in evals}))
  want = [10 if stop_step(ev, metric, value) is None else stop_step(ev, metric, value)
          for ev in evals]
  assert len(set(want)) == 2, (metric, value, want)  # the lanes stop apart
  args = ["--seeds=0,1", f"--workdir={tmp_path}/seed={{seed}}",
          f"--config.init.cache_dir={tiny_sft_base}", f"--config.target.metric={metric}",
          f"--config.target.value={value}", "--config.target.stop=True",
          "--config.target.stop_margin=0.5", "--config.train.keep_checkpoints=10"]
  p = _run(args, root, steps=10)
  assert p.returncode == 0, p.stderr[-3000:]

  def check():
    for seed, rows, end in zip((0, 1), runs, want):
      got = _rows(tmp_path / f"seed={seed}" / "metrics.jsonl")
      assert [r["step"] for r in got] == list(range(end + 1)), (seed, value, want)
      assert [_numbers(r) for r in got] == [_numbers(r) for r in rows[:end + 1]], seed
      with open(tmp_path / f"seed={seed}" / "summary.json") as f:
        assert json.load(f)["step"] == end
  check()
  # Preempted after the first lane stopped: the later lane's checkpoints past an earlier save
  # and its summary are gone. The rerun keeps the stopped lane at its own stop (nothing set
  # aside, nothing trained again) and resumes the other from its save, to the same rows.
  late = int(want[1] > want[0])
  folder = tmp_path / f"seed={late}"
  kept = sorted(int(d.name) for d in (folder / "checkpoints").iterdir() if d.name.isdigit())
  back = max(c for c in kept if c < want[late])
  import shutil
  for c in kept:
    if c > back:
      shutil.rmtree(folder / "checkpoints" / str(c))
  (folder / "summary.json").unlink()
  p = _run(args, root, steps=10)
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resumed from the checkpoint of step {back}" in p.stderr
  assert "set aside" not in p.stderr
  check()


def test_members_replay_the_regroups():
  from rlscale.trainer import lanes
  # 10 lanes: 5 stop by step 6 (re-form with the other 5), 3 more by 9 (re-form with 2).
  stops = [4, 5, 5, 6, 6, 8, 9, 9, None, None]
  assert lanes._members(stops, 5, 20) == list(range(10))  # 7 of 10 running
  assert lanes._members(stops, 6, 20) == [5, 6, 7, 8, 9]
  assert lanes._members(stops, 8, 20) == [5, 6, 7, 8, 9]  # 4 of 5 running
  assert lanes._members(stops, 9, 20) == [8, 9]
  assert lanes._members(stops, 12, 20) == [8, 9]  # a group of 2 does not re-form
  assert lanes._members(stops, 6, 6) == list(range(10))  # not at the last step
  assert lanes._members([2, 2, 2, None], 3, 20) == [3]
  assert lanes._members([2, None, None], 3, 20) == [0, 1, 2]  # fewer than REGROUP_MIN
  assert lanes._members([2, 2, 2, 2], 3, 20) == [0, 1, 2, 3]  # nothing left running


@pytest.mark.slow(seconds=240)
def test_a_group_re_forms_without_its_stopped_lanes_and_resumes_so(tmp_path, tiny_sft_base):
  """Four lanes stopping at their targets apart: once two have stopped, the two running on
  re-form as a group of their own. Every lane's rows equal the unbroken group's up to the
  re-forming (the stopped lanes' all the way) and agree within the lanes' tolerance after it
  (another program); a lane preempted after it resumes to the very rows it had."""
  from rlscale.trainer import lanes
  root = tmp_path
  base = f"--config.init.cache_dir={tiny_sft_base}"
  common = ["--seeds=0,1,2,3", base, "--config.train.eval_every=1"]
  p = _run(common + [f"--workdir={root}/whole/seed={{seed}}"], root, steps=10)
  assert p.returncode == 0, p.stderr[-3000:]
  whole = [_rows(root / "whole" / f"seed={s}" / "metrics.jsonl") for s in range(4)]

  def stops(metric, value):  # each lane's stop step (margin 0: its first evaluation past it)
    return [next((r["step"] for r in rows if metric in r and r[metric] >= value), None)
            for rows in whole]

  def regroup(st):  # the step the group re-forms at, and who runs on
    for step in range(1, 10):
      keep = lanes._members([s if s is not None and s <= step else None for s in st], step, 10)
      if len(keep) < 4:
        return step, keep
    return None, None

  options = []
  for metric in ("eval/reward_sampled", "eval/accuracy_sampled", "eval/reward_greedy"):
    for value in sorted({r[metric] for rows in whole for r in rows if metric in r}):
      st = stops(metric, value)
      at, keep = regroup(st)
      if at and all(s is None or s >= 1 for s in st) and all(
          s is None or s > at for s in (st[k] for k in keep)):
        options.append((metric, value, st, at, keep))
  assert options, "no target stops two lanes before the others"
  metric, value, st, at, keep = options[0]
  args = common + [f"--workdir={root}/stop/seed={{seed}}", f"--config.target.metric={metric}",
                   f"--config.target.value={value}", "--config.target.stop=True",
                   "--config.train.keep_checkpoints=10"]
  p = _run(args, root, steps=10)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "2 of 4 lanes running: the group re-forms with them" in p.stderr or \
      f"{len(keep)} of 4 lanes running" in p.stderr
  got = [_rows(root / "stop" / f"seed={s}" / "metrics.jsonl") for s in range(4)]
  for s in range(4):
    end = st[s] if st[s] is not None else 10
    assert [r["step"] for r in got[s]] == list(range(end + 1)), (s, st)
    for a, b in zip(got[s], whole[s]):
      a, b = _numbers(a), _numbers(b)
      if a["step"] <= at:
        assert a == b, (s, a["step"])
      else:
        assert s in keep
        for k in a:
          if isinstance(a[k], (int, float)) and not isinstance(a[k], bool):
            assert a[k] == pytest.approx(b[k], rel=LANE_RTOL, abs=LANE_ATOL), (s, a["step"], k)
  # The latest lane preempted after the re-forming: its checkpoints past the re-forming and its
  # summary gone. The rerun replays the re-forming and ends with the same rows.
  late = max(keep, key=lambda k: st[k] if st[k] is not None else 11)
  folder = root / "stop" / f"seed={late}"
  import shutil
  for c in (folder / "checkpoints").iterdir():
    if c.name.isdigit() and int(c.name) > at:
      shutil.rmtree(c)
  (folder / "summary.json").unlink()
  p = _run(args, root, steps=10)
  assert p.returncode == 0, p.stderr[-3000:]
  assert f"resumed from the checkpoint of step {at}" in p.stderr
  assert [_numbers(r) for r in _rows(folder / "metrics.jsonl")] == [
      _numbers(r) for r in got[late]]

"""The main job on the tiny configs: run directory, no recompilation, resume, NaN stop."""

import json
import os

import numpy as np
import pytest

from tests.support import REPO
from rlscale.config import files as config_files
from rlscale.trainer import loop
from rlscale.run import base_policy, train
from rlscale.trainer import sft_trainer
from rlscale.checkpoints.checkpointer import Checkpointer, CheckpointMismatch
from rlscale.config.errors import ConfigError

# The only metrics that may differ on resume.
TIMING = ("time/", "throughput/", "memory/", "wall_time")


def _config(base_cache, name="grpo.py", arg="tiny", **overrides):
  cfg = config_files.load(os.path.join(REPO, "configs", f"{name}:{arg}"))
  with cfg.unlocked():
    if "init" in cfg:
      cfg.init.cache_dir = base_cache  # the shared tiny SFT base (conftest.py)
      cfg.init.sft_config = os.path.join(REPO, "configs", "sft.py:tiny")
    for k, v in overrides.items():
      section, field = k.split(".")
      cfg[section][field] = v
  return cfg


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow(seconds=45)
def test_grpo_tiny_end_to_end(tiny_sft_base, tmp_path, monkeypatch):
  cfg = _config(tiny_sft_base)
  summary = train.main(cfg, str(tmp_path / "run"))
  run = tmp_path / "run"
  for name in ("config.json", "metrics.jsonl", "summary.json", "policy/config.json",
               "policy/model.safetensors"):
    assert (run / name).exists(), name
  assert any(n.startswith("events.out.tfevents") for n in os.listdir(run / "tensorboard"))
  base = base_policy.cache_folder(cfg, None)  # this recipe's base, built (or found) and cached
  assert os.path.exists(os.path.join(base, "policy", sft_trainer.DONE)), base
  rows = _rows(run)
  assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
  assert "eval/accuracy_greedy" in rows[0] and rows[0]["responses_seen"] == 0
  p, g = cfg.rl.num_prompts, cfg.rl.group_size
  for r in rows[1:]:
    assert r["responses_seen"] == r["step"] * p * g
    for key in ("reward/mean", "reward/std", "reward/accuracy", "response/length_mean",
                "actor/entropy", "actor/clip_frac", "actor/grad_norm", "actor/grad_norm_max",
                "actor/lr", "actor/b1", "actor/b2", "actor/eps", "tokens_seen",
                "time/generate", "time/reward", "time/actor_update", "time/other", "wall_time",
                "throughput/gen_tokens_per_s", "throughput/train_tokens_per_s",
                "throughput/responses_per_s", "flops/step"):
      assert key in r and np.isfinite(r[key]), key
    assert r["flops/step"] > 0  # the model FLOPs of the step (a report's compute axis)
    unit = "prompts" if r["step"] % 2 == 0 else "responses"  # alternate partitions
    for k in ("b_simple", "grad_sq_est", "trace_est", "grad_sq_ema", "trace_ema"):
      assert f"actor/noise_{unit}/{k}" in r, (r["step"], k)
    phases = sum(v for k, v in r.items() if k.startswith("time/") and k != "time/step")
    assert abs(phases - r["time/step"]) < 1e-6  # the phases add up to the step
  for step in (2, 4):
    assert "eval/accuracy_sampled" in rows[step]
  assert summary["compilations"] == {"actor": 1, "sampler": 1}
  assert summary["target"]["metric"] == "eval/accuracy_greedy"
  assert "responses_to_target" in summary and "mean/throughput/responses_per_s" in summary
  assert summary["responses_seen"] == 4 * p * g
  with open(run / "summary.json") as f:
    assert json.load(f)["step"] == 4
  # The cached base is reused: a second run builds nothing.
  cached = sorted(os.listdir(tiny_sft_base))
  train.main(_config(tiny_sft_base), str(tmp_path / "run2"))
  assert sorted(os.listdir(tiny_sft_base)) == cached
  # A resume whose restore fails (here: made to) leaves config.json and the history as they
  # were, so the original command still resumes.
  before = {n: (run / n).read_bytes() for n in ("config.json", "config_history.jsonl")}

  def fails(*args, **kwargs):
    raise CheckpointMismatch("checkpoint step 4 does not hold what the restore asks for")
  with monkeypatch.context() as m:
    m.setattr(Checkpointer, "restore_latest", fails)
    with pytest.raises(ConfigError, match="does not hold .* resume with that config"):
      train.main(_config(tiny_sft_base, **{"train.num_steps": 6}), str(run),
                 allow_config_change=("train.num_steps",))
  assert {n: (run / n).read_bytes() for n in before} == before
  # Re-running the finished run does no step and keeps its summary's evaluation and counts.
  again = train.main(_config(tiny_sft_base), str(run))
  assert again["compilations"] == {"actor": 1, "sampler": 1}
  assert again["eval/accuracy_greedy"] == summary["eval/accuracy_greedy"]
  assert _rows(run) == rows


@pytest.mark.slow(seconds=35)
def test_equal_samples_put_eval_points_at_the_same_x_for_two_batch_sizes(tiny_sft_base, tmp_path):
  xs = {}
  for p in (4, 8):
    cfg = _config(tiny_sft_base, **{"rl.num_prompts": p, "train.total_responses": 64,
                               "train.eval_every_responses": 32, "train.eval_every": 0,
                               "optim.lr_scaling": "sqrt", "optim.reference_batch": 16,
                               "target.value": 0.0})
    summary = train.main(cfg, str(tmp_path / f"p{p}"))
    rows = _rows(tmp_path / f"p{p}")
    xs[p] = [r["responses_seen"] for r in rows if "eval/accuracy_greedy" in r]
    assert rows[-1]["responses_seen"] == 64 and summary["responses_seen"] == 64
    # sqrt rule: lr x sqrt(B / 16); the target (>= 0) is met by the starting policy already.
    assert rows[1]["actor/lr"] == pytest.approx(cfg.optim.lr * (p * 4 / 16) ** 0.5, rel=1e-5)
    assert summary["responses_to_target"] == 0 and summary["step_to_target"] == 0
  assert xs[4] == xs[8] == [0, 32, 64]


class _DiesAtCall:
  """An Update that raises on its n-th call, as a killed process stops mid-run."""

  def __init__(self, update, n):
    self._update, self._n, self._calls = update, n, 0

  def __call__(self, *args):
    self._calls += 1
    if self._calls == self._n:
      raise KeyboardInterrupt("killed")
    return self._update(*args)

  def __getattr__(self, name):
    return getattr(self._update, name)


@pytest.mark.slow
@pytest.mark.parametrize("name,arg", [("grpo.py", "tiny"), ("ppo.py", "tiny"),
                                      ("grpo.py", "tiny,rl.ptx_coef=0.5")])  # PPO-ptx's demos
def test_resume_after_a_kill_matches_an_uninterrupted_run(tiny_sft_base, name, arg, tmp_path, monkeypatch):
  train.main(_config(tiny_sft_base, name=name, arg=arg), str(tmp_path / "straight"))

  from rlscale.rl import trained
  real_make_update = trained.make_update
  # Every model's update dies at its third call: after the checkpoint of step 2, in step 3.
  monkeypatch.setattr(trained, "make_update",
                      lambda *a, **kw: _DiesAtCall(real_make_update(*a, **kw), 3))
  with pytest.raises(KeyboardInterrupt):
    train.main(_config(tiny_sft_base, name=name, arg=arg), str(tmp_path / "resumed"))
  monkeypatch.setattr(trained, "make_update", real_make_update)
  assert Checkpointer(str(tmp_path / "resumed" / "checkpoints")).latest_step() == 2
  train.main(_config(tiny_sft_base, name=name, arg=arg), str(tmp_path / "resumed"))  # the same again

  straight, resumed = _rows(tmp_path / "straight"), _rows(tmp_path / "resumed")
  assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]  # step 3's partial work was dropped
  for a, b in zip(straight[3:], resumed[3:]):
    keys = {k for k in a if not k.startswith(TIMING)}
    assert keys == {k for k in b if not k.startswith(TIMING)}
    for k in sorted(keys):
      assert a[k] == b[k], (a["step"], k, a[k], b[k])  # CPU runs are deterministic: exact


@pytest.mark.slow
def test_nan_stops_the_run_and_keeps_the_last_checkpoint(tiny_sft_base, tmp_path, monkeypatch):
  from rlscale.rl import grpo
  real = grpo.make_policy_loss

  def poisoned(rl, kl_in_loss=True):
    loss = real(rl, kl_in_loss)
    def nan_loss(inputs):
      total, metrics = loss(inputs)
      bad = inputs.extras["advantages"][:, None] * 0 + float("nan")
      return total + bad, metrics
    return nan_loss

  cfg = _config(tiny_sft_base)
  train.main(cfg, str(tmp_path / "run"))  # a healthy run: checkpoints at 2 and 4
  monkeypatch.setattr(grpo, "make_policy_loss", poisoned)
  cfg = _config(tiny_sft_base, **{"train.num_steps": 6})
  with pytest.raises(loop.NonFiniteError,
                     match=r"step 5: non-finite .*actor/loss.*step 4\) .* intact"):
    train.main(cfg, str(tmp_path / "run"), allow_config_change=("train.num_steps",))
  ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"))
  assert ckpt.latest_step() == 4
  assert [r["step"] for r in _rows(tmp_path / "run")] == [0, 1, 2, 3, 4]


@pytest.mark.slow
def test_sft_tiny_writes_a_loadable_policy(tiny_sft_base, tmp_path, mesh1, rules):
  from rlscale.checkpoints import hf
  cfg = _config(tiny_sft_base, name="sft.py")
  summary = train.main(cfg, str(tmp_path / "sft"))
  assert "eval/accuracy_greedy" in summary
  model, mcfg = hf.load_policy(str(tmp_path / "sft" / "policy"), mesh1, rules)
  assert mcfg.d_model == cfg.model.d_model

"""Configs: every field validated before compute, errors that name the field and value."""

import os

import pytest

from tests.support import REPO
from tests.support.cli import run_in_process
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.resolve.resolved import validate



def _cfg(name="grpo.py", arg=None):
  return config_files.load(os.path.join(REPO, "configs", name + (f":{arg}" if arg else "")))


@pytest.mark.parametrize("name", ["grpo.py", "sft.py", "ppo.py"])
@pytest.mark.parametrize("arg", [None, "tiny"])
def test_shipped_configs_are_valid(name, arg):
  validate(_cfg(name, arg))  # on the 8 simulated devices of the test run


def test_every_field_has_a_comment():
  """Each field an experiment file sets (before its variants) says what it is for."""
  for name in ("grpo.py", "sft.py", "ppo.py"):
    with open(os.path.join(REPO, "configs", name)) as f:
      body = f.read().split("def get_config")[1].split("common.apply_arg")[0]
    for line in body.splitlines():
      s = line.strip()
      if s.startswith("c.") and "=" in s and not s.endswith("ConfigDict()"):
        assert "#" in s or "common." in s, (name, s)


@pytest.mark.parametrize("name, field, value, message", [
    ("grpo.py", "rl.num_minibatches", 3, "rl.num_minibatches=3 does not divide P*G responses per step (512)"),
    ("grpo.py", "rl.microbatch", 96, "rl.microbatch=96 does not divide the mini-batch"),
    ("grpo.py", "rl.microbatch", 4, "rl.microbatch=4 must split over 8 batch shards"),
    ("grpo.py", "rl.group_size", 1, "rl.group_size=1: advantage 'grpo' needs groups of 2+"),
    ("grpo.py", "rl.num_prompts", 0, "rl.num_prompts=0 must be a positive integer"),
    ("grpo.py", "rl.advantage", "ppo", "rl.advantage='ppo'; known:"),
    ("grpo.py", "rl.loss_aggregation", "mean", "rl.loss_aggregation='mean'; known:"),
    ("grpo.py", "rl.kl_estimator", "k4", "rl.kl_estimator='k4'"),
    ("grpo.py", "rl.old_logprobs", "cached", "rl.old_logprobs='cached'"),
    ("grpo.py", "rl.clip_eps_low", 1.5, "rl.clip_eps_low=1.5"),
    ("grpo.py", "rollout.temperature", 0.0, "rollout.temperature=0.0 must be > 0"),
    ("grpo.py", "rollout.generation_batch", 12, "rollout.generation_batch=12 must split over 8"),
    ("grpo.py", "rollout.top_p", 1.5, "rollout.top_p=1.5"),
    ("grpo.py", "model.name", "gpt5", "model.name='gpt5'"),
    ("grpo.py", "model.dtype", "int8", "model.dtype='int8'"),
    ("grpo.py", "mesh.shape", (3, 1, 1), "mesh.shape=(3, 1, 1) does not fit 8 devices"),
    ("grpo.py", "mesh.shape", (-1, -1, 2), "at most one -1"),
    ("grpo.py", "task.name", "chess", "task.name='chess'"),
    ("grpo.py", "train.eval_every", -1, "train.eval_every=-1 must be an integer >= 0"),
    ("grpo.py", "optim.lr", 0.0, "optim.lr=0.0 must be a positive number"),
    ("grpo.py", "optim.schedule", "step", "optim.schedule='step'"),
    ("ppo.py", "critic.microbatch", 96, "critic.microbatch=96 does not divide the critic's mini-batch"),
    ("ppo.py", "critic.num_minibatches", 3, "critic.num_minibatches=3 does not divide"),
    ("ppo.py", "rl.gamma", 1.5, "rl.gamma=1.5 must be in [0, 1]"),
    ("ppo.py", "rl.dual_clip", 0.5, "rl.dual_clip=0.5 must be > 1"),
    ("ppo.py", "rl.prox_com", -1.0, "rl.prox_com=-1.0"),
])
def test_bad_values_are_named(name, field, value, message):
  cfg = _cfg(name)
  section, key = field.split(".")
  with cfg.unlocked():
    cfg[section][key] = value
  with pytest.raises(ConfigError) as e:
    validate(cfg)
  assert message in str(e.value)


def test_all_problems_are_reported_at_once():
  cfg = _cfg()
  cfg.rl.num_minibatches, cfg.rollout.temperature = 3, -1.0
  with pytest.raises(ConfigError) as e:
    validate(cfg)
  assert "rl.num_minibatches=3" in str(e.value) and "rollout.temperature=-1.0" in str(e.value)


def test_cli_override_and_error_before_any_compute(tmp_path):
  from rlscale.run import main  # in this process: tests/support/cli.py
  out = run_in_process(main.run, [f"--config={REPO}/configs/grpo.py",
                                  "--config.rl.num_minibatches=3", f"--workdir={tmp_path}/run"])
  assert out.returncode == 2 and "Traceback" not in out.stderr
  assert out.stderr.strip().splitlines()[-1].startswith(
      "error: invalid config: rl.num_minibatches=3 does not divide")
  assert not os.path.exists(tmp_path / "run")  # failed before touching the run directory
  out = run_in_process(main.run, [f"--config={REPO}/configs/grpo.py", "--config.rl.num_promts=3"])
  assert out.returncode == 2 and out.stderr.strip() == (
      "error: --config.rl.num_promts: rl has no field 'num_promts'; did you mean "
      "--config.rl.num_prompts?")

"""The algorithm contract: the registry, and a new algorithm as one class the loop runs as is."""

import os

import jax.numpy as jnp
import pytest

from tests.support import REPO
from rlscale.config import files as config_files
from rlscale.run import train
from rlscale.config.errors import ConfigError
from rlscale.resolve.resolved import validate
from rlscale.rl import algorithm
from rlscale.rl.update import policy_forward



def test_every_algorithm_file_registers_itself():
  algorithm.register_all()
  assert {"grpo", "ppo", "ppo_ewma"} <= set(algorithm.ALGORITHMS)
  for cls in algorithm.ALGORITHMS.values():
    for name in ("check", "prepare", "update", "extra_forwards"):
      assert callable(getattr(cls, name)), (cls, name)


class Reinforce:
  """Vanilla policy gradient with a batch-mean baseline: what a user would add in one file."""

  @staticmethod
  def check(cfg):
    return [] if cfg.rl.group_size >= 1 else ["rl.group_size must be >= 1"]

  def __init__(self, ctx):
    def loss(inp):
      return -inp.extras["advantages"][:, None] * inp.logp, {"logp": inp.logp}
    self.actor = algorithm.trained_model(ctx, "actor", policy_forward(ctx.graphdef), loss,
                                         ctx.params, ctx.cfg.optim)
    self.models = {"actor": self.actor}

  def prepare(self, batch, sample_logp, scores):
    batch.extras["advantages"] = scores - jnp.mean(scores)
    return {}, {"reward/baseline": jnp.mean(scores)}

  def update(self, batch, key, step, by_group):
    return {}, {"actor": self.actor.step(batch, key, by_group)}

  def extra_forwards(self):
    return 0


@pytest.fixture
def reinforce():
  algorithm.register_all()
  algorithm.ALGORITHMS.register("reinforce_test")(Reinforce)
  yield
  del algorithm.ALGORITHMS["reinforce_test"]


def test_an_algorithms_own_checks_are_config_errors(reinforce):
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  cfg.kind, cfg.rl.group_size = "reinforce_test", 0
  with pytest.raises(ConfigError, match="rl.group_size must be >= 1"):
    validate(cfg)


@pytest.mark.slow
def test_a_new_algorithm_runs_in_the_loop_unchanged(tiny_sft_base, reinforce, tmp_path):
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  cfg.kind = "reinforce_test"
  cfg.init.cache_dir = tiny_sft_base
  cfg.init.sft_config = os.path.join(REPO, "configs", "sft.py:tiny")
  cfg.train.num_steps, cfg.train.tensorboard = 2, False
  summary = train.main(cfg, str(tmp_path / "run"))
  assert summary["kind"] == "reinforce_test" and summary["step"] == 2
  assert summary["compilations"] == {"actor": 1, "sampler": 1}
  import json
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  assert "actor/logp" in rows[1] and "reward/baseline" in rows[1]
  assert rows[1]["reward/baseline"] == pytest.approx(rows[1]["reward/mean"], abs=1e-6)

"""The batch plan: every size of a step from the config, one definition of B, auto choices."""

import os

import pytest

from tests.support import REPO
from rlscale.plan import batch
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.resolve import resolved
from rlscale.resolve.resolved import validate



def _cfg(spec="grpo.py"):
  return config_files.load(os.path.join(REPO, "configs", spec))


def test_sizes_of_the_main_job():
  p = batch.plan(_cfg(), shards=1, seq_len=13)
  assert (p.num_prompts, p.group_size, p.responses) == (64, 8, 512)
  assert p.batch == 512 and p.batch_prompts == 64  # B: responses per optimizer step
  assert p.num_steps == 200 and p.total_responses == 102400
  a = p.models["actor"]
  assert a.microbatch_auto and a.microbatch == batch.MAX_MICRO_ROWS_PER_DEVICE
  assert a.num_micro == 512 // batch.MAX_MICRO_ROWS_PER_DEVICE and a.optimizer_steps == 1
  assert p.generation_batch == 512  # the whole step in one decode call


def test_b_is_per_optimizer_step_for_every_model():
  cfg = _cfg("ppo.py")
  cfg.rl.num_minibatches, cfg.critic.num_minibatches, cfg.rl.num_epochs = 4, 2, 3
  p = batch.plan(cfg, shards=8)
  assert p.batch == 512 // 4 and p.batch_prompts == 32  # 128 responses of G=4
  assert p.models["critic"].minibatch == 256
  assert p.models["actor"].optimizer_steps == 12
  assert p.describe()["actor"]["optimizer_steps_per_step"] == 12


@pytest.mark.parametrize("prompts", [16, 64, 256, 1024])
def test_a_p_sweep_needs_no_per_point_flags(prompts):
  """A sweep of P = 16 .. 1024 at G = 8, sqrt rule, 131072 responses."""
  cfg = _cfg(f"grpo.py:p={prompts},g=8")
  cfg.optim.lr_scaling, cfg.train.total_responses = "sqrt", 131072
  p = resolved.resolve(cfg, None).plan  # on the 8 simulated devices of the tests
  a = p.models["actor"]
  assert a.num_micro >= 2 and a.microbatch % 8 == 0 and a.minibatch % a.microbatch == 0
  assert a.microbatch <= 8 * batch.MAX_MICRO_ROWS_PER_DEVICE
  assert p.generation_batch % 8 == 0 and (prompts * 8) % p.generation_batch == 0
  assert p.num_steps == 131072 // (prompts * 8)
  # And on one device, as the main job runs on a CPU:
  one = batch.plan(cfg, shards=1, seq_len=13)
  assert one.models["actor"].microbatch == min(64, prompts * 4)


def test_auto_microbatch_rules():
  # Leaves two passes for the noise scale, splits over the shards, fits the token bound.
  assert batch.auto_microbatch(16, shards=8, seq_len=10, need_two=True) == 8
  assert batch.auto_microbatch(16, shards=8, seq_len=10, need_two=False) == 16
  assert batch.auto_microbatch(8, shards=8, seq_len=10, need_two=True) is None
  rows = batch.MAX_MICRO_TOKENS_PER_DEVICE // 2048  # long sequences: the token bound binds
  assert batch.auto_microbatch(1024, shards=1, seq_len=2048, need_two=True) == rows
  assert batch.auto_microbatch(96, shards=1, seq_len=10, need_two=True) == 48  # a divisor


def test_auto_generation_batch_divides_the_step():
  assert batch.auto_generation_batch(512, unit=1, kv_bytes_per_row=0) == 512
  assert batch.auto_generation_batch(8192, unit=8, kv_bytes_per_row=0) == 8192
  assert batch.auto_generation_batch(8192, unit=1, kv_bytes_per_row=0) == 1024
  # A KV cache of 1 GiB per row allows 4 rows per device.
  assert batch.auto_generation_batch(96, unit=2, kv_bytes_per_row=1 << 30) == 8


def test_explicit_values_still_work_and_are_checked():
  cfg = _cfg()
  cfg.rl.microbatch, cfg.rollout.generation_batch = 128, 256
  p = batch.plan(cfg, shards=8)
  assert not p.models["actor"].microbatch_auto and p.models["actor"].microbatch == 128
  assert p.generation_batch == 256
  cfg.rl.microbatch = 512
  with pytest.raises(ConfigError, match="rl.microbatch=512 leaves one pass"):
    batch.plan(cfg, shards=8)
  cfg.rl.microbatch = "many"
  with pytest.raises(ConfigError, match="rl.microbatch='many' must be a positive integer or 'auto'"):
    batch.plan(cfg, shards=8)


def test_a_plan_from_a_runs_config_json():
  """Analysis reads B from config.json with the same code."""
  import json
  d = json.loads(_cfg("ppo.py").to_json_best_effort())
  assert batch.plan(d).batch == 256


def test_auto_without_a_divisor_is_a_config_error():
  cfg = _cfg("grpo.py:tiny")
  cfg.rl.num_prompts, cfg.rl.group_size, cfg.rl.microbatch = 2, 2, "auto"
  with pytest.raises(ConfigError, match=r"rl.microbatch='auto': no divisor .*\(4 rows\) .* 8 batch"):
    validate(cfg)


def test_variant_arguments():
  cfg = _cfg("grpo.py:p=16,g=4,lr=3e-4,rl.num_epochs=2")
  assert (cfg.rl.num_prompts, cfg.rl.group_size, cfg.optim.lr, cfg.rl.num_epochs) == (16, 4, 3e-4, 2)
  cfg = _cfg("grpo.py:tiny,p=8")
  assert cfg.rl.num_prompts == 8 and cfg.model.d_model == 64
  cfg = _cfg("ppo.py:ewma")
  assert cfg.kind == "ppo_ewma" and cfg.rl.prox_com > 0
  with pytest.raises(ValueError, match="'huge': not a variant"):
    _cfg("grpo.py:huge")
  with pytest.raises(ValueError, match="no field rl.num_promts"):
    _cfg("grpo.py:rl.num_promts=3")


def test_algorithm_errors_come_from_the_algorithm():
  cfg = _cfg("ppo.py")
  cfg.rl.prox_com = 2.0  # a proximal policy needs kind=ppo_ewma
  with pytest.raises(ConfigError, match="rl.prox_com=2.0 turns on the proximal policy"):
    validate(cfg)
  cfg.kind, cfg.rl.prox_com = "ppo_ewma", 0.0
  with pytest.raises(ConfigError, match="ppo_ewma needs"):
    validate(cfg)
  cfg.kind = "a2c"
  with pytest.raises(ConfigError, match="kind='a2c'; known: sft, grpo, ppo, ppo_ewma"):
    validate(cfg)


def test_divisors_are_every_divisor_ascending():
  for n in range(1, 2001):
    assert batch.divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
  n = 2 ** 10 * 3 ** 5 * 5 ** 4 * 7 ** 3  # ~5.3e10: 3960 divisors, in sqrt(n) ~ 2.3e5 steps
  got = batch.divisors(n)
  assert len(got) == 11 * 6 * 5 * 4 and got == sorted(set(got))
  assert all(n % d == 0 for d in got) and got[0] == 1 and got[-1] == n


def test_shared_prompt_takes_micro_batches_of_whole_groups_per_shard():
  """train.shared_prompt='auto' (the default): the plan prefers a micro-batch of whole groups
  on every batch shard and says so; when none fits it trains rows on their own; True then
  refuses in one line naming the sizes."""
  p = batch.plan(_cfg(), shards=1, seq_len=13)  # the main job: 64 rows = 8 groups of 8
  assert p.models["actor"].shared_prompt == 8 and "each prompt once" in p.summary_line()
  assert p.describe()["actor"]["shared_prompt"] is True
  cfg = _cfg("ppo.py")  # two mini-batches per epoch: 'auto' keeps the per-row shuffle
  assert all(m.shared_prompt == 1 for m in batch.plan(cfg, shards=8, seq_len=13).models.values())
  cfg.rl.num_minibatches = cfg.critic.num_minibatches = 1  # G = 4 over 8 shards: 32-row passes
  p = batch.plan(cfg, shards=8, seq_len=13)
  for m in p.models.values():
    assert m.shared_prompt == 4 and m.microbatch % 32 == 0 and m.num_micro >= 2
  cfg.rl.num_minibatches, cfg.train.shared_prompt = 2, True  # asked for: mini-batches of groups
  assert batch.plan(cfg, shards=8, seq_len=13).models["actor"].shared_prompt == 4
  cfg.rl.group_size = 1
  with pytest.raises(ConfigError, match=r"train.shared_prompt=True needs groups of 2 or more "
                     r"responses \(rl.group_size=1\)"):
    batch.plan(cfg, shards=8, seq_len=13)
  cfg = _cfg("grpo.py:tiny")  # P = 4 x G = 4 over 8 shards: no micro-batch of whole groups
  p = batch.plan(cfg, shards=8, seq_len=13)
  assert p.models["actor"].shared_prompt == 1 and p.models["actor"].microbatch == 8
  cfg.train.shared_prompt = True
  with pytest.raises(ConfigError, match=r"train.shared_prompt=True needs micro-batches of whole "
                     r"groups on every batch shard: rl.microbatch=8 is not a multiple of "
                     r"rl.group_size x batch shards \(4 x 8\)"):
    batch.plan(cfg, shards=8, seq_len=13)
  off = _cfg("grpo.py:train.shared_prompt=False")  # the config-argument form gives a bool
  assert off.train.shared_prompt is False
  assert batch.plan(off, shards=1, seq_len=13).models["actor"].shared_prompt == 1
  old = _cfg().to_dict()  # a run's config.json from before the field: rows on their own, as it ran
  del old["train"]["shared_prompt"]
  from rlscale.config import migrate  # as analysis/runs.py reads a run directory
  assert batch.plan(migrate.migrate(old), shards=1, seq_len=13).models["actor"].shared_prompt == 1

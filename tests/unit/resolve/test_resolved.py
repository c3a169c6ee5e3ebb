"""The one resolve step: a config becomes a frozen Resolved with its defaults, setup and plan."""

import dataclasses
import inspect

import ml_collections
import pytest

from rlscale.config import migrate
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.resolve import resolved
from rlscale.trainer.loop import Trainer
from rlscale.trainer.rl_trainer import RLTrainer
from rlscale.trainer.sft_trainer import SFTTrainer


def test_a_config_resolves_once_into_a_frozen_run():
  run = resolved.resolve(config_files.load("configs/grpo.py:tiny"), None)
  assert run.plan.responses == run.cfg.rl.num_prompts * run.cfg.rl.group_size
  assert dict(run.setup.mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}  # the -1 resolved
  with pytest.raises(AttributeError):
    run.cfg.rl.num_prompts = 3  # the config is frozen
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.plan = None
  assert run.base is None and run.with_base("/some/folder").base == "/some/folder"


def test_a_bad_config_fails_in_the_resolve_step_naming_the_field():
  cfg = config_files.load("configs/grpo.py:tiny")
  cfg.rl.num_minibatches = 3
  with pytest.raises(ConfigError, match="rl.num_minibatches=3"):
    resolved.resolve(cfg, None)


def test_fields_an_old_config_lacks_get_the_value_its_run_used():
  cfg = config_files.load("configs/ppo.py:tiny")
  with cfg.unlocked():
    del cfg.rollout["max_staleness"], cfg.critic.optim["state_dtype"], cfg.train["logprob_chunk"]
  with pytest.raises(ConfigError, match="it lacks rollout.max_staleness, train.logprob_chunk, "
                     "critic.optim.state_dtype; read config files with"):
    resolved.resolve(cfg, None)  # resolve migrates nothing: a config is migrated where read
  filled = migrate.migrate(cfg)
  assert filled.rollout.max_staleness == 0 and filled.critic.optim.state_dtype == ""
  assert filled.train.logprob_chunk == 0  # what runs before the field did: the whole vocabulary
  assert "max_staleness" not in cfg.rollout  # a copy: the caller's config is left as it was
  assert migrate.migrate(filled) is filled  # nothing missing: the same object
  assert migrate.missing(filled) == [] and len(migrate.missing(cfg)) == 3
  sft = ml_collections.ConfigDict({"train": {"num_steps": 1}})
  assert "rl" not in migrate.migrate(sft)  # absent sections stay absent


def test_a_run_directory_records_its_schema_version_and_older_ones_migrate():
  """config.json says which version it was written in; one without (version 1) gets what runs
  before each field ran with; a newer version than this code's, or a bad one, is refused."""
  old = {"rollout": {"overlap": True}, "train": {"num_steps": 3}}
  new = migrate.migrate(old)
  assert new["rollout"] == {"max_staleness": 1, "dynamic_sampling": False,
                            "filter_min_std": 0.0, "max_rounds": 4, "oversample": "auto"}
  assert new["train"]["shared_prompt"] is False and "schema_version" not in new
  assert old["rollout"] == {"overlap": True}  # a copy
  stamped = migrate.stamped(new)
  assert list(stamped)[0] == "schema_version" and stamped["schema_version"] == migrate.SCHEMA_VERSION
  assert migrate.migrate(stamped) == new  # this version's: nothing to do but read the version
  current = {"schema_version": migrate.SCHEMA_VERSION, "rollout": {"max_staleness": 2}}
  assert migrate.migrate(current) == {"rollout": {"max_staleness": 2}}  # no step applies
  for bad, why in ((migrate.SCHEMA_VERSION + 1, "written by a newer rlscale"),
                   ("2", "not a config schema version"), (0, "not a config schema version")):
    with pytest.raises(ConfigError, match=why):
      migrate.migrate({"schema_version": bad})


def test_both_trainers_implement_the_trainer_protocol():
  methods = {n: inspect.signature(getattr(Trainer, n)) for n in dir(Trainer)
             if not n.startswith("_") and inspect.isfunction(getattr(Trainer, n))}
  assert {"begin", "complete", "evaluate", "finish", "load", "state"} <= set(methods)
  for cls in (RLTrainer, SFTTrainer):
    assert isinstance(cls.sample_key, str)
    for name, sig in methods.items():
      impl = getattr(cls, name, None)
      assert inspect.isfunction(impl), f"{cls.__name__} lacks {name}"
      assert len(inspect.signature(impl).parameters) == len(sig.parameters), (cls, name)
    # Trainers take the resolved run, never a bare config.
    assert list(inspect.signature(cls.__init__).parameters) == ["self", "run"]


def test_a_misspelt_or_mistyped_field_is_refused_at_resolve_with_the_name_it_meant():
  """A config file that sets a field no section has (a typo) or a value of the wrong type is
  refused by the resolve step, naming the closest field, not read later as absent; the
  resolved run carries the typed config."""
  cfg = config_files.load("configs/grpo.py:tiny")
  run = resolved.resolve(cfg, None)
  assert run.cfg.rollout.max_staleness == 0 and run.cfg.rl.group_size == cfg.rl.group_size
  with cfg.unlocked():  # as a config.json or a hand-built dict can hold them
    cfg.rollout.max_stalness = 1
    del cfg.noise["prompt_level"]
    cfg.noise.prompt_level = "yes"
  with pytest.raises(ConfigError) as e:
    resolved.resolve(cfg, None)
  assert "rollout.max_stalness: no such field (did you mean rollout.max_staleness?)" in str(e.value)
  lines = str(e.value).splitlines()[1:]  # the field's own check names it, the schema no twice
  assert [line.strip() for line in lines if "prompt_level" in line] == [
      "noise.prompt_level='yes' must be True or False"]

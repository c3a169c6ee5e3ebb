"""train.peer_timeout_s: jax.distributed's heartbeat timeout, set from the config, checked before
JAX starts with it, and a field no old run notices (the same run directory and base policy
names, a resume without asking)."""

import json
import os

import pytest

from tests.support import REPO
from rlscale.config import files as config_files
from rlscale.config.errors import ConfigError
from rlscale.parallel import distributed
from rlscale.resolve import experiment
from rlscale.run import main


def test_the_timeout_is_jax_distributeds_heartbeat_timeout(monkeypatch):
  seen = {}
  monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda **kw: seen.update(kw))
  monkeypatch.setattr(distributed, "_started", False)
  for var, value in (("JAX_COORDINATOR_ADDRESS", "localhost:1"), ("JAX_NUM_PROCESSES", "2"),
                     ("JAX_PROCESS_ID", "1")):
    monkeypatch.setenv(var, value)
  monkeypatch.setattr(distributed.jax.config, "update", lambda *a: None)
  monkeypatch.setattr(distributed.logging, "info", lambda *a: None)
  distributed.initialize(30)
  assert seen["heartbeat_timeout_seconds"] == 30 and seen["process_id"] == 1


@pytest.mark.parametrize("value", [0, -5])  # a float or a string: ConfigDict refuses it
def test_a_bad_timeout_is_one_line_before_jax_starts(value):
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  cfg.train.peer_timeout_s = value
  with pytest.raises(ConfigError, match=r"^train.peer_timeout_s=.* must be a positive integer "
                                        r"\(whole seconds"):
    main._peer_timeout(cfg)


def test_a_config_without_the_field_gets_jaxs_default():
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  del cfg.train["peer_timeout_s"]
  assert main._peer_timeout(cfg) == distributed.PEER_TIMEOUT_S == 100


def test_the_field_changes_no_name_and_no_resume(tmp_path):
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  before = cfg.copy_and_resolve_references()
  del before.train["peer_timeout_s"]
  assert experiment.config_hash(cfg) == experiment.config_hash(before)
  cfg.train.peer_timeout_s = 30
  assert experiment.config_hash(cfg) == experiment.config_hash(before)
  # A run written before the field existed resumes with any value, without asking.
  (tmp_path / "checkpoints" / "2").mkdir(parents=True)
  (tmp_path / "config.json").write_text(json.dumps(before.to_dict(), default=list))
  experiment.check_resume(str(tmp_path), cfg)

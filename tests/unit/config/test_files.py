"""config_files.load: `path[:arg]`, shipped configs from any directory, clear missing-file errors."""

import os

import pytest

from tests.support import REPO
from rlscale.config import files as config_files
from rlscale.run import main

CONFIGS = os.path.join(REPO, "configs")


def test_arg_selects_the_variant():
  full = config_files.load(os.path.join(CONFIGS, "grpo.py"))
  tiny = config_files.load(os.path.join(CONFIGS, "grpo.py:tiny"))
  assert tiny.train.num_steps < full.train.num_steps
  assert tiny.init.sft_config == "configs/sft.py:tiny"
  with pytest.raises(ValueError, match="'huge'"):
    config_files.load(os.path.join(CONFIGS, "grpo.py:huge"))


@pytest.mark.parametrize("spec", ["configs/sft.py:tiny", "sft.py:tiny", "rlscale.configs.sft:tiny"])
def test_shipped_configs_from_another_directory(spec, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  path, arg = config_files.find(spec)
  assert os.path.samefile(path, os.path.join(CONFIGS, "sft.py")) and arg == "tiny"
  cfg = config_files.load(spec)
  assert cfg.kind == "sft"
  assert cfg.to_dict() == config_files.load(os.path.join(CONFIGS, "sft.py:tiny")).to_dict()


def test_a_file_here_wins_over_the_shipped_one(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "sft.py").write_text(
      "import ml_collections\n"
      "def get_config(arg=None):\n"
      "  return ml_collections.ConfigDict({'kind': 'mine', 'arg': arg})\n")
  cfg = config_files.load("configs/sft.py:x")
  assert (cfg.kind, cfg.arg) == ("mine", "x")
  assert config_files.load("configs/sft.py").arg is None  # no ':' -> get_config(None)


def test_relative_to_the_naming_config(tmp_path, monkeypatch):
  """init.sft_config = 'configs/sft.py' in a config outside the checkout is looked up beside it."""
  monkeypatch.chdir(tmp_path)
  exp = tmp_path / "exp"
  (exp / "configs").mkdir(parents=True)
  (exp / "configs" / "base.py").write_text(
      "import ml_collections\n"
      "def get_config(arg=None):\n"
      "  return ml_collections.ConfigDict({'who': 'beside'})\n")
  got = config_files.load("configs/base.py", relative_to=str(exp / "configs" / "grpo.py:tiny"))
  assert got.who == "beside"


def test_missing_file_names_the_path_and_where_it_looked(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError) as e:
    config_files.load("configs/nope.py:tiny", relative_to="/somewhere/configs/grpo.py")
  msg = str(e.value)
  assert "'configs/nope.py' not found" in msg
  assert "'/somewhere/configs/nope.py'" in msg  # beside the naming config
  assert repr(os.path.join(config_files.packaged_dirs()[0], "nope.py")) in msg  # shipped
  assert repr(str(tmp_path)) in msg  # the current directory


def test_other_folders_are_not_redirected_to_the_shipped_configs(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(FileNotFoundError) as e:
    config_files.load("experiments/grpo.py")  # a typo in a path must not load configs/grpo.py
  assert "looked in 'experiments/grpo.py' (current" in str(e.value)


def test_command_line_keeps_a_local_path_and_locates_a_shipped_one(tmp_path, monkeypatch):
  argv = ["rlscale", "--config=configs/grpo.py:tiny", "--config.seed=3", "--workdir=w"]
  monkeypatch.chdir(REPO)
  assert main.locate_config(argv) == argv  # train.main gets config_file as typed
  monkeypatch.chdir(tmp_path)
  located = main.locate_config(argv)
  assert located[1] == "--config=" + os.path.join(config_files.packaged_dirs()[0], "grpo.py:tiny")
  assert located[2:] == argv[2:]
  assert main.locate_config(["x", "--config", "rlscale.configs.sft"])[2].endswith(
      os.path.join("", "sft.py"))


def test_resuming_with_another_config_is_refused_naming_the_fields(tmp_path):
  import json
  from rlscale.resolve import experiment
  from rlscale.config.errors import ConfigError
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  experiment.prepare_workdir(str(tmp_path), cfg)
  changed = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny,lr=1e12"))
  changed.train.log_every = 1  # free to change
  experiment.check_resume(str(tmp_path), changed)  # no checkpoint yet: nothing to resume
  os.makedirs(tmp_path / "checkpoints" / "2")
  with pytest.raises(ConfigError, match=r"optim.lr: 0.0001 -> 1000000000000.0\. .*"
                     r"--allow_config_change=optim.lr$"):
    experiment.check_resume(str(tmp_path), changed)
  experiment.check_resume(str(tmp_path), changed, allow=("optim.lr",))
  experiment.check_resume(str(tmp_path), cfg)  # the same config resumes
  experiment.prepare_workdir(str(tmp_path), changed)
  with open(tmp_path / "config_history.jsonl") as f:
    history = [json.loads(line)["config"]["optim"]["lr"] for line in f]
  assert history == [1e-4, 1e12]


def test_a_run_from_before_an_added_field_resumes_with_its_old_behaviour(tmp_path):
  """config.json of a run made before mesh.roles existed: the default (what the run did)
  resumes without asking; another value is a change named as such."""
  import json
  from rlscale.resolve import experiment
  from rlscale.config.errors import ConfigError
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  experiment.prepare_workdir(str(tmp_path), cfg)
  with open(tmp_path / "config.json") as f:
    old = json.load(f)
  assert old.pop("schema_version") == 2  # a run from before versions were recorded: 1
  for section, field in (("mesh", "roles"), ("mesh", "sampler_devices"),
                         ("mesh", "sampler_shape"), ("rollout", "max_staleness"),
                         ("train", "shared_prompt")):
    del old[section][field]
  with open(tmp_path / "config.json", "w") as f:
    json.dump(old, f)
  old["rollout"]["decode_chunk"] = 64  # the fixed default of before
  with open(tmp_path / "config.json", "w") as f:
    json.dump(old, f)
  os.makedirs(tmp_path / "checkpoints" / "2")
  # train.shared_prompt (filled False) and rollout.decode_chunk (64) against 'auto': the same
  # numbers computed another way, free to change on resume.
  experiment.check_resume(str(tmp_path), cfg)
  cfg.rollout.max_staleness = 1
  with pytest.raises(ConfigError, match=r"rollout.max_staleness: 0 -> 1"):
    experiment.check_resume(str(tmp_path), cfg)


def test_how_a_branch_starts_its_optimizer_is_asked_only_of_branches(tmp_path):
  """A run from before init.branch_optimizer reads "parent"; today's default is "fresh". A run
  that is no branch resumes without asking (the field changes none of its numbers); a branch
  is refused, naming the field."""
  import json
  from rlscale.resolve import experiment
  from rlscale.config.errors import ConfigError
  cfg = config_files.load(os.path.join(REPO, "configs", "grpo.py:tiny"))
  assert cfg.init.branch_optimizer == "fresh"
  for branch_from in ("", "runs/parent"):
    cfg.init.branch_from = branch_from
    experiment.prepare_workdir(str(tmp_path), cfg)
    with open(tmp_path / "config.json") as f:
      old = json.load(f)
    del old["init"]["branch_optimizer"], old["schema_version"]  # version 1's
    with open(tmp_path / "config.json", "w") as f:
      json.dump(old, f)
    os.makedirs(tmp_path / "checkpoints" / "2", exist_ok=True)
    if not branch_from:
      experiment.check_resume(str(tmp_path), cfg)
    else:
      with pytest.raises(ConfigError, match=r"init.branch_optimizer: 'parent' -> 'fresh'"):
        experiment.check_resume(str(tmp_path), cfg)

"""config/schema.py: every shipped config and committed run config converts and comes back
unchanged; problems are named at once; the schema's defaults are the builders'."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess

import ml_collections
import pytest

from tests.support import REPO
from rlscale.config import files, reference, schema, sections, typed
from rlscale.config.errors import ConfigError

from rlscale.config.migrate import EXPANDED, migrate as fill

SHIPPED = ["grpo.py", "grpo.py:tiny", "ppo.py", "ppo.py:tiny", "ppo.py:ewma", "sft.py",
           "sft.py:tiny", "sft.py:chain_sum", "grpo_chain_sum.py", "grpo_chain_sum.py:tiny",
           "ppo_chain_sum.py", "ppo_chain_sum.py:tiny", "grpo_math.py", "grpo_math.py:tiny"]


def _load(spec: str) -> dict:
  return files.load(os.path.join(REPO, "configs", spec)).to_dict()


def _strict(v):
  """Lists as tuples, every leaf with its type: 1 and 1.0 (or True) differ."""
  if isinstance(v, dict):
    return {k: _strict(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return tuple(_strict(x) for x in v)
  return (type(v).__name__, v)


def _round_trip(d: dict) -> schema.Config:
  """from_dict(d); its to_dict is d restricted to the typed fields, and only task fields of
  another task type are left out."""
  cfg = typed.from_dict(d)
  out = schema.to_dict(cfg)
  restricted = {s: ({k: d[s][k] for k in v} if isinstance(v, dict) else d[s])
                for s, v in out.items()}
  assert _strict(out) == _strict(restricted)
  assert set(out) == set(d)
  other_tasks = {n for c in schema.TASKS.values() for n in schema._names(c)}
  for s in d:
    if isinstance(d[s], dict):
      left_out = set(d[s]) - set(out[s])
      assert not left_out or (s == "task" and left_out <= other_tasks), (s, left_out)
  return cfg


@pytest.mark.parametrize("spec", SHIPPED)
def test_shipped_configs_convert_and_come_back(spec):
  d = _load(spec)
  cfg = _round_trip(d)
  assert cfg.kind == d["kind"] and type(cfg.task) is schema.TASKS[d["task"]["name"]]
  assert (cfg.rl is None) == (d["kind"] == "sft") and ("critic" in cfg) == ("critic" in d)


def _run_configs() -> list[str]:
  out = subprocess.run(["git", "ls-files", "*config.json"], cwd=REPO, capture_output=True,
                       text=True, check=True).stdout.split()
  return [p for p in out if "kind" in json.load(open(os.path.join(REPO, p)))]


def test_committed_run_configs_convert():
  paths = _run_configs()
  assert paths, "no committed config.json of a run"
  for path in paths:
    with open(os.path.join(REPO, path)) as fh:
      filled = fill(ml_collections.ConfigDict(json.load(fh))).to_dict()
    _round_trip(filled)


def _grpo() -> dict:
  return _load("grpo.py:tiny")


def _error(d: dict) -> list[str]:
  with pytest.raises(ConfigError) as e:
    typed.from_dict(d)
  lines = str(e.value).splitlines()
  assert lines[0] == "invalid config:"
  return [line.strip() for line in lines[1:]]


def test_a_misspelt_field_names_the_closest():
  d = _grpo()
  d["rollout"]["max_stalness"] = d["rollout"].pop("max_staleness")
  assert _error(d) == ["rollout.max_stalness: no such field (did you mean "
                       "rollout.max_staleness?)"]
  d = _grpo()
  d["task"]["qwerty"] = 1  # no task type has it
  assert _error(d) == ["task.qwerty: no such field"]


def test_wrong_types_name_the_field_and_the_type():
  for section, name, value, want in [
      ("rl", "group_size", "eight", "rl.group_size='eight': an int"),
      ("rl", "group_size", 8.0, "rl.group_size=8.0: an int"),
      ("rl", "num_prompts", True, "rl.num_prompts=True: an int"),
      ("optim", "lr", False, "optim.lr=False: a float"),
      ("optim", "lr_scaling", "cubic", "optim.lr_scaling='cubic': one of 'none', 'linear', "
                                       "'sqrt'"),
      ("train", "shared_prompt", 1, "train.shared_prompt=1: one of 'auto', True, False"),
      ("mesh", "shape", [1, "x"], "mesh.shape=[1, 'x']: a tuple[int, ...]")]:
    d = _grpo()
    d[section][name] = value
    assert _error(d) == [want]


def test_two_problems_are_two_lines_of_one_error():
  d = _grpo()
  d["rl"]["group_size"] = "eight"
  d["optim"]["b22"] = 0.99
  assert _error(d) == ["rl.group_size='eight': an int",
                       "optim.b22: no such field (did you mean optim.b2?)"]


def test_missing_kind_sections_and_unknown_task():
  d = _grpo()
  del d["kind"]
  assert _error(d) == ["kind: missing (a str)"]
  d = _grpo()
  del d["rl"]
  d["critic"] = _load("ppo.py")["critic"]
  assert _error(d) == ["critic: kind='grpo' has no critic section",
                       "rl: missing (kind='grpo' needs it)"]
  d = _grpo()
  d["task"]["name"] = "sudoku"
  assert _error(d) == ["task.name='sudoku': no such task (one of arithmetic, chain_sum, files, "
                       "tfds_math, reasoning_gym)"]
  d = _load("sft.py")
  d["kind"] = "grpo"
  assert "rl: missing (kind='grpo' needs it)" in _error(d)


def test_values_are_kept_as_given():
  d = _grpo()
  d["optim"]["lr"] = 1  # an int where a float goes: kept (config hashes read it)
  d["mesh"]["rules"] = [["vocab", ["fsdp", "tensor"]], ["seq", None]]
  d["train"]["shared_prompt"] = False
  cfg = typed.from_dict(d)
  assert type(cfg.optim.lr) is int and cfg.optim.lr == 1
  assert cfg.mesh.rules == (("vocab", ("fsdp", "tensor")), ("seq", None))
  assert cfg.train.shared_prompt is False and cfg.mesh.shape == (-1, 1, 1)
  assert schema.to_dict(cfg)["mesh"]["shape"] == (-1, 1, 1)
  del d["rollout"]["top_p"]  # absent: the schema's default
  assert typed.from_dict(d).rollout.top_p == 1.0


def test_each_task_name_has_its_own_type():
  base = _grpo()
  for name, cls in schema.TASKS.items():
    d = _grpo()
    d["task"] = {**base["task"], "name": name}
    cfg = typed.from_dict(d)
    assert type(cfg.task) is cls and cfg.task.name == name
    assert set(schema.to_dict(cfg)["task"]) == set(schema._names(cls))
  chain = typed.from_dict(_load("grpo_chain_sum.py"))
  assert "ops" not in chain.task and not hasattr(chain.task, "ops")
  assert chain.task.terms == 4 and "grader" not in chain.task
  files_task = typed.from_dict(_load("grpo_math.py")).task
  assert files_task.train_files.endswith("train.jsonl") and "digits" not in files_task


def test_every_field_has_a_type_and_a_one_line_doc():
  rows = reference.describe()
  names = [r[0] for r in rows]
  assert len(names) == len(set(names))
  for name, kind, _, doc in rows:
    assert kind.strip() and "\n" not in kind, name
    assert doc.strip() and "\n" not in doc, name
  assert {"rollout.max_staleness", "critic.optim.lr", "task[chain_sum].terms",
          "rl[grpo].advantage", "rl[ppo|ppo_ewma].gamma", "sft.microbatch"} <= set(names)
  assert dict((r[0], r[2]) for r in rows)["critic.optim.reference_batch"] == 256


def test_the_migration_sets_fields_of_the_schema_and_these_differ_from_today():
  """Every field the migration sets for old configs is a schema field; where what old runs ran
  with differs from today's default, it is one of these (each a behaviour that changed)."""
  today: dict[str, list] = {}
  for name, _, default, _ in reference.describe():
    today.setdefault(re.sub(r"\[[^]]*\]", "", name), []).append(default)
  assert set(EXPANDED) <= set(today), set(EXPANDED) - set(today)
  differ = {k for k, v in EXPANDED.items()
            if all(_strict(v) != _strict(d) for d in today[k])}
  assert differ == {"train.logprob_chunk", "train.shared_prompt", "train.pack_responses",
                    "optim.grad_clip", "critic.optim.grad_clip", "critic.optim.reference_batch",
                    "task.grader", "eval.sampled", "init.branch_optimizer"}


@pytest.mark.parametrize("key, cls, built", [
    ("model", schema.Model, sections.model()),
    ("mesh", schema.Mesh, sections.mesh()),
    ("task", schema.ArithmeticTask, sections.task("arithmetic")),
    ("task", schema.ChainSumTask, sections.chain_sum_task()),
    ("task", schema.FilesTask, sections.task("files")),
    ("task", schema.TfdsMathTask, sections.task("tfds_math")),
    ("task", schema.ReasoningGymTask, sections.task("reasoning_gym")),
    ("rollout", schema.Rollout, sections.rollout(6)),
    ("rl", schema.GrpoRl, sections.rl(64, 8, advantage="grpo")),
    ("rl", schema.PpoRl, sections.rl(64, 8, gamma=1.0, lam=0.95, whiten_advantages=True,
                                     dual_clip=0.0, prox_com=0.0)),
    ("optim", schema.Optim, sections.optim(1e-4)),
    ("critic", schema.Critic, sections.critic(3e-4, 256)),
    ("init", schema.Init, sections.init()),
    ("train", schema.Train, sections.run(200)),
    ("eval", schema.Eval, sections.evaluation()),
    ("target", schema.Target, sections.target("eval/accuracy_greedy", 0.6)),
    ("noise", schema.Noise, sections.noise_scale())])
def test_defaults_are_the_builders(key, cls, built):
  """sections.py builds each section from the schema's defaults (its arguments at the schema's
  choice): the ConfigDict holds every field at its default value and type, None and 'auto'
  fields as references a --config.x=y override can set; a task type holds its own fields
  only (the shared task section holds the fields of every task but chain_sum)."""
  built = fill(ml_collections.ConfigDict({key: built}))[key].to_dict()
  mine = schema.to_dict(cls())
  if key == "task":
    built = {k: v for k, v in built.items() if k in mine}
  assert _strict(mine) == _strict(built)


def test_literals_are_the_codes_sets():
  from typing import get_args
  from rlscale import tasks
  from rlscale.models import memory
  from rlscale.parallel import roles
  from rlscale.rl import off_policy, optim
  from rlscale.tasks import graders
  hints = {c: schema._hints(c) for c in (schema.Model, schema.Mesh, schema.Task, schema.TextTask,
                                         schema.Rl, schema.Optim, schema.Init, schema.Train)}
  # Model.dtype, Optim.lr_batch, Init.branch_optimizer and Train.compile_buckets list their
  # values nowhere else: the schema is their one owner.
  want = [(schema.Mesh, "roles", roles.ROLES), (schema.Task, "name", tasks.NAMES),
          (schema.TextTask, "grader", graders.NAMES),
          (schema.Rl, "off_policy_correction", off_policy.CORRECTIONS),
          (schema.Rl, "old_logprobs", ("sampler", "recompute")),
          (schema.Optim, "lr_scaling", optim.RULES),
          (schema.Optim, "schedule", optim.SCHEDULES),
          (schema.Optim, "state_dtype", optim.STATE_DTYPES),
          (schema.Train, "remat", tuple(memory.REMAT_POLICIES))]
  for cls, name, values in want:
    assert set(get_args(hints[cls][name])) == set(values), name
  assert set(schema.RL_TYPES) | {"sft"} == set(schema.KINDS)


def test_a_registered_algorithms_kind_reads_with_the_shared_rl_section():
  """rlscale/rl/algorithm.py's registry is open: a kind the schema does not list reads as an RL
  config whose rl section is the shared Rl (the built-in algorithms' own fields accepted), and
  a misspelt field is still named."""
  d = _grpo()
  d["kind"] = "reinforce_test"
  cfg = typed.from_dict(d)
  assert type(cfg.rl) is schema.Rl and cfg.rl.group_size == d["rl"]["group_size"]
  d["rl"]["grup_size"] = 4
  assert "rl.grup_size: no such field (did you mean rl.group_size?)" in _error(d)
  assert _error({**_grpo(), "kind": 3}) == ["kind=3: sft or an RL algorithm's name (a str)"]


def test_sections_are_frozen_and_read_like_dicts():
  cfg = typed.from_dict(_grpo())
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.rl.group_size = 3
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.rl = None
  assert cfg.rl.get("group_size") == cfg.rl["group_size"] == cfg.rl.group_size == 4
  assert "group_size" in cfg.rl and "gamma" not in cfg.rl and cfg.rl.get("gamma", 1.0) == 1.0
  assert cfg.model.get("rope_theta", 5) is None and "rope_theta" in cfg.model
  with pytest.raises(KeyError):
    cfg.rl["gamma"]
  assert cfg.optim.keys() == tuple(f.name for f in dataclasses.fields(schema.Optim))
  assert "critic" not in cfg and cfg.get("critic", {}) == {} and "rl" in cfg
  assert "critic" in typed.from_dict(_load("ppo.py:tiny"))
  with pytest.raises(ConfigError, match="kind='sft' has no rl section"):
    schema.Config(kind="sft", sft=schema.Sft(), rl=schema.GrpoRl())
  with pytest.raises(ConfigError, match="takes a PpoRl"):
    schema.Config(**{**{n: getattr(cfg, n) for n in cfg.keys()}, "kind": "ppo",
                     "critic": schema.Critic()})


def test_the_config_reference_page_is_the_schemas():
  """docs/config.md is generated from the schema: regenerate it with
  `python -m rlscale.config.reference > docs/config.md` when a field changes."""
  with open(os.path.join(REPO, "docs", "config.md")) as f:
    assert f.read() == reference.markdown()
  assert "| `rollout.max_staleness` | int | `0` |" in reference.markdown()


def test_built_none_and_auto_fields_take_a_value_of_their_type():
  """A None default is a placeholder of the field's type (an override of another type is
  refused as ml_collections refuses it); an 'auto' size takes an integer and 'auto' again."""
  t = sections.task("files")
  t.enable_thinking = True
  with pytest.raises(TypeError):
    t.enable_thinking = "yes"
  o = sections.optim(1e-4)
  o.reference_batch = 256
  with pytest.raises(TypeError):
    o.reference_batch = "big"
  r = sections.rollout(6)
  r.generation_batch = 16
  r.generation_batch = "auto"
  run = sections.run(10)
  run.shared_prompt = False
  run.compile_buckets = "ahead"
  with pytest.raises(TypeError):
    run.compile_buckets = 3


def test_a_typed_config_gives_its_plain_dict_as_a_configdict_does():
  """`to_dict()` on the typed config and on a section (an algorithm without per_run compares
  the lanes' configs with it: rlscale/rl/algorithm.trained_model)."""
  cfg = typed.from_dict(_grpo())
  assert cfg.to_dict() == schema.to_dict(cfg)
  assert cfg.rl.to_dict() == schema.to_dict(cfg)["rl"]

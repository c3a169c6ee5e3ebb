"""One versioned migration: a config of any schema version read as this code's.

A run directory's config.json records the schema version it was written in (`schema_version`,
beside the config's sections); a config that does not say (a config file's get_config, a run
directory from before versions were recorded) is version 1. `migrate` takes a config of any
version to SCHEMA_VERSION, one step per version, so that a number an old run computed is read
with the values it ran with. It is applied once where a config enters: a config file
(config/files.py), a run directory's config.json (analysis/runs.py, the resume check,
configs/branch.py). The library below the resolve step reads every field directly.

Versions:
  1: no version recorded. A field added since the run was written is absent (it ran with the
     value in OLD_RUN_VALUES, which may differ from today's default: a run before shared-prompt
     training had train.shared_prompt False, today's default is "auto"); rollout.overlap where
     today there is rollout.max_staleness.
  2: config.json records schema_version; every field is present.
A field added from now on is a new version whose step sets the value runs before it ran with.
"""

from __future__ import annotations

import copy
from typing import Any

import ml_collections

from rlscale.config.errors import ConfigError

SCHEMA_VERSION = 2
KEY = "schema_version"  # beside the sections of a run's config.json

# Sections of an optimizer: the fields below under "optim." apply to each of them.
_OPTIMIZERS = ("optim", "critic.optim")

# Version 1 -> 2: what a config written before each field existed ran with.
OLD_RUN_VALUES = {
    "mesh.roles": "colocated", "mesh.sampler_devices": 0, "mesh.sampler_shape": (-1, 1, 1),
    "rollout.max_staleness": 0, "rollout.dynamic_sampling": False, "rollout.filter_min_std": 0.0,
    "rollout.max_rounds": 4, "rollout.oversample": "auto", "optim.lr_batch": "nominal",
    "train.remat": "none", "train.logprob_chunk": 0, "train.total_responses": 0,
    "train.eval_every_responses": 0, "train.shared_prompt": False,
    "train.pack_responses": False,
    "optim.lr_scaling": "none", "optim.adam_scaling": False, "optim.schedule": "constant",
    "optim.warmup_responses": 0, "optim.final_lr_frac": 0.0, "optim.b1": 0.9, "optim.b2": 0.999,
    "optim.eps": 1e-8, "optim.weight_decay": 0.0, "optim.grad_clip": 0.0, "optim.state_dtype": "",
    "optim.reference_batch": None,
    "rl.kl_coef": 0.0, "rl.prox_com": 0.0, "rl.dual_clip": 0.0, "rl.ptx_coef": 0.0,
    "rl.ptx_rows": 8, "rl.off_policy_correction": "none", "rl.is_cap": 2.0,
    "rl.mis_threshold": 2.0,
    "task.train_files": "", "task.eval_files": "", "task.eval_fraction": 0.0,
    "task.prompt_field": "question", "task.answer_field": "answer", "task.system_prompt": "",
    "task.instruction": "Put the final answer in \\boxed{}.", "task.enable_thinking": None,
    "task.grader": "numeric", "task.grader_regex": "", "task.grader_timeout_s": 2.0,
    "task.demo_files": "", "task.demo_field": "response",
    "eval.greedy": True, "eval.sampled": False, "eval.reference": False,
    "eval.adaptive": False, "eval.adaptive_z": 2.0, "target.stop_margin": 0.0,
    "init.branch_from": "", "init.branch_step": 0, "init.branch_optimizer": "parent",
    "train.keep_period": 0, "train.peer_timeout_s": 100, "train.compile_buckets": "auto",
}

# Version 1 -> 2: fields renamed, {old dotted name: (new dotted name, the new value from the
# old)}. rollout.overlap=True generated one step ahead: max_staleness 1.
RENAMED = {"rollout.overlap": ("rollout.max_staleness", lambda v: 1 if v is True else 0)}


def _expanded() -> dict:
  out = {}
  for key, value in OLD_RUN_VALUES.items():
    if key.startswith("optim."):
      for section in _OPTIMIZERS:
        out[section + key[len("optim"):]] = value
    else:
      out[key] = value
  return out


EXPANDED = _expanded()  # "critic.optim.b1" as well as "optim.b1"


def version_of(config) -> int:
  """The schema version a config (a dict or ConfigDict) says it was written in; 1 if it says
  none. A version this code does not know is a ConfigError."""
  version = config.get(KEY, 1) if hasattr(config, "get") else 1
  if not isinstance(version, int) or isinstance(version, bool) or version < 1:
    raise ConfigError(f"{KEY}={version!r}: not a config schema version (1, 2, ...)")
  if version > SCHEMA_VERSION:
    raise ConfigError(f"{KEY}={version}: written by a newer rlscale; this one reads versions "
                      f"1-{SCHEMA_VERSION}")
  return version


def migrate(config):
  """`config` (a nested dict, as config.json holds, or a ConfigDict) as this code's version,
  without `schema_version`. A ConfigDict comes back as the same object when nothing changes
  (its fields keep their types: an 'auto'-or-integer field stays one), else as a copy; a dict
  always as a copy."""
  version = version_of(config)
  if isinstance(config, ml_collections.ConfigDict):
    node, edit = config, _ConfigDictEdit
  else:
    node, edit = copy.deepcopy(dict(config)), _DictEdit
  e = edit(node)
  e.pop_top(KEY)
  for step in STEPS[version - 1:]:
    step(e)
  return e.result()


def stamped(config: dict) -> dict:
  """A config's dict as a run directory records it: schema_version first, then its sections."""
  return {KEY: SCHEMA_VERSION, **{k: v for k, v in config.items() if k != KEY}}


def flat(config: dict, prefix: str = "") -> dict:
  """A nested config dict as {"a.b": v}."""
  out = {}
  for k, v in config.items():
    if isinstance(v, dict):
      out.update(flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


# --- the steps, each on an editor of a dict or a ConfigDict -----------------------------------

def _v1_to_v2(e) -> None:
  """Fields renamed, and every field added before versions were recorded at the value the
  runs without it ran with (absent sections stay absent)."""
  for old, (new, convert) in RENAMED.items():
    section, _, field = old.rpartition(".")
    if e.has(section, field):
      value = e.pop(section, field)
      if not e.has(section, new.rpartition(".")[2]):
        e.set(section, new.rpartition(".")[2], convert(value))
  for key, value in EXPANDED.items():
    section, _, field = key.rpartition(".")
    if e.section(section) is not None and not e.has(section, field):
      e.set(section, field, value)


STEPS = [_v1_to_v2]  # STEPS[v - 1] takes version v to v + 1
assert len(STEPS) == SCHEMA_VERSION - 1


class _DictEdit:
  """Edits of a nested dict (already a copy)."""

  def __init__(self, d: dict):
    self.d = d

  def section(self, dotted: str):
    node: Any = self.d
    for part in dotted.split("."):
      node = node.get(part) if isinstance(node, dict) else None
      if node is None:
        return None
    return node if isinstance(node, dict) else None

  def has(self, dotted: str, field: str) -> bool:
    node = self.section(dotted)
    return node is not None and field in node

  def pop(self, dotted: str, field: str):
    return self.section(dotted).pop(field)

  def set(self, dotted: str, field: str, value) -> None:
    self.section(dotted)[field] = list(value) if isinstance(value, tuple) else value

  def pop_top(self, key: str) -> None:
    self.d.pop(key, None)

  def result(self) -> dict:
    return self.d


class _ConfigDictEdit:
  """Edits of a ConfigDict, copied at the first edit so that the caller's is left as it was."""

  def __init__(self, cfg: ml_collections.ConfigDict):
    self.cfg, self.copied = cfg, False

  def _own(self) -> None:
    if not self.copied:
      self.cfg, self.copied = copy.deepcopy(self.cfg), True

  def section(self, dotted: str):
    node = self.cfg
    for part in dotted.split("."):
      try:
        node = node[part] if part in node else None
      except TypeError:  # a value where a section was expected: the checks name it
        return None
      if node is None:
        return None
    return node if isinstance(node, ml_collections.ConfigDict) else None

  def has(self, dotted: str, field: str) -> bool:
    node = self.section(dotted)
    return node is not None and field in node

  def pop(self, dotted: str, field: str):
    self._own()
    node = self.section(dotted)
    with node.unlocked():
      value = node[field]
      del node[field]
    return value

  def set(self, dotted: str, field: str, value) -> None:
    self._own()
    node = self.section(dotted)
    with node.unlocked():
      setattr(node, field, value)

  def pop_top(self, key: str) -> None:
    if key in self.cfg:
      self._own()
      with self.cfg.unlocked():
        del self.cfg[key]

  def result(self) -> ml_collections.ConfigDict:
    return self.cfg


def missing(cfg) -> list[str]:
  """The dotted fields a config of this version must hold and `cfg` (a ConfigDict) lacks, and
  the old names it still holds: what `migrate` would have set; [] for a migrated config."""
  e = _ConfigDictEdit(cfg)
  out = [old for old in RENAMED if e.has(*old.rpartition(".")[::2])]
  out += [key for key in EXPANDED
          if e.section(key.rpartition(".")[0]) is not None and not e.has(*key.rpartition(".")[::2])]
  return out

"""The value of every field a config may lack: one table, filled in once when a config is read.

A config written before a field existed (a run's config.json, a user's own file) lacks it; the
value here is what such a run did, so filling it in changes no number. `fill` is applied by
config/files.py when a config is loaded and by resolve/ before a run, and `check_resume` fills
an old config.json with the same table: library code reads every field directly.
"""

from __future__ import annotations

import copy

import ml_collections

# Sections of an optimizer: the fields below under "optim." apply to each of them.
_OPTIMIZERS = ("optim", "critic.optim")

DEFAULTS = {
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
    "init.branch_from": "", "init.branch_step": 0, "init.branch_optimizer": "parent", "train.keep_period": 0,
    "train.peer_timeout_s": 100, "train.compile_buckets": "auto",
}


# Fields renamed since: {old dotted name: (new dotted name, the new value from the old)}. A
# config that still has the old field (a run's config.json, a user's older file) is read as
# the new one. rollout.overlap=True generated one step ahead: max_staleness 1.
RENAMED = {"rollout.overlap": ("rollout.max_staleness", lambda v: 1 if v is True else 0)}


def _expanded() -> dict:
  out = {}
  for key, value in DEFAULTS.items():
    if key.startswith("optim."):
      for section in _OPTIMIZERS:
        out[section + key[len("optim"):]] = value
    else:
      out[key] = value
  return out


EXPANDED = _expanded()  # "critic.optim.b1" as well as "optim.b1"


def _section(cfg, section: str):
  """The node of a dotted `section` of `cfg`, None where it is absent."""
  node = cfg
  for part in section.split("."):
    node = node[part] if _has(node, part) else None
    if node is None:
      return None
  return node


def missing(cfg) -> dict:
  """{dotted field: default} of the fields `cfg`'s sections lack (absent sections stay absent)."""
  out = {}
  for key, value in EXPANDED.items():
    section, _, field = key.rpartition(".")
    node = _section(cfg, section)
    if node is not None and not _has(node, field):
      out[key] = value
  return out


def _has(node, name: str) -> bool:
  try:
    return name in node
  except TypeError:  # a value where a section was expected: the check names it
    return False


def _renamed(cfg) -> list[tuple[str, str, object]]:
  """(section, old field, value) of the RENAMED fields `cfg` holds."""
  out = []
  for old in RENAMED:
    section, _, field = old.rpartition(".")
    node = _section(cfg, section)
    if node is not None and _has(node, field):
      out.append((section, field, node[field]))
  return out


def fill(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`cfg` with its RENAMED fields under their new names and every field its sections lack set
  to its default (a copy when any is)."""
  renamed = _renamed(cfg)
  if renamed:
    cfg = copy.deepcopy(cfg)
    with cfg.unlocked():
      for section, field, value in renamed:
        node = _section(cfg, section)
        new, convert = RENAMED[f"{section}.{field}"]
        with node.unlocked():
          del node[field]
          if new.rpartition(".")[2] not in node:
            setattr(node, new.rpartition(".")[2], convert(value))
  todo = missing(cfg)
  if not todo:
    return cfg
  cfg = copy.deepcopy(cfg)
  with cfg.unlocked():
    for key, value in todo.items():
      section, _, field = key.rpartition(".")
      node = cfg
      for part in section.split("."):
        node = node[part]
      with node.unlocked():
        setattr(node, field, value)
  return cfg


def flat(config: dict, prefix: str = "") -> dict:
  """A nested config dict as {"a.b": v}, the form fill_dict and the resume check read."""
  out = {}
  for k, v in config.items():
    if isinstance(v, dict):
      out.update(flat(v, f"{prefix}{k}."))
    else:
      out[prefix + k] = v
  return out


def fill_dict(flat: dict) -> dict:
  """A flattened config.json ({"a.b": v}) with the defaults of its sections' missing fields."""
  sections = {k.rpartition(".")[0] for k in flat}
  out = dict(flat)
  for old, (new, convert) in RENAMED.items():
    if old in out:
      value = out.pop(old)
      out.setdefault(new, convert(value))
  for key, value in EXPANDED.items():
    if key.rpartition(".")[0] in sections and key not in out:
      out[key] = list(value) if isinstance(value, tuple) else value
  return out


def fill_json(config: dict) -> dict:
  """A run's config.json (nested dicts) with the defaults of its sections' missing fields."""
  return fill(ml_collections.ConfigDict(config)).to_dict()


def fill_optim(section: dict) -> ml_collections.ConfigDict:
  """An optimizer section (`{"lr": ...}` alone, say) with the fields it lacks at their defaults."""
  return fill(ml_collections.ConfigDict({"optim": section})).optim

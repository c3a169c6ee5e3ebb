"""Every config field the library reads by name is a field of the schema: a misspelt read
(`cfg.rl.grup_size`) fails here, in the tests, not when a run reaches it.

The reads are found in the source: `cfg.section.field` and `cfg.section` where `cfg` is a
run's config (`cfg`, `self.cfg`, `run.cfg`, `ctx.cfg`, ...) in the packages below the resolve
step and the resolve step itself. (Under rlscale/models, rlscale/sampling, rlscale/checkpoints
and in benchmarks/ `cfg` is often a model's ModelConfig, checked by its own dataclass.) Not
followed: a config or section held in another name (a lane's `c` in an algorithm's per_run,
`r = cfg.rl; r.kl_coef`), and a field of one task type read on another (the task section's
fields are checked together).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import typing

import pytest

from tests.support import REPO
from rlscale.config import schema

PACKAGES = ("trainer", "rl", "run", "resolve", "plan", "metrics", "study", "sweep", "tasks")
OWNERS = ("self", "run", "ctx", "first", "r", "recipe", "trainer", "shared")
# What a section (or an ml_collections config in the resolve step) answers besides its fields.
METHODS = {"get", "keys", "items", "values", "to_dict", "unlocked", "as_configdict",
           "to_json_best_effort", "update"}


def _variants(name: str) -> list[type]:
  if name == "task":
    return list(schema.TASKS.values())
  if name == "rl":
    return [schema.Rl, *schema.RL_TYPES.values()]
  hint = schema._hints(schema.Config)[name]
  return [a for a in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(a)]


def _fields() -> dict[str, set[str]]:
  out = {n: set().union(*(schema._names(c) for c in _variants(n)))
         for n in schema._names(schema.Config) if n not in ("kind", "seed")}
  return out


def _is_config(node) -> bool:
  if isinstance(node, ast.Name):
    return node.id == "cfg"
  return (isinstance(node, ast.Attribute) and node.attr == "cfg"
          and isinstance(node.value, ast.Name) and node.value.id in OWNERS)


def _reads_in(text: str, where: str):
  """(file:line, section, field or None) of every read of a config by attribute in `text`."""
  for node in ast.walk(ast.parse(text)):
    if not isinstance(node, ast.Attribute):
      continue
    if _is_config(node.value):
      yield f"{where}:{node.lineno}", node.attr, None
    elif isinstance(node.value, ast.Attribute) and _is_config(node.value.value):
      yield f"{where}:{node.lineno}", node.value.attr, node.attr


def _reads():
  for folder_name in [os.path.join("rlscale", p) for p in PACKAGES]:
    for folder, _, files in os.walk(os.path.join(REPO, folder_name)):
      for name in sorted(n for n in files if n.endswith(".py")):
        path = os.path.join(folder, name)
        with open(path) as f:
          yield from _reads_in(f.read(), os.path.relpath(path, REPO))


def _unknown(reads) -> list[str]:
  """The reads that name no section of the config, or no field of their section."""
  fields, top = _fields(), set(schema._names(schema.Config)) | METHODS
  return [f"{where}: cfg.{section}" + (f".{field}" if field else "")
          for where, section, field in reads
          if section not in top
          or (field is not None and section in fields and field not in fields[section]
              and field not in METHODS)]


def test_every_config_field_read_by_name_is_in_the_schema():
  reads = list(_reads())
  assert len(reads) > 100, "the scan found too few reads: is it still looking?"
  unknown = _unknown(reads)
  assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize("source, caught", [
    ("cfg.rl.grup_size", True), ("cfg.rl.group_size", False), ("self.cfg.rollot.top_k", True),
    ("run.cfg.task.terms", False), ("ctx.cfg.optim.lr_scalng", True), ("cfg.rl.get('x')", False)])
def test_the_scan_catches_a_misspelt_read(source, caught):
  """The scan itself: a misspelt section or field is reported, a real one is not."""
  reads = list(_reads_in(source, "f.py"))
  assert reads
  assert bool(_unknown(reads)) == caught

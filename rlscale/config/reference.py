"""docs/config.md: every field of every section of the schema (rlscale/config/schema.py),
with its type, default and one-line doc.

    python -m rlscale.config.reference > docs/config.md
"""

from __future__ import annotations

import dataclasses
import typing

from rlscale.config.schema import MISSING, RL_TYPES, TASKS, Config, Task, _hints
from rlscale.config.typed import _join, _text


def describe() -> list[tuple[str, str, object, str]]:
  """(dotted name, type, default, doc) of every field, for the generated documentation.

  A field of some types of a section only is named with them: task[files|tfds_math|
  reasoning_gym].grader, rl[ppo|ppo_ewma].gamma; kind's default is dataclasses.MISSING (a
  config must say it)."""
  rows: list[tuple[str, str, object, str]] = []
  _describe(Config, None, "", rows)
  return rows


def _describe(cls, instance, path: str, rows: list) -> None:
  hints = _hints(cls)
  for field in dataclasses.fields(cls):
    name, hint = _join(path, field.name), hints[field.name]
    kinds = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
    if dataclasses.is_dataclass(hint) or kinds:
      variants = kinds or [hint]
      if len(variants) == 1:
        default = getattr(instance, field.name) if instance is not None else None
        _describe(variants[0], default if default is not None else _fresh(field, variants[0]),
                  name, rows)
      else:
        _variants(variants, name, rows)
      continue
    default = getattr(instance, field.name) if instance is not None else field.default
    rows.append((name, _text(hint), default, field.metadata["doc"]))


def _fresh(field, cls):
  return field.default_factory() if field.default_factory is not MISSING else cls()


def _variants(classes, path: str, rows: list) -> None:
  """The fields of a section with one type per variant (task, rl), each named once with the
  variants that share its type, default and doc."""
  table = TASKS if issubclass(classes[0], Task) else RL_TYPES
  labels = {c: "|".join(n for n, t in table.items() if t is c) for c in classes}
  per: dict[str, dict[tuple, list[str]]] = {}
  for cls in classes:
    sub: list = []
    _describe(cls, cls(), "", sub)
    for name, kind, default, doc in sub:
      per.setdefault(name, {}).setdefault((kind, repr(default), doc, default), []).append(
          labels[cls])
  for name, groups in per.items():
    for (kind, _, doc, default), which in groups.items():
      label = "" if len(which) == len(classes) else f"[{'|'.join(which)}]"
      rows.append((f"{path}{label}.{name}", kind, default, doc))


def _cell(value) -> str:
  if value is MISSING:
    return "(required)"
  return "`" + repr(value).replace("|", "\\|") + "`"


def markdown() -> str:
  """docs/config.md: every field of every section, with its type, default and doc."""
  lines = ["# Config fields", "",
           "Every field a run's config holds, by section: its type, its default and what it "
           "does. A config file's `get_config` sets them (`configs/*.py`), `--config.a.b=value` "
           "overrides one on the command line, and a run directory's `config.json` records "
           "them with its `schema_version`; a field set that no section has is refused at "
           "resolve, naming the field meant. `task[chain_sum].terms` is a field of the "
           "chain_sum task only, `rl[ppo|ppo_ewma].gamma` of those algorithms'. Generated from "
           "`rlscale/config/schema.py`: `python -m rlscale.config.reference > docs/config.md`.",
           ""]
  section = None
  for name, kind, default, doc in describe():
    head = name.split(".")[0].split("[")[0] if "." in name else "run"
    if head != section:
      section = head
      lines += ["", f"## {section}", "", "| field | type | default | what it does |",
                "| --- | --- | --- | --- |"]
    bar = "\\|"  # a | inside a table cell
    lines.append(f"| `{name.replace('|', bar)}` | {kind.replace('|', bar)} | {_cell(default)} | "
                 f"{doc} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(markdown(), end="")

"""Sweeps declared beside the config: lists of override dicts built from axes.

An axis is a dict `{key: values}`: one key is one varying field; several keys in one dict vary
together (a zip, all lists of one length). A key is a config argument alias (`p`, `g`, `seed`,
`lr`, ...: config_common.ALIASES) or a dotted field (`optim.lr_scaling`).

    product({"p": [8, 16, 32]}, {"optim.lr_scaling": ["sqrt", "none"]}, {"seed": [0, 1, 2]})
    product({"p": [128, 64, 32], "g": [4, 8, 16]}, {"seed": [0]})      # equal P x G
    product(fixed(g=8), {"p": [8, 16]})                                 # g=8 in every point

`product` also takes lists of points (what `product`, `zip_axes` and `chain` return), so sweeps
compose.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

Point = dict[str, Any]


def zip_axes(*axes: dict[str, list]) -> list[Point]:
  """Points whose keys all vary together: the i-th value of every key in the i-th point."""
  merged: dict[str, list] = {}
  for axis in axes:
    merged.update(axis)
  lengths = {k: len(list(v)) for k, v in merged.items()}
  if len(set(lengths.values())) > 1:
    raise ValueError(f"zipped keys have values of different lengths: {lengths}")
  n = next(iter(lengths.values()), 0)
  return [{k: list(v)[i] for k, v in merged.items()} for i in range(n)]


def _points(axis) -> list[Point]:
  if isinstance(axis, dict):
    for key, values in axis.items():
      if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"axis {key!r}: give a list of values, not {values!r}")
    return zip_axes(axis)
  points = list(axis)
  if not all(isinstance(p, dict) for p in points):
    raise ValueError(f"an axis is a dict {{key: values}} or a list of points (dicts), not {axis!r}")
  return points


def product(*axes) -> list[Point]:
  """Every combination of one point of each axis, the first axis varying slowest."""
  out = []
  for combo in itertools.product(*(_points(a) for a in axes)):
    point: Point = {}
    for part in combo:
      clash = set(point) & set(part)
      if clash:
        raise ValueError(f"keys {sorted(clash)} are set by two axes of one product")
      point.update(part)
    out.append(point)
  return out


def chain(*sweeps: list[Point]) -> list[Point]:
  """The points of several sweeps, one after the other."""
  return [dict(p) for s in sweeps for p in s]


def fixed(**values) -> list[Point]:
  """One point: fields every point of a product shares (keys are aliases; dotted keys go in
  a dict axis instead)."""
  return [dict(values)]
